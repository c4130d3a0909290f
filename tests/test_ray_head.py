"""The Ray test harness itself: node starts on one machine never pick ports at the same time, and no
Ray process of the tests listens anywhere but on the loopback interface."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
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


def _stand_in_head(tmp_path: Path, started: list[ray_head.RayHead]) -> ray_head.RayHead:
    """start_head's result without Ray: a leader process in a session of its own (as `ray start --block`)."""
    process = subprocess.Popen(["sleep", "120"], start_new_session=True)
    temp_dir = tmp_path / f"ray{len(started)}"
    temp_dir.mkdir()
    head = ray_head.RayHead(process=process, dashboard_url=f"http://127.0.0.1:{9000 + len(started)}", temp_dir=temp_dir)
    started.append(head)
    return head


def test_the_runs_workers_share_one_head_started_once_and_stopped_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest-xdist workers ask for the head at once: the first starts it, the others get its URL from the
    run's folder; the controller's pytest_sessionfinish stops it, and only it."""
    started: list[ray_head.RayHead] = []
    monkeypatch.setattr(ray_head, "start_head", lambda env: _stand_in_head(tmp_path, started))
    urls: list[str] = []
    workers = [threading.Thread(target=lambda: urls.append(ray_head.shared_head(tmp_path, under_xdist=False)))
               for _ in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=30)
    assert len(started) == 1 and urls == [started[0].dashboard_url] * 3
    assert started[0].process.poll() is None
    ray_head.stop_shared_head(tmp_path)
    assert started[0].process.poll() is not None and not started[0].temp_dir.exists()
    assert not (tmp_path / ray_head.SHARED_HEAD).exists()
    ray_head.stop_shared_head(tmp_path)  # a second stop finds nothing to do


def test_the_watchdog_stops_the_shared_head_once_the_run_that_owns_it_is_gone(tmp_path: Path) -> None:
    """A controller killed before its pytest_sessionfinish leaves no head running."""
    owner = subprocess.Popen(["sleep", "120"])
    head = _stand_in_head(tmp_path, [])
    watchdog = threading.Thread(target=ray_head.watch, args=(owner.pid, head.process.pid, str(head.temp_dir)))
    watchdog.start()
    time.sleep(2 * ray_head.WATCH_PERIOD_S)
    assert head.process.poll() is None  # its run still there
    owner.kill()
    owner.wait()
    watchdog.join(timeout=30)
    assert not watchdog.is_alive() and head.process.poll() is not None and not head.temp_dir.exists()


@pytest.mark.usefixtures("ray_head")
def test_each_workers_view_of_the_shared_head_lists_only_its_own_jobs(request: pytest.FixtureRequest) -> None:
    """What reads every job on the head (a create's gates, the supervisor's release) sees one worker's jobs,
    as it saw them on the head each worker had to itself; a job of another worker is still there by id,
    and a log tail (a websocket) goes through."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    head = json.loads((ray_head._run_folder(request.config) / ray_head.SHARED_HEAD).read_text())
    views = [ray_head.JobView(head["dashboard_url"]) for _ in range(2)]
    try:
        clients = [JobSubmissionClient(view.url) for view in views]
        ids = [client.submit_job(entrypoint=f"echo view-{n}") for n, client in enumerate(clients)]
        for n, client in enumerate(clients):
            assert [job.submission_id for job in client.list_jobs()] == [ids[n]]
            other = ids[1 - n]
            assert client.get_job_info(other).entrypoint == f"echo view-{1 - n}"

        async def tail() -> str:
            return "".join([lines async for lines in clients[0].tail_job_logs(ids[0])])

        assert "view-0" in asyncio.run(asyncio.wait_for(tail(), 60))
        assert clients[1].get_job_status(ids[0]) == JobStatus.SUCCEEDED
    finally:
        for view in views:
            view.close()
