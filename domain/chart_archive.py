"""A Helm chart's archive, fetched within a deadline and installed only as the bytes whose sha256 is
pinned: a repository can re-publish a version, so `helm install --version` installs whatever it serves
that day. The pin is the stack's (`verl-gke:chartDigests`) or, until one is set, the digest the stack's
first `pulumi up` kept in its state (components/helm_release.py). Archives are cached under their digest.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from domain.cache import cache_root

DEFAULT_TIMEOUT_S = 60.0
"""The whole download's deadline, not each read's."""
MAX_BYTES = 64 * 1024 * 1024
"""Far above a chart archive (KubeRay's and NVIDIA's are under 1 MiB): a larger answer is not a chart."""


class ChartArchiveError(Exception):
    """One line: the archive and what is wrong with it."""


def cached_path(url: str, digest: str, root: Path | None = None) -> Path:
    """Where an archive of `digest` (sha256:<hex>) is kept: `<cache>/charts/<hex>/<file name>`."""
    return (root or cache_root()) / "charts" / digest.removeprefix("sha256:") / url.rpartition("/")[2]


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _download(url: str, deadline: float) -> bytes:
    chunks: list[bytes] = []
    size = 0
    try:
        with urllib.request.urlopen(url, timeout=max(0.1, deadline - time.monotonic())) as response:
            while chunk := response.read(1 << 16):
                size += len(chunk)
                if size > MAX_BYTES:
                    raise ChartArchiveError(f"{url}: more than {MAX_BYTES:,} bytes: not a chart archive")
                if time.monotonic() > deadline:
                    raise ChartArchiveError(f"{url}: not downloaded within the deadline")
                chunks.append(chunk)
    except (urllib.error.URLError, OSError) as error:
        raise ChartArchiveError(f"{url}: could not be downloaded ({error})") from None
    return b"".join(chunks)


def fetch(url: str, *, root: Path | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[Path, str]:
    """The archive `url` serves now, downloaded within `timeout_s` and cached: (its path, its digest)."""
    data = _download(url, time.monotonic() + timeout_s)
    digest = digest_of(data)
    path = cached_path(url, digest, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:  # no half-written archive
        tmp.write(data)
    os.replace(tmp.name, path)
    return path, digest


def verified(url: str, pinned: str, *, what: str, fix: Callable[[str], str], root: Path | None = None,
             timeout_s: float = DEFAULT_TIMEOUT_S) -> Path:
    """The local archive of digest `pinned`: the cached copy if its bytes still hash to it (no network),
    else what `url` serves now if that is it. Otherwise ChartArchiveError in one line: `what` (the
    chart), both digests, and `fix(served digest)` (what to do)."""
    path = cached_path(url, pinned, root)
    if path.is_file() and digest_of(path.read_bytes()) == pinned:
        return path
    path, got = fetch(url, root=root, timeout_s=timeout_s)
    if got != pinned:
        raise ChartArchiveError(f"{what}: {url} serves {got}, not the pinned {pinned}: not the archive that "
                                f"was reviewed; nothing installed. {fix(got)}")
    return path
