"""The run supervisor against real Ray processes: a head of the module's own and a GPU node
joined with `ray start --address` (1 logical GPU). Attempt 0 is submitted by the GrpoJob provider,
as `pulumi up` does; the supervisor's Kubernetes side is a recording stand-in here (and, for
KubernetesControl itself, a loopback HTTP server in the API server's place)."""

from __future__ import annotations

import json
import re
import shlex
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from ray.job_submission import JobSubmissionClient

from components.grpo_job import GrpoJobProvider, _JobSpec
from tests.ray_head import RayHead, start_node, stop_node
from workloads.run_supervisor import (
    DEADLINE_ENV,
    KubernetesControl,
    RayJobs,
    Supervisor,
    SupervisorConfig,
    meta,
)

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
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def set_workers(self, replicas: int) -> None:
        self.calls.append(("set_workers", replicas))

    def record(self, state: dict[str, Any]) -> None:
        self.calls.append(("record", state))


def entrypoint(marker: Path, steps: int, pause: float) -> str:
    return " ".join(shlex.quote(a) for a in [sys.executable, "-c", TRAIN, str(marker), str(steps), str(pause)])


def start_run(head: RayHead, entry: str, **extra: Any) -> tuple[_JobSpec, str]:
    props = {"dashboard_url": head.dashboard_url, "stack": f"t{uuid.uuid4().hex[:8]}", "runtime_env": {},
             "entrypoint": entry, "startup_grace_s": 0, "expected_workers": 1, "expected_gpus": 1,
             "supervised_attempts": 3, "ready_timeout_s": 120, **extra}
    result = GrpoJobProvider().create(props)
    return _JobSpec.from_props(props), result.id


def supervise(head: RayHead, spec: _JobSpec, control: RecordingControl, until: float, **config: Any) -> Supervisor:
    settings = {"max_retries": 1, "backoff_s": 1.0, "settle_s": 20.0, "poll_s": 0.5, "capacity_timeout_s": 120.0,
                "budget_grace_s": 0.0, **config}
    supervisor = Supervisor(SupervisorConfig(
        head_url=head.dashboard_url, submission_ids=[spec.submission_id, *spec.supervised_ids],
        entrypoint=spec.entrypoint, runtime_env=spec.runtime_env, expected_workers=1, expected_gpus=1, **settings),
        RayJobs(head.dashboard_url), control)
    deadline = time.monotonic() + until
    while not supervisor.done and time.monotonic() < deadline:
        supervisor.step()
        time.sleep(0.5)
    return supervisor


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_run_that_loses_its_node_is_resubmitted_and_resumes_from_its_checkpoint(ray_cluster: RayHead, tmp_path):
    marker = tmp_path / "checkpoint"
    node = start_node(ray_cluster, gpus=1)
    spec, first = start_run(ray_cluster, entrypoint(marker, steps=40, pause=0.25))
    wait_for(lambda: marker.exists() and int(marker.read_text()) >= 3, 60, "the first checkpoints")
    stop_node(node)  # a preempted GPU node

    replacement: list = []
    threading.Timer(25, lambda: replacement.append(start_node(ray_cluster, gpus=1))).start()
    control = RecordingControl()
    try:
        supervisor = supervise(ray_cluster, spec, control, until=200)
    finally:
        wait_for(lambda: replacement, 90, "the replacement node")
        stop_node(replacement[0], ray_cluster)
    client = JobSubmissionClient(ray_cluster.dashboard_url)
    assert client.get_job_info(first).status == "FAILED"
    second = client.get_job_info(spec.supervised_ids[0])
    assert second.status == "SUCCEEDED"
    assert (meta(second.__dict__, "attempt"), meta(second.__dict__, "cause")) == ("1", "node-lost")
    assert meta(second.__dict__, "reason").startswith(f"after {first}")
    resumed = int(re.findall(r"^resumed from step (\d+)$", client.get_job_logs(spec.supervised_ids[0]), re.M)[-1])
    assert resumed >= 3  # not from scratch
    assert supervisor.done == "succeeded"
    assert control.calls[-2] == ("set_workers", 0)  # the GPU workers are released
    assert control.calls[-1][1]["attempts"] == [first, spec.supervised_ids[0]]


def test_a_run_that_fails_by_itself_is_retried_only_up_to_the_bound(ray_cluster: RayHead, tmp_path):
    node = start_node(ray_cluster, gpus=1)
    try:
        # Fails a few seconds in, after `pulumi up` (start-up grace 0) has seen it run.
        crash = f"{shlex.quote(sys.executable)} -c 'import sys, time; time.sleep(3); sys.exit(3)'"
        props_spec, first = start_run(ray_cluster, crash, startup_grace_s=0)
        control = RecordingControl()
        supervisor = supervise(ray_cluster, props_spec, control, until=120, settle_s=0.5)
        jobs = {j.submission_id for j in JobSubmissionClient(ray_cluster.dashboard_url).list_jobs()}
        ids = [props_spec.submission_id, *props_spec.supervised_ids]
        assert [i in jobs for i in ids] == [True, True, False, False]  # 1 retry, then no more
        assert supervisor.done.startswith("failed by itself 2 times")
        assert ("set_workers", 0) in control.calls
    finally:
        stop_node(node, ray_cluster)


def test_the_budget_stops_a_long_run_and_verl_is_told_its_deadline(ray_cluster: RayHead, tmp_path):
    node = start_node(ray_cluster, gpus=1)
    try:
        spec, first = start_run(ray_cluster, entrypoint(tmp_path / "m", steps=1000, pause=1), budget_s=4)
        client = JobSubmissionClient(ray_cluster.dashboard_url)
        job = client.get_job_info(first)
        deadline = int(job.runtime_env["env_vars"][DEADLINE_ENV])
        assert meta(job.__dict__, "budget_deadline") == str(deadline)
        assert abs(deadline - (time.time() + 4)) < 10
        control = RecordingControl()
        supervisor = supervise(ray_cluster, spec, control, until=60, budget_s=4)
        assert supervisor.done == "budget spent"
        wait_for(lambda: client.get_job_status(first) == "STOPPED", 30, "the stop")
        assert ("set_workers", 0) in control.calls
    finally:
        stop_node(node, ray_cluster)


def test_pulumi_up_adopts_the_supervisors_live_attempt_instead_of_starting_another(ray_cluster: RayHead, tmp_path,
                                                                                   capsys):
    node = start_node(ray_cluster, gpus=1)
    try:
        spec, first = start_run(ray_cluster, entrypoint(tmp_path / "m", steps=1000, pause=1))
        client = JobSubmissionClient(ray_cluster.dashboard_url)
        client.stop_job(first)
        wait_for(lambda: client.get_job_status(first) == "STOPPED", 30, "the stop")
        supervisor = Supervisor(SupervisorConfig(
            head_url=ray_cluster.dashboard_url, submission_ids=[first, *spec.supervised_ids], entrypoint=spec.entrypoint,
            runtime_env=spec.runtime_env, expected_workers=1, expected_gpus=1), RayJobs(ray_cluster.dashboard_url),
            RecordingControl())
        supervisor._submit(1, "node-lost", "test", None)
        props = {key: getattr(spec, key) for key in ("dashboard_url", "stack", "runtime_env", "entrypoint",
                                                      "startup_grace_s", "supervised_attempts")}
        again = GrpoJobProvider().create(props)
        assert again.id == spec.supervised_ids[0]
        mine = [j.submission_id for j in client.list_jobs() if j.submission_id.startswith(f"verl-grpo-{spec.stack}-")]
        assert sorted(mine) == sorted([first, spec.supervised_ids[0]])
        # verl-gke status shows both attempts and why each was submitted.
        from tests.test_cli import outputs_doc, write_outputs
        from verl_gke import cli

        outputs = write_outputs(tmp_path / "outputs.json", outputs_doc(first))
        assert cli.main(["status", "--outputs", str(outputs), "--dashboard-url", ray_cluster.dashboard_url]) == 0
        out = capsys.readouterr().out
        assert f"Attempt 0      {first}  STOPPED  (pulumi-up)" in out
        assert f"Attempt 1      {spec.supervised_ids[0]}  RUNNING  (node-lost: test)" in out
        client.stop_job(again.id)
    finally:
        stop_node(node, ray_cluster)


def test_keep_workers_leaves_them_running():
    control = RecordingControl()
    supervisor = Supervisor(SupervisorConfig(head_url="http://x", submission_ids=["a"], entrypoint="e",
                                             runtime_env={}, expected_workers=1, expected_gpus=8,
                                             release_workers=False), RayJobs("http://x"), control)
    supervisor._finish("succeeded", [])
    assert [c[0] for c in control.calls] == ["record"]


class _ApiServer(BaseHTTPRequestHandler):
    """A stand-in for the Kubernetes API server: records each request, answers a RayCluster."""

    requests: list[tuple[str, str, dict[str, str], Any]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.requests.append((self.command, self.path, dict(self.headers), body))
        reply = {"spec": {"workerGroupSpecs": [{"groupName": "other", "replicas": 1},
                                                {"groupName": "gpu-group", "replicas": 2, "minReplicas": 2,
                                                 "maxReplicas": 2}]}}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PATCH = _answer

    def log_message(self, *args: Any) -> None:
        pass


def test_kubernetes_control_sends_exactly_these_requests():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ApiServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        control = KubernetesControl(f"http://127.0.0.1:{server.server_port}", "tok", "ray", "b200-ray-cluster",
                                    "gpu-group", "b200-ray-cluster-supervisor")
        control.set_workers(0)
        control.record({"done": "succeeded"})
    finally:
        server.shutdown()
    (get, patch, record) = _ApiServer.requests
    assert get[:2] == ("GET", "/apis/ray.io/v1/namespaces/ray/rayclusters/b200-ray-cluster")
    assert patch[:2] == ("PATCH", get[1] + "?fieldManager=verl-gke-run-supervisor")
    assert patch[2]["Content-Type"] == "application/merge-patch+json"
    assert patch[2]["Authorization"] == "Bearer tok"
    assert patch[3] == {"spec": {"workerGroupSpecs": [
        {"groupName": "other", "replicas": 1},
        {"groupName": "gpu-group", "replicas": 0, "minReplicas": 0, "maxReplicas": 2}]}}
    assert record[:2] == ("PATCH", "/api/v1/namespaces/ray/configmaps/b200-ray-cluster-supervisor"
                                   "?fieldManager=verl-gke-run-supervisor")
    assert record[3] == {"data": {"state.json": '{"done": "succeeded"}'}}


def test_before_a_new_runs_first_attempt_released_workers_come_back(ray_cluster: RayHead):
    control = RecordingControl()
    supervisor = Supervisor(SupervisorConfig(
        head_url=ray_cluster.dashboard_url, submission_ids=[f"verl-grpo-new-{uuid.uuid4().hex[:12]}"],
        entrypoint="e", runtime_env={}, expected_workers=2, expected_gpus=16), RayJobs(ray_cluster.dashboard_url),
        control)
    supervisor.step()
    supervisor.step()
    assert control.calls == [("set_workers", 2)]  # once, so the job provider's readiness gate can pass


def test_a_release_that_fails_is_tried_again():
    class Flaky(RecordingControl):
        def set_workers(self, replicas: int) -> None:
            if not self.calls:
                self.calls.append(("failed", replicas))
                raise OSError("API server unreachable")
            super().set_workers(replicas)

    control = Flaky()
    supervisor = Supervisor(SupervisorConfig(head_url="http://x", submission_ids=["a"], entrypoint="e", runtime_env={},
                                             expected_workers=1, expected_gpus=8), RayJobs("http://x"), control)
    with pytest.raises(OSError):
        supervisor._finish("succeeded", [])
    assert supervisor.done == ""  # so the next step finishes again
    supervisor._finish("succeeded", [])
    assert supervisor.done == "succeeded" and ("set_workers", 0) in control.calls


def test_a_head_that_forgot_its_jobs_gets_the_next_attempt(ray_cluster: RayHead):
    ids = [f"verl-grpo-gone-{uuid.uuid4().hex[:12]}" for _ in range(2)]
    supervisor = Supervisor(SupervisorConfig(
        head_url=ray_cluster.dashboard_url, submission_ids=ids, entrypoint="true", runtime_env={},
        expected_workers=0, expected_gpus=0, poll_s=0.2), RayJobs(ray_cluster.dashboard_url), RecordingControl())
    supervisor.last_index = 0  # it saw attempt 0 before the head restarted
    supervisor.step()
    job = JobSubmissionClient(ray_cluster.dashboard_url).get_job_info(ids[1])
    assert (meta(job.__dict__, "attempt"), meta(job.__dict__, "cause")) == ("1", "node-lost")
