"""The readiness gate against real Ray processes: a head of the test's own and a second node that
joins with `ray start --address` (its GPUs are logical Ray resources: no device is needed)."""

from __future__ import annotations

import re
import shlex
import sys
import threading
import time
import uuid

import pytest
from ray.job_submission import JobSubmissionClient
from ray.util.state import list_nodes

from components.grpo_job import GrpoJobProvider
from tests.ray_head import RayHead, start_node, stop_node
from access.cluster_readiness import Capacity, ClusterNotReadyError, await_capacity, read_capacity

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]


def test_short_of_names_what_is_missing():
    assert Capacity(1, 8, 0).short_of(2, 16) == "1 of 2 GPU workers, 8 of 16 GPUs"
    assert Capacity(2, 16, 1).short_of(2, 16) == ""


def test_create_submits_only_once_every_worker_joined_and_capacity_counts_alive_gpu_workers_only(
        ray_cluster: RayHead):
    before = read_capacity(ray_cluster.dashboard_url)
    assert (before.workers, before.gpus) == (0, 0.0)  # the head's own resources are not a worker's
    stack = f"t{uuid.uuid4().hex[:8]}"
    props = {"dashboard_url": ray_cluster.dashboard_url, "stack": stack, "runtime_env": {},
             "entrypoint": f"{shlex.quote(sys.executable)} -c 'print(1)'", "startup_grace_s": 0,
             "expected_workers": 1, "expected_gpus": 2, "ready_timeout_s": 120}
    joined: list[float] = []

    def join_later() -> None:
        time.sleep(3)
        nodes.append(start_node(ray_cluster, gpus=2))
        joined.append(time.monotonic())

    nodes: list = []
    thread = threading.Thread(target=join_later)
    thread.start()
    try:
        result = GrpoJobProvider().create(props)
        thread.join()
        job = JobSubmissionClient(ray_cluster.dashboard_url).get_job_info(result.id)
        # Submitted after the worker joined, not when the head first answered.
        assert job.start_time / 1000 > time.time() - (time.monotonic() - joined[0]) - 1
        nodes.append(start_node(ray_cluster, gpus=0))  # beside the GPU worker that joined: a CPU-only one
        assert read_capacity(ray_cluster.dashboard_url) == Capacity(workers=1, gpus=2.0, dead=before.dead)
        # Every node of a multi-node test names the loopback address (tests/ray_loopback.py), not the machine's.
        assert {n.node_ip for n in list_nodes(address=ray_cluster.dashboard_url, timeout=10)} == {"127.0.0.1"}
    finally:
        thread.join()
        for node in nodes:
            stop_node(node, ray_cluster)


def test_create_gives_up_at_ready_timeout_and_submits_nothing(ray_cluster: RayHead):
    stack = f"t{uuid.uuid4().hex[:8]}"
    props = {"dashboard_url": ray_cluster.dashboard_url, "stack": stack, "runtime_env": {},
             "entrypoint": "true", "expected_workers": 2, "expected_gpus": 16, "ready_timeout_s": 4}
    with pytest.raises(ClusterNotReadyError) as caught:
        GrpoJobProvider().create(props)
    assert str(caught.value).startswith("GrpoJob verl-grpo-")
    assert (f"not submitted within ready_timeout_s=4 s: the Ray cluster at {ray_cluster.dashboard_url} has "
            "0 of 2 GPU workers, 0 of 16 GPUs; a worker may still be pulling its image") in str(caught.value)
    jobs = JobSubmissionClient(ray_cluster.dashboard_url).list_jobs()
    assert not [j for j in jobs if (j.submission_id or "").startswith(f"verl-grpo-{stack}-")]


def test_a_head_that_lists_nothing_is_named_at_the_deadline():
    with pytest.raises(ClusterNotReadyError) as caught:
        await_capacity("http://127.0.0.1:9", workers=1, gpus=8, deadline=time.monotonic() + 1,
                       address="svc/x", what="fabric check")
    assert str(caught.value).startswith("fabric check: the Ray cluster at svc/x has no node listing (last node "
                                        "listing failed: ")


def test_the_wait_says_what_it_waits_for_and_what_is_missing_once_a_minute(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    from access import cluster_readiness

    monkeypatch.setattr(cluster_readiness, "PROGRESS_EVERY_S", 1.0)  # once a minute, scaled down
    monkeypatch.setattr(cluster_readiness, "POLL_S", 0.1)
    with pytest.raises(ClusterNotReadyError):
        await_capacity("http://127.0.0.1:9", workers=1, gpus=2, deadline=time.monotonic() + 2.5,
                       address="svc/x", what="GrpoJob j")
    lines = capsys.readouterr().err.splitlines()
    assert 3 <= len(lines) <= 4, lines  # at once, then each second
    for line in lines:
        assert re.fullmatch(r"GrpoJob j: waiting for 1 GPU worker with 2 GPUs to join the Ray cluster at svc/x: "
                            r"no node listing \(last node listing failed: .+\) after 0m0\ds \(0m0\ds left\)",
                            line), line
