"""One test per fault of issue "One owner per run", named after it: the GrpoJob provider and the run
supervisor against real Ray processes on 127.0.0.1 (a head restart is a kill and a new head on the
same ports, as a KubeRay head pod restart without GCS fault tolerance) and the loopback Kubernetes
API stand-in (tests/kube_api.py) that keeps the run record and the RayCluster.

Invariants asserted: at most one live attempt of a run at any moment, no run lost, the GPU workers
released on every terminal path, each run in its own checkpoint folder."""

from __future__ import annotations

import json
import shlex
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import yaml

from components.grpo_job import GrpoJobProvider, _JobSpec
from domain.config import ConfigError, load_config
from domain.grpo_spec import entrypoint
from domain.platforms import VERL_0_9_0
from domain.verl_wheel import config_dir
from domain.stack_run import stack_run
from tests.conftest import BASE_CONFIG, verl_value
from tests.kube_api import KubeApiStandIn, kube_api
from tests.ray_head import MULTI_NODE_ENV, RayHead, restart_head, start_head, start_node, stop_head, stop_node
from workloads import run_lifecycle
from workloads.run_lifecycle import (
    LIVE,
    Attempt,
    ConfigMapRecords,
    KubernetesApi,
    RayJobs,
    RunRecord,
)
from workloads.run_supervisor import MAX_BACKOFF_S, KubernetesControl, Supervisor, SupervisorConfig, run_forever

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

NAMESPACE = "ray"
RAY_CLUSTER = f"/apis/ray.io/v1/namespaces/{NAMESPACE}/rayclusters/rc"
SLEEP = f"{shlex.quote(sys.executable)} -c 'import time; time.sleep(300)'"
CRASH = f"{shlex.quote(sys.executable)} -c 'import sys, time; time.sleep(2); sys.exit(3)'"
QUICK = f"{shlex.quote(sys.executable)} -c pass"


@pytest.fixture(scope="module")
def heads() -> Iterator[dict[str, RayHead]]:
    """The module's head, replaced in place by a restart."""
    holder = {"head": start_head(env=MULTI_NODE_ENV)}
    try:
        yield holder
    finally:
        stop_head(holder["head"], grace_s=5.0)


@pytest.fixture
def api() -> Iterator[tuple[str, KubeApiStandIn]]:
    with kube_api() as (url, state):
        state.put_object(RAY_CLUSTER, {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc"},
                                       "spec": {"workerGroupSpecs": [{"groupName": "gpu-group", "replicas": 1,
                                                                      "minReplicas": 1, "maxReplicas": 1}]}})
        yield url, state


def job_props(head: RayHead, api_url: str, entry: str, **extra: Any) -> dict[str, Any]:
    return {"dashboard_url": head.dashboard_url, "kube_api_url": api_url, "namespace": NAMESPACE,
            "stack": f"t{uuid.uuid4().hex[:8]}", "entrypoint": entry, "runtime_env": {}, "startup_grace_s": 0,
            "ready_timeout_s": 60, "supervised_attempts": 3, **extra}


def supervisor(head: RayHead, api_url: str, spec: _JobSpec, clock: Callable[[], float] = time.time,
               **config: Any) -> Supervisor:
    settings = {"settle_s": 0.0, "poll_s": 0.2, "backoff_s": 1.0, "budget_grace_s": 0.0, **config}
    api = KubernetesApi(api_url)
    return Supervisor(SupervisorConfig(
        head_url=head.dashboard_url, submission_ids=spec.attempt_ids, entrypoint=spec.entrypoint,
        runtime_env=spec.runtime_env, expected_workers=spec.expected_workers, expected_gpus=spec.expected_gpus,
        run_id=spec.run_key, generation=spec.attempt, **settings),
        RayJobs(head.dashboard_url), KubernetesControl(api, NAMESPACE, "rc"),
        ConfigMapRecords(api, NAMESPACE, spec.record_name), log=lambda _line: None, clock=clock)


def record(api_url: str, spec: _JobSpec) -> RunRecord | None:
    return ConfigMapRecords(KubernetesApi(api_url), NAMESPACE, spec.record_name).get(spec.run_key)


def live(head: RayHead, spec: _JobSpec) -> list[str]:
    jobs = RayJobs(head.dashboard_url).jobs()
    return [sid for sid in spec.attempt_ids if sid in jobs and jobs[sid]["status"] in LIVE]


def status(head: RayHead, submission_id: str) -> str | None:
    job = RayJobs(head.dashboard_url).jobs().get(submission_id)
    return job["status"] if job else None


def released(state: KubeApiStandIn) -> bool:
    """Whether the RayCluster is suspended (KubeRay then deletes its pods, GPU workers included)."""
    return bool(state.objects[RAY_CLUSTER]["spec"].get("suspend"))


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def stop_all(head: RayHead, spec: _JobSpec) -> None:
    """Stops the run's live attempts and waits until they ended: a release waits while any job holds
    the workers, so a later test's would otherwise wait for this one's."""
    for sid in live(head, spec):
        RayJobs(head.dashboard_url).stop(sid)
    wait_for(lambda: not live(head, spec), 60, "the stopped attempts to end")


def outs(result: Any) -> dict[str, Any]:
    return dict(result.outs)


def test_1_head_restart_then_refresh_and_up_leave_one_live_attempt(heads, api):
    url, _ = api
    props = job_props(heads["head"], url, SLEEP)
    spec = _JobSpec.from_props(props)
    provider = GrpoJobProvider()
    created = provider.create(props)
    heads["head"] = restart_head(heads["head"])
    head = heads["head"]
    # The refresh keeps the resource: Pulumi does not forget it and run `create` beside the run.
    read = provider.read(created.id, outs(created))
    assert (read.id, outs(read)["status"]) == (created.id, "LOST")
    supervisor(head, url, spec).step()  # the supervisor resubmits the lost run
    assert live(head, spec) == [spec.attempt_ids[1]]
    # Even if `create` runs again, it adopts the supervisor's attempt.
    again = provider.create(props)
    assert again.id == spec.attempt_ids[1]
    assert live(head, spec) == [spec.attempt_ids[1]]
    stop_all(head, spec)

    # `create` looks again after its gates: a run claimed meanwhile is adopted, not doubled.
    props = job_props(head, url, SLEEP, expected_workers=1, expected_gpus=1)
    spec = _JobSpec.from_props(props)
    records = ConfigMapRecords(KubernetesApi(url), NAMESPACE, spec.record_name)
    nodes: list = []

    def meanwhile() -> None:
        time.sleep(2)
        rec = run_lifecycle.begin(records, spec.run_key, 0, time.time())
        attempt = Attempt(index=0, submission_id=spec.attempt_ids[0], by="supervisor", at=time.time(), cause="test")
        rec, won = run_lifecycle.claim(records, spec.run_key, attempt, 0)
        assert won
        run_lifecycle.submit_claimed(RayJobs(head.dashboard_url), records, rec, attempt, spec.entrypoint, {})
        nodes.append(start_node(head, gpus=1))

    thread = threading.Thread(target=meanwhile)
    thread.start()
    try:
        adopted = GrpoJobProvider().create(props)
        assert adopted.id == spec.attempt_ids[0]
        assert live(head, spec) == [spec.attempt_ids[0]]
        assert [a.by for a in record(url, spec).attempts] == ["supervisor"]
    finally:
        thread.join()
        stop_all(head, spec)
        for node in nodes:
            stop_node(node)


def test_2_head_restart_after_the_end_keeps_the_workers_released(heads, api):
    url, state = api
    props = job_props(heads["head"], url, QUICK)
    spec = _JobSpec.from_props(props)
    GrpoJobProvider().create(props)
    wait_for(lambda: status(heads["head"], spec.attempt_ids[0]) == "SUCCEEDED", 60, "the run's end")
    first = supervisor(heads["head"], url, spec)
    first.step()
    assert record(url, spec).outcome == "succeeded" and record(url, spec).released
    assert released(state)
    heads["head"] = restart_head(heads["head"])
    later = supervisor(heads["head"], url, spec)  # a restarted supervisor too
    for _ in range(3):
        later.step()
    assert released(state)
    assert not RayJobs(heads["head"].dashboard_url).jobs()


class _Truncated(BaseHTTPRequestHandler):
    """A head whose reply is cut short: http.client.IncompleteRead in the reader."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "1000")
        self.end_headers()
        self.wfile.write(b'[{"submission_id": ')
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)

    def log_message(self, *args: Any) -> None:
        pass


def test_3_supervisor_restart_with_a_head_restart_loses_no_run_and_no_step_error_ends_it(heads, api):
    url, _ = api
    props = job_props(heads["head"], url, SLEEP)
    spec = _JobSpec.from_props(props)
    GrpoJobProvider().create(props)
    supervisor(heads["head"], url, spec).step()  # the first supervisor, then evicted: its memory is gone
    heads["head"] = restart_head(heads["head"])
    supervisor(heads["head"], url, spec).step()  # a new one rebuilds from the record
    assert live(heads["head"], spec) == [spec.attempt_ids[1]]
    assert [(a.index, a.by, a.cause) for a in record(url, spec).attempts] == [
        (0, "pulumi-up", "pulumi-up"), (1, "supervisor", "node-lost")]
    stop_all(heads["head"], spec)

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Truncated)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        spec = _JobSpec.from_props(job_props(heads["head"], url, SLEEP))
        broken = supervisor(heads["head"], url, spec)
        broken.ray = RayJobs(f"http://127.0.0.1:{server.server_port}", timeout_s=5)
        run_lifecycle.begin(broken.records, spec.run_key, 0, time.time())
        run_lifecycle.claim(broken.records, spec.run_key, Attempt(0, spec.attempt_ids[0], "pulumi-up", time.time(),
                                                                   "pulumi-up", submitted=True), 0)
        lines: list[str] = []
        broken.log = lines.append
        pauses: list[float] = []
        run_forever(broken, sleep=pauses.append, steps=3)
    finally:
        server.shutdown()
        server.server_close()
    assert len(lines) == 3 and all("step failed" in line and "IncompleteRead" in line for line in lines)
    assert pauses == [5.0, 10.0, 20.0]  # capped exponential backoff, and it goes on


def test_4_failed_deploy_releases_the_workers_and_a_cluster_never_whole_ends_the_run(heads, api):
    url, state = api
    # The release waits while any job holds the workers: the earlier tests' stops must have landed.
    wait_for(lambda: not [j for j in RayJobs(heads["head"].dashboard_url).jobs().values() if j["status"] in LIVE],
             120, "the earlier tests' jobs to end")
    props = job_props(heads["head"], url, SLEEP, expected_workers=1, expected_gpus=1, ready_timeout_s=3)
    spec = _JobSpec.from_props(props)
    with pytest.raises(TimeoutError, match="not submitted within ready_timeout_s=3 s"):
        GrpoJobProvider().create(props)
    assert record(url, spec).outcome == run_lifecycle.DEPLOY_FAILED
    supervisor(heads["head"], url, spec).step()
    assert released(state) and record(url, spec).released

    # A refused second run: the workers are released only once the other run no longer holds them.
    state.objects[RAY_CLUSTER]["spec"]["suspend"] = False
    props = job_props(heads["head"], url, SLEEP)
    spec = _JobSpec.from_props(props)
    other = f"verl-grpo-{props['stack']}-000000000000"
    RayJobs(heads["head"].dashboard_url).submit(other, SLEEP, {}, {})
    with pytest.raises(RuntimeError, match="another run or a model export of stack"):
        GrpoJobProvider().create(props)
    watcher = supervisor(heads["head"], url, spec)
    watcher.step()
    assert record(url, spec).outcome == run_lifecycle.DEPLOY_FAILED and not released(state)
    RayJobs(heads["head"].dashboard_url).stop(other)
    wait_for(lambda: status(heads["head"], other) == "STOPPED", 30, "the other run's stop")
    watcher.step()
    assert released(state) and record(url, spec).released

    # A deploy that died between beginning the run and claiming attempt 0 holds no GPU past the bound.
    state.objects[RAY_CLUSTER]["spec"]["suspend"] = False
    spec = _JobSpec.from_props(job_props(heads["head"], url, SLEEP, expected_workers=1, expected_gpus=1))
    run_lifecycle.begin(ConfigMapRecords(KubernetesApi(url), NAMESPACE, spec.record_name), spec.run_key, 0,
                        time.time())
    now = [time.time()]
    watcher = supervisor(heads["head"], url, spec, clock=lambda: now[0], capacity_timeout_s=600)
    watcher.step()
    assert not record(url, spec).outcome and not released(state)
    now[0] += 601
    watcher.step()
    assert record(url, spec).outcome == run_lifecycle.DEPLOY_FAILED and released(state)

    # A lost attempt, and a cluster that never becomes whole: the wait ends at its bound.
    state.objects[RAY_CLUSTER]["spec"]["suspend"] = False
    props = job_props(heads["head"], url, SLEEP, expected_workers=1, expected_gpus=1)
    spec = _JobSpec.from_props(props)
    records = ConfigMapRecords(KubernetesApi(url), NAMESPACE, spec.record_name)
    run_lifecycle.begin(records, spec.run_key, 0, time.time())
    run_lifecycle.claim(records, spec.run_key, Attempt(0, spec.attempt_ids[0], "pulumi-up", time.time(), "pulumi-up",
                                                        submitted=True), 0)
    now = [time.time()]
    watcher = supervisor(heads["head"], url, spec, clock=lambda: now[0], capacity_timeout_s=600)
    watcher.step()
    assert record(url, spec).waiting_since == now[0] and not record(url, spec).outcome
    now[0] += 601
    watcher.step()
    assert record(url, spec).outcome == "the cluster was not whole within 600 s (0 of 1 GPU workers, 0 of 1 GPUs)"
    assert released(state) and record(url, spec).released
    assert not live(heads["head"], spec)

    # A jobAttempt bump: `pulumi up` deploys the new generation's supervisor, then the job's replace
    # deletes the old generation (recording it) and creates the new one. An up that dies between the
    # two leaves the older record to the new supervisor, the only one left: it releases the workers.
    state.objects[RAY_CLUSTER]["spec"]["suspend"] = False
    props = job_props(heads["head"], url, SLEEP)
    old = _JobSpec.from_props(props)
    provider = GrpoJobProvider()
    created = provider.create(props)
    new = _JobSpec.from_props({**props, "attempt": 1})
    provider.delete(created.id, outs(created))
    supervisor(heads["head"], url, new).step()
    assert record(url, old).outcome == run_lifecycle.DELETED
    assert released(state) and record(url, old).released

    # An up that fails before the replace leaves the older generation running: the new supervisor
    # resubmits none of its attempts (their ids are not its own) and releases it once it ends.
    state.objects[RAY_CLUSTER]["spec"]["suspend"] = False
    props = job_props(heads["head"], url, SLEEP)
    old = _JobSpec.from_props(props)
    created = GrpoJobProvider().create(props)
    watcher = supervisor(heads["head"], url, _JobSpec.from_props({**props, "attempt": 1}))
    watcher.step()
    assert not record(url, old).outcome and not released(state)
    RayJobs(heads["head"].dashboard_url).stop(created.id)
    wait_for(lambda: status(heads["head"], created.id) == "STOPPED", 30, "the older generation's end")
    watcher.step()
    assert record(url, old).outcome == ("jobAttempt 0 ended under the supervisor of jobAttempt 1, which resubmits "
                                        f"none of its attempts: {created.id} was stopped")
    assert released(state) and record(url, old).released
    assert [a.submission_id for a in record(url, old).attempts] == [created.id]


def test_5_budget_is_enforced_before_every_submission_with_a_capped_backoff(heads, api):
    url, _ = api
    head = heads["head"]

    def failed_attempt(budget_s: float) -> tuple[_JobSpec, ConfigMapRecords]:
        spec = _JobSpec.from_props(job_props(head, url, CRASH, budget_s=budget_s))
        records = ConfigMapRecords(KubernetesApi(url), NAMESPACE, spec.record_name)
        run_lifecycle.begin(records, spec.run_key, 0, time.time())
        attempt = Attempt(0, spec.attempt_ids[0], "pulumi-up", time.time(), "pulumi-up",
                          dead_nodes=RayJobs(head.dashboard_url).capacity().dead)
        rec, _ = run_lifecycle.claim(records, spec.run_key, attempt, budget_s)
        run_lifecycle.submit_claimed(RayJobs(head.dashboard_url), records, rec, attempt, spec.entrypoint, {})
        wait_for(lambda: status(head, spec.attempt_ids[0]) == "FAILED", 60, "the attempt's failure")
        return spec, records

    # After the deadline (here, during the backoff), no attempt is submitted.
    spec, _ = failed_attempt(budget_s=1)
    supervisor(head, url, spec, budget_s=1, max_retries=3).step()
    assert record(url, spec).outcome == "budget of 1 s spent"
    assert status(head, spec.attempt_ids[1]) is None

    # runRetryBackoffSeconds 3600 would wait 3600, 7200, ... s: the wait is capped.
    spec, _ = failed_attempt(budget_s=0)
    ended = RayJobs(head.dashboard_url).jobs()[spec.attempt_ids[0]]["end_time"] / 1000
    now = [ended + MAX_BACKOFF_S - 5]
    watcher = supervisor(head, url, spec, clock=lambda: now[0], backoff_s=3600.0, max_retries=10)
    watcher.step()
    assert status(head, spec.attempt_ids[1]) is None
    now[0] = ended + MAX_BACKOFF_S + 1
    watcher.step()
    assert status(head, spec.attempt_ids[1]) is not None
    stop_all(head, spec)

    # Refused where nothing would enforce the budget, or where its stop would lose the whole run.
    with pytest.raises(ConfigError) as caught:
        load_config({**BASE_CONFIG, "verl-gke:runBudgetHours": "6", "verl-gke:runSupervisor": "false",
                     "verl-gke:verl": verl_value({"trainer.save_freq": -1, "trainer.max_actor_ckpt_to_keep": 1,
                                                  "trainer.max_critic_ckpt_to_keep": 1})})
    assert caught.value.problems == [
        'verl-gke:runBudgetHours = 6: needs runSupervisor: true: only the run supervisor stops a run at its budget.',
        'verl-gke:verl.trainer.save_freq = -1: must be a positive number of steps with runBudgetHours: verl writes '
        'its deadline checkpoint only when it saves at all, so the stop would lose the whole run.',
        *[f'verl-gke:verl.trainer.max_{role}_ckpt_to_keep = 1: verl 0.6.1 deletes its oldest checkpoint before it '
          'writes the next: keeping 1 loses the only one when a node is lost during a save; keep at least 2.'
          for role in ("actor", "critic")],
    ]
    a4x = {**BASE_CONFIG, "verl-gke:platform": "a4x", "verl-gke:clusterMode": "standard", "verl-gke:gpuNodes": "4",
           "verl-gke:verl": verl_value({"trainer.max_actor_ckpt_to_keep": 1})}  # 2 GB200 nodes do not fit the rollout
    assert load_config(a4x).verl.get("trainer.max_actor_ckpt_to_keep") == 1  # verl 0.9.0 saves before it deletes
    # On A4X a budget runs verl 0.9.0's legacy trainer, the one that saves before the deadline.
    cfg = load_config({**a4x, "verl-gke:runBudgetHours": "6"})
    run_id, legacy = stack_run(cfg)
    assert legacy and "trainer.use_v1=False" in entrypoint(cfg.verl, run_id=run_id, legacy_trainer=legacy).split()
    assert stack_run(load_config(a4x))[1] is False
    # The key exists in the pinned verl 0.9.0 (Hydra refuses an override of an unknown key), on by default.
    trainer = yaml.safe_load((config_dir(VERL_0_9_0) / "ppo_trainer.yaml").read_text())["trainer"]
    assert trainer["use_v1"] is True


def test_6_no_baseline_delete_in_backoff_and_replace_with_the_same_ids(heads, api):
    url, state = api
    head = heads["head"]
    # Attempt 0 has a dead-node baseline: a later failure is judged against it.
    props = job_props(head, url, CRASH)
    spec = _JobSpec.from_props(props)
    provider = GrpoJobProvider()
    created = provider.create(props)
    assert record(url, spec).attempts[0].dead_nodes == RayJobs(head.dashboard_url).capacity().dead
    wait_for(lambda: status(head, created.id) == "FAILED", 60, "the failure")
    now = [time.time()]
    watcher = supervisor(head, url, spec, clock=lambda: now[0], backoff_s=30.0)
    watcher.step()  # in its backoff
    provider.delete(created.id, outs(created))
    now[0] += 60
    watcher.step()
    assert status(head, spec.attempt_ids[1]) is None  # nothing submitted after the delete
    assert record(url, spec).outcome == run_lifecycle.DELETED and released(state)

    # A replace that keeps the ids (a new dashboard URL): delete stops the run, create goes on.
    props = job_props(head, url, SLEEP)
    spec = _JobSpec.from_props(props)
    created = provider.create(props)
    provider.delete(created.id, outs(created))
    assert status(head, created.id) == "STOPPED"
    again = provider.create(props)
    assert again.id == spec.attempt_ids[1] and live(head, spec) == [spec.attempt_ids[1]]
    stop_all(head, spec)


def test_7_pulumi_and_the_supervisor_never_own_the_same_field(api):
    url, state = api
    kube = KubernetesApi(url)
    # A strategic merge patch of a custom resource is refused, as by the real API server.
    with pytest.raises(Exception, match="415"):
        kube.request("PATCH", RAY_CLUSTER, {"spec": {}}, content_type="application/strategic-merge-patch+json")

    # Someone else writes the RayCluster between the supervisor's read and its patch: 409, read again.
    class Racing(KubernetesApi):
        raced = False

        def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
            if method == "PATCH" and not self.raced:
                self.raced = True
                state.put_object(RAY_CLUSTER, {**state.get(RAY_CLUSTER), "spec": {"workerGroupSpecs": [
                    {"groupName": "gpu-group", "replicas": 1, "minReplicas": 1, "maxReplicas": 1},
                    {"groupName": "added", "replicas": 3}]}})
            return super().request(method, path, body, content_type)

    KubernetesControl(Racing(url), NAMESPACE, "rc").set_released(True)
    spec_now = state.objects[RAY_CLUSTER]["spec"]
    assert spec_now["suspend"] is True  # the patch made again from the fresh read
    assert [(g["groupName"], g["replicas"]) for g in spec_now["workerGroupSpecs"]] == [("gpu-group", 1), ("added", 3)]
    patches = [r for r in state.requests if r[0] == "PATCH" and r[2].get("Content-Type") == "application/merge-patch+json"]
    assert len(patches) == 2 and all(p[3]["metadata"]["resourceVersion"] for p in patches)
    assert all(set(p[3]["spec"]) == {"suspend"} for p in patches)  # nothing but its own field
    KubernetesControl(kube, NAMESPACE, "rc").set_released(True)
    assert len([r for r in state.requests if r[0] == "PATCH"]) == 3  # already released: no write

    # A later `pulumi up` applies the program's RayCluster, which never names spec.suspend: with or
    # without force (Pulumi's patchForce) the released cluster stays released.
    apply = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc"}, "spec": {
        "rayVersion": "2.49.0",
        "workerGroupSpecs": [{"groupName": "gpu-group", "replicas": 1, "minReplicas": 1, "maxReplicas": 1}]}}
    kube.request("PATCH", f"{RAY_CLUSTER}?fieldManager=pulumi-kubernetes", apply,
                 content_type="application/apply-patch+yaml")
    kube.request("PATCH", f"{RAY_CLUSTER}?fieldManager=pulumi-kubernetes&force=true", apply,
                 content_type="application/apply-patch+yaml")
    assert released(state) and state.objects[RAY_CLUSTER]["spec"]["rayVersion"] == "2.49.0"
    # Were the program ever to send the field, the API server would refuse it as the supervisor's.
    with pytest.raises(Exception, match="409"):
        kube.request("PATCH", f"{RAY_CLUSTER}?fieldManager=pulumi-kubernetes",
                     {**apply, "spec": {**apply["spec"], "suspend": False}}, content_type="application/apply-patch+yaml")
    assert released(state)

    # The supervisor of a run that ended with its workers released makes no write at all.
    spec = _JobSpec.from_props({"dashboard_url": "http://127.0.0.1:9", "entrypoint": "e", "runtime_env": {},
                                "kube_api_url": url, "namespace": NAMESPACE, "run_id": "run-done"})
    records = ConfigMapRecords(kube, NAMESPACE, spec.record_name)
    run_lifecycle.begin(records, "run-done", 0, time.time())
    run_lifecycle.end(records, "run-done", "succeeded", time.time(), released=True)
    writes = len([r for r in state.requests if r[0] == "PATCH" and RAY_CLUSTER in r[1]])
    watcher = Supervisor(SupervisorConfig(head_url="http://127.0.0.1:9", submission_ids=spec.attempt_ids,
                                          entrypoint="e", runtime_env={}, expected_workers=1, expected_gpus=1,
                                          run_id="run-done"),
                         RayJobs("http://127.0.0.1:9"), KubernetesControl(kube, NAMESPACE, "rc"),
                         records, log=lambda _line: None)
    watcher.step()
    assert released(state)
    assert len([r for r in state.requests if r[0] == "PATCH" and RAY_CLUSTER in r[1]]) == writes

    # Why the release is not a replica count: the worker group list is one atomic field, so a merge
    # patch of one group's replicas takes the whole list, and the program's next apply conflicts on it.
    kube.request("PATCH", f"{RAY_CLUSTER}?fieldManager=kubectl-edit", {"spec": {"workerGroupSpecs": [
        {"groupName": "gpu-group", "replicas": 0, "minReplicas": 0, "maxReplicas": 1}]}},
        content_type="application/merge-patch+json")
    with pytest.raises(Exception, match="409"):
        kube.request("PATCH", f"{RAY_CLUSTER}?fieldManager=pulumi-kubernetes", apply,
                     content_type="application/apply-patch+yaml")


def test_7_the_run_that_needs_a_released_cluster_resumes_it_itself(heads, api):
    """The job provider resumes a suspended RayCluster once its run has begun (whatever the
    supervisor's settings), with the supervisor's field manager: one owner of spec.suspend."""
    url, state = api
    state.objects[RAY_CLUSTER]["spec"]["suspend"] = True
    props = job_props(heads["head"], url, QUICK, head_service="rc-head-svc")
    spec = _JobSpec.from_props(props)
    GrpoJobProvider().create(props)
    assert not released(state)
    (resume,) = [r for r in state.requests if r[0] == "PATCH" and RAY_CLUSTER in r[1]]
    assert resume[1].endswith("?fieldManager=verl-gke-run-supervisor") and resume[3]["spec"] == {"suspend": False}
    wait_for(lambda: status(heads["head"], spec.attempt_ids[0]) == "SUCCEEDED", 60, "the run's end")

    # A run that already succeeded is reported done without bringing the GPUs back.
    run_lifecycle.end(spec.records(), spec.run_key, run_lifecycle.SUCCEEDED, time.time(), released=True)
    state.objects[RAY_CLUSTER]["spec"]["suspend"] = True
    done = GrpoJobProvider().create(props)
    assert done.outs["status"] == "SUCCEEDED" and released(state)


def test_8_each_run_has_its_own_checkpoint_folder_and_a_finished_run_is_not_retrained(heads, api):
    base = load_config(BASE_CONFIG)
    run_id, _ = stack_run(base)

    def other(**changes: str) -> str:
        return stack_run(load_config({**BASE_CONFIG, **{f"verl-gke:{k}": v for k, v in changes.items()}}))[0]

    def verl(path: str, value: object) -> str:
        return other(verl=verl_value({path: value}))

    # What a checkpoint is valid for changes the run; where and how often it is written does not.
    others = [other(gpuNodes="4"), verl("actor_rollout_ref.actor.optim.lr", "2e-5"), other(modelRevision="1" * 40),
              other(datasetRevision="2" * 40), other(verlInImage="true", verlImage="example.com/me/verl@sha256:" + "0" * 64)]
    assert len({run_id, *others}) == 1 + len(others)
    assert other(jobAttempt="3") == verl("trainer.save_freq", 5) == verl("trainer.test_freq", 5) == run_id
    command = entrypoint(base.verl, run_id=run_id)
    assert f"trainer.default_local_dir=/data/verl/checkpoints/{run_id}" in command.split()

    # A run whose record says it succeeded is reported done when applied again, not trained again.
    url, _ = api
    props = job_props(heads["head"], url, QUICK)
    spec = _JobSpec.from_props(props)
    GrpoJobProvider().create(props)
    wait_for(lambda: status(heads["head"], spec.attempt_ids[0]) == "SUCCEEDED", 60, "the run's end")
    supervisor(heads["head"], url, spec).step()
    again = GrpoJobProvider().create({**props, "attempt": 0})
    assert (again.id, outs(again)["status"]) == (spec.attempt_ids[0], "SUCCEEDED")
    assert len(record(url, spec).attempts) == 1


def test_9_read_reports_the_newest_attempt_and_keeps_the_resource_when_the_head_is_unreachable(heads, api):
    url, _ = api
    head = heads["head"]
    props = job_props(head, url, SLEEP)
    spec = _JobSpec.from_props(props)
    provider = GrpoJobProvider()
    created = provider.create(props)
    RayJobs(head.dashboard_url).stop(created.id)
    wait_for(lambda: status(head, created.id) == "STOPPED", 30, "the stop")
    records = ConfigMapRecords(KubernetesApi(url), NAMESPACE, spec.record_name)
    attempt = Attempt(1, spec.attempt_ids[1], "supervisor", time.time(), "node-lost")
    rec, _ = run_lifecycle.claim(records, spec.run_key, attempt, 0)
    run_lifecycle.submit_claimed(RayJobs(head.dashboard_url), records, rec, attempt, spec.entrypoint, {})
    wait_for(lambda: status(head, spec.attempt_ids[1]) == "RUNNING", 60, "the supervisor's attempt to run")
    read = provider.read(created.id, outs(created))
    assert (read.id, outs(read)["submission_id"], outs(read)["status"]) == (created.id, spec.attempt_ids[1], "RUNNING")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    gone = f"http://127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    read = provider.read(created.id, {**outs(created), "dashboard_url": gone, "ready_timeout_s": 2})
    assert (read.id, outs(read)["submission_id"], outs(read)["status"]) == (created.id, spec.attempt_ids[1],
                                                                             "UNREACHABLE")
    stop_all(head, spec)
    assert json.loads(json.dumps(outs(read)))  # plain data for the engine
