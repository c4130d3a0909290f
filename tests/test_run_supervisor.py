"""The run supervisor against real Ray processes: a head of the module's own and a GPU node
joined with `ray start --address` (1 logical GPU). Attempt 0 is submitted by the GrpoJob provider,
as `pulumi up` does; both keep the run record through the Kubernetes API stand-in (tests/kube_api.py);
the RayCluster writes are recorded here (KubernetesControl itself is tested against the stand-in)."""

from __future__ import annotations

import re
import shlex
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray.job_submission import JobSubmissionClient

from components.grpo_job import GrpoJobProvider
from components.job_spec import JobSpec
from tests.kube_api import KubeApiStandIn, kube_api
from tests.ray_head import RayHead, start_node, stop_node
from workloads import run_lifecycle
from workloads.kube import KubernetesApi, RayClusterControl
from workloads.run_lifecycle import DEADLINE_ENV, Decider, RayJobs, meta
from workloads.run_record import Attempt, RecordStore, RunRecord
from workloads.run_supervisor import SupervisorConfig, decider

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

# A training stand-in: a task on the GPU node steps 0..STEPS, writing its step to a marker file
# (its checkpoint) and starting from the marker when there is one.
TRAIN = """
import pathlib, sys, time, ray
marker = pathlib.Path(sys.argv[1]); steps = int(sys.argv[2]); pause = float(sys.argv[3])
@ray.remote(num_gpus=1, max_retries=0)
def train():
    start = int(marker.read_text()) if marker.exists() else 0
    for step in range(start, steps):
        time.sleep(pause)
        marker.write_text(str(step + 1))
    return start
print("resumed from step", ray.get(train.remote()))
"""


class RecordingControl:
    """The RayCluster's suspend, noted here (RayClusterControl itself is tested against the API stand-in)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.suspended = False

    def set_suspended(self, suspended: bool) -> bool:
        self.calls.append(("set_suspended", suspended))
        self.suspended = suspended
        return True

    def state(self) -> str:
        return "suspended" if self.suspended else "running"


@pytest.fixture
def api() -> Iterator[tuple[str, KubeApiStandIn]]:
    with kube_api() as found:
        yield found


def entrypoint(marker: Path, steps: int, pause: float) -> str:
    return " ".join(shlex.quote(a) for a in [sys.executable, "-c", TRAIN, str(marker), str(steps), str(pause)])


def start_run(head: RayHead, api_url: str, entry: str, **extra: Any) -> tuple[JobSpec, str]:
    props = {"dashboard_url": head.dashboard_url, "kube_api_url": api_url, "namespace": "ray",
             "stack": f"t{uuid.uuid4().hex[:8]}", "runtime_env": {}, "entrypoint": entry, "startup_grace_s": 0,
             "expected_workers": 1, "expected_gpus": 1, "supervised_attempts": 3, "ready_timeout_s": 120, **extra}
    result = GrpoJobProvider().create(props)
    return JobSpec.from_props(props), result.id


def make_supervisor(head_url: str, spec: JobSpec, control: RecordingControl, api_url: str, **config: Any) -> Decider:
    settings = {"max_retries": 1, "backoff_s": 1.0, "settle_s": 20.0, "poll_s": 0.5, "capacity_timeout_s": 120.0,
                "budget_grace_s": 0.0, "expected_workers": 1, "expected_gpus": 1, **config}
    return decider(SupervisorConfig(
        head_url=head_url, submission_ids=spec.attempt_ids, entrypoint=spec.entrypoint, runtime_env=spec.runtime_env,
        run_id=spec.run_key, generation=spec.attempt, **settings), KubernetesApi(api_url), "ray", spec.ray_cluster,
        log=lambda _line: None, control=control)


def records_of(api_url: str, spec: JobSpec) -> RecordStore:
    return RecordStore(KubernetesApi(api_url), "ray", spec.ray_cluster)


def record_of(api_url: str, spec: JobSpec) -> RunRecord:
    found = records_of(api_url, spec).get(spec.run_key).record
    assert found is not None
    return found


def supervise(head: RayHead, api_url: str, spec: JobSpec, control: RecordingControl, until: float,
              **config: Any) -> Decider:
    supervisor = make_supervisor(head.dashboard_url, spec, control, api_url, **config)
    deadline = time.monotonic() + until
    while not record_of(api_url, spec).released and time.monotonic() < deadline:
        supervisor.step()
        time.sleep(0.5)
    return supervisor


@pytest.fixture(scope="module")
def gpu_node(ray_cluster: RayHead) -> Iterator[RayHead]:
    """One GPU node for the tests that do not lose it: a node takes seconds to join and to be counted dead."""
    node = start_node(ray_cluster, gpus=1)
    try:
        yield ray_cluster
    finally:
        stop_node(node, ray_cluster)


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_run_that_loses_its_node_is_resubmitted_and_resumes_from_its_checkpoint(ray_cluster: RayHead, api,
                                                                                   tmp_path):
    url, _ = api
    marker = tmp_path / "checkpoint"
    node = start_node(ray_cluster, gpus=1)
    spec, first = start_run(ray_cluster, url, entrypoint(marker, steps=40, pause=0.25))
    wait_for(lambda: marker.exists() and int(marker.read_text()) >= 3, 60, "the first checkpoints")
    stop_node(node, ray_cluster)  # a preempted GPU node, once the head counts it dead (then settle_s can be short)

    # The replacement joins once the supervisor waits for a whole cluster (not after a guessed time).
    replacement: list = []
    done = threading.Event()

    def replace_when_waiting() -> None:
        while not done.is_set():
            if record_of(url, spec).waiting_s > 0:
                replacement.append(start_node(ray_cluster, gpus=1))
                return
            time.sleep(0.2)

    joiner = threading.Thread(target=replace_when_waiting, daemon=True)
    joiner.start()
    control = RecordingControl()
    try:
        supervise(ray_cluster, url, spec, control, until=200, settle_s=2.0)
    finally:
        done.set()
        joiner.join(2 * 90)
        for started in replacement:
            stop_node(started, ray_cluster)
    assert replacement, "the supervisor never waited for a whole cluster"
    client = JobSubmissionClient(ray_cluster.dashboard_url)
    assert client.get_job_info(first).status == "FAILED"
    second = client.get_job_info(spec.supervised_ids[0])
    assert second.status == "SUCCEEDED"
    assert (meta(second.__dict__, "attempt"), meta(second.__dict__, "cause")) == ("1", "node-lost")
    assert meta(second.__dict__, "reason").startswith(f"after {first}")
    resumed = int(re.findall(r"^resumed from step (\d+)$", client.get_job_logs(spec.supervised_ids[0]), re.M)[-1])
    assert resumed >= 3  # not from scratch
    record = record_of(url, spec)
    assert record.outcome == run_lifecycle.SUCCEEDED
    assert control.calls[-1] == ("set_suspended", True)  # the GPU workers are released
    assert [a.submission_id for a in record.attempts] == [first, spec.supervised_ids[0]] and record.released


def test_a_run_that_fails_by_itself_is_retried_only_up_to_the_bound(gpu_node: RayHead, api):
    url, _ = api
    # Fails a few seconds in, after `pulumi up` (start-up grace 0) has seen it run.
    crash = f"{shlex.quote(sys.executable)} -c 'import sys, time; time.sleep(3); sys.exit(3)'"
    props_spec, first = start_run(gpu_node, url, crash, startup_grace_s=0)
    control = RecordingControl()
    supervise(gpu_node, url, props_spec, control, until=120, settle_s=0.5)
    jobs = {j.submission_id for j in JobSubmissionClient(gpu_node.dashboard_url).list_jobs()}
    ids = props_spec.attempt_ids
    assert [i in jobs for i in ids] == [True, True, False, False]  # 1 retry, then no more
    failed = record_of(url, props_spec).outcome
    assert failed is not None and (failed.state, failed.reason) == (run_lifecycle.Ended.FAILED, "RetriesSpent")
    assert str(failed).split(":")[0] == "failed by itself 2 times"
    assert ("set_suspended", True) in control.calls


def test_the_budget_stops_a_long_run_and_verl_is_told_its_deadline(gpu_node: RayHead, api, tmp_path):
    url, _ = api
    spec, first = start_run(gpu_node, url, entrypoint(tmp_path / "m", steps=1000, pause=1), budget_s=4)
    client = JobSubmissionClient(gpu_node.dashboard_url)
    job = client.get_job_info(first)
    deadline = int(job.runtime_env["env_vars"][DEADLINE_ENV])
    assert meta(job.__dict__, "budget_deadline") == str(deadline)
    assert abs(deadline - (time.time() + 4)) < 10
    control = RecordingControl()
    supervise(gpu_node, url, spec, control, until=60, budget_s=4)
    assert record_of(url, spec).outcome == run_lifecycle.budget_spent(4)
    wait_for(lambda: client.get_job_status(first) == "STOPPED", 30, "the stop")
    assert ("set_suspended", True) in control.calls


def test_status_lists_every_attempt_and_why_it_was_submitted(gpu_node: RayHead, api, tmp_path, capsys):
    url, _ = api
    spec, first = start_run(gpu_node, url, entrypoint(tmp_path / "m", steps=1000, pause=1))
    client = JobSubmissionClient(gpu_node.dashboard_url)
    client.stop_job(first)
    wait_for(lambda: client.get_job_status(first) == "STOPPED", 30, "the stop")
    claim_and_submit(gpu_node.dashboard_url, url, spec, Attempt(1, spec.attempt_ids[1], "supervisor", "node-lost", "test"))
    wait_for(lambda: client.get_job_status(spec.attempt_ids[1]) == "RUNNING", 60, "attempt 1 to run")
    from tests.test_cli import outputs_doc, write_outputs
    from verl_gke import cli

    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc(first))
    assert cli.main(["status", "--outputs", str(outputs), "--dashboard-url", gpu_node.dashboard_url]) == 0
    out = capsys.readouterr().out
    assert "Attempt 0      STOPPED  (pulumi-up)" in out  # by number: the Ray ids with --verbose
    assert "Attempt 1      RUNNING  (node-lost: test)" in out
    client.stop_job(spec.supervised_ids[0])


def claim_and_submit(head_url: str, api_url: str, spec: JobSpec, attempt: Attempt) -> RunRecord:
    """What the decider does for a next attempt: the claim in the record, then the submission."""
    records = records_of(api_url, spec)
    found = records.get(spec.run_key)
    assert found.record is not None
    record = records.write(found, run_lifecycle.claimed(found.record, attempt)).record
    assert record is not None
    run_lifecycle.submit_attempt(RayJobs(head_url), record, attempt, spec.entrypoint, spec.runtime_env)
    return record


def test_kubernetes_control_sends_exactly_these_requests(api):
    url, state = api
    path = "/apis/ray.io/v1/namespaces/ray/rayclusters/b200-ray-cluster"
    groups = [{"groupName": "gpu-group", "replicas": 2, "minReplicas": 2, "maxReplicas": 2}]
    state.put_object(path, {"metadata": {"name": "b200-ray-cluster"}, "spec": {"workerGroupSpecs": groups}})
    version = state.objects[path]["metadata"]["resourceVersion"]
    RayClusterControl(KubernetesApi(url, token=lambda: "tok"), "ray", "b200-ray-cluster").set_suspended(True)
    (get, patch) = state.requests
    assert get[:2] == ("GET", path)
    assert patch[:2] == ("PATCH", path + "?fieldManager=verl-gke-run-supervisor")
    assert patch[2]["Content-Type"] == "application/merge-patch+json"
    assert patch[2]["Authorization"] == "Bearer tok"
    # Only `spec.suspend`: the worker group list (one atomic field) stays Pulumi's.
    assert patch[3] == {"metadata": {"resourceVersion": version}, "spec": {"suspend": True}}
    assert state.objects[path]["spec"] == {"workerGroupSpecs": groups, "suspend": True}
    RayClusterControl(KubernetesApi(url, token=lambda: "tok"), "ray", "b200-ray-cluster").set_suspended(True)
    assert [r[0] for r in state.requests] == ["GET", "PATCH", "GET"]  # already suspended: no write
    RayClusterControl(KubernetesApi(url, token=lambda: "tok"), "ray", "b200-ray-cluster").set_suspended(False)
    assert state.requests[-1][3] == {"metadata": {"resourceVersion": str(int(version) + 1)}, "spec": {"suspend": False}}
    # No RayCluster: nothing to suspend, said so (not an error: checked again at the next step).
    assert RayClusterControl(KubernetesApi(url), "ray", "gone").set_suspended(True) is False
