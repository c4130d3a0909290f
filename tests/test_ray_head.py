"""The Ray test harness itself: node starts on one machine never pick ports at the same time, and no
Ray process of the tests listens anywhere but on the loopback interface."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import ray_head
from tests.ray_head import PORT_LOCK, listening_outside_loopback, ports_held

REPO = Path(__file__).resolve().parent.parent


def test_a_node_start_waits_for_another_processes_port_pick_and_names_the_lock() -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom tests.ray_head import ports_held\n"
                               "with ports_held():\n    print('held', flush=True)\n    time.sleep(30)"],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        started = time.monotonic()
        with pytest.raises(RuntimeError) as caught:
            with ports_held(timeout_s=1.0):
                pass
        assert time.monotonic() - started >= 1.0
        assert str(caught.value) == f"another Ray node start held {PORT_LOCK} for over 1 s"
    finally:
        holder.kill()
        holder.wait()
    with ports_held():  # free again once its holder is gone (another worker may hold it a while)
        pass


def test_the_loopback_check_names_a_process_listening_on_every_interface() -> None:
    """tests/ray_head.py runs this check on every head and node the tests start, when it starts and
    when it is stopped: a Ray process listening outside 127.0.0.1 fails the test that started it."""
    listener = subprocess.Popen(
        [sys.executable, "-c", "import socket, time\ns = socket.create_server(('0.0.0.0', 0))\n"
                               "print(s.getsockname()[1], flush=True)\ntime.sleep(60)"],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert listener.stdout is not None
        port = int(listener.stdout.readline())
        assert listening_outside_loopback(listener.pid) == [f"python (pid {listener.pid}) on 0.0.0.0:{port}"]
    finally:
        listener.kill()
        listener.wait()


def test_node_ports_are_below_the_ephemeral_range_handed_out_in_turn_and_skip_a_bound_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node binds its worker ports only when a worker starts: no outgoing connection (ephemeral range) and
    no later node start may be given one meanwhile."""
    monkeypatch.setattr(ray_head, "PORT_COUNTER", tmp_path / "next")
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    first = ray_head.node_ports(3)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first[-1] + 1))
        second = ray_head.node_ports(3)
    assert all(low - ray_head.NODE_PORT_SPAN <= p < low for p in first + second)
    assert not set(first) & set(second) and first[-1] + 1 not in second
    assert second[0] == first[-1] + 2
