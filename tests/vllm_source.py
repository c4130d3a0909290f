"""A pinned vLLM source release (PyPI sdist) unpacked in verl-gke's cache: only its `vllm/**.py`,
which is all the pairing tests read. Fetched and checked as staging fetches the verl wheels
(workloads/stage_data.py: the same sha256 check and marker), so a cached copy is reused only when
complete. About 37 MB per release, once per machine.
"""

from __future__ import annotations

import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from domain.cache import cache_root
from domain.platforms import VllmSource
from domain.staged import MARKER_NAME, fetch_verified, make_marker, read_marker, write_marker
from workloads.stage_data import decide, size_in


def unpacked(source: VllmSource) -> Path:
    """The directory holding `vllm/` of `source` (its Python files only)."""
    dest = cache_root() / "vllm" / source.dir_name
    identity = {"kind": "sdist", "url": source.sdist_url, "sha256": source.sha256}
    if decide(read_marker(dest / MARKER_NAME), identity, size_in(dest)).skip:
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    (dest / MARKER_NAME).unlink(missing_ok=True)
    files: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="sdist-") as tmp:
        sdist = Path(tmp) / source.sdist_url.rsplit("/", 1)[-1]
        fetch_verified(source.sdist_url, source.sha256, sdist)
        with tarfile.open(sdist) as archive:
            for member in archive.getmembers():
                parts = PurePosixPath(member.name).parts
                # <name>-<version>/vllm/.../x.py; nothing else, nothing outside
                if not (member.isfile() and len(parts) > 2 and parts[1] == "vllm"
                        and member.name.endswith(".py") and ".." not in parts):
                    continue
                relative = PurePosixPath(*parts[1:])
                target = dest.joinpath(*relative.parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                extracted = archive.extractfile(member)
                assert extracted is not None
                target.write_bytes(extracted.read())
                files[relative.as_posix()] = member.size
    write_marker(dest / MARKER_NAME, make_marker(identity, files))
    return dest
