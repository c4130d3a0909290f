"""One test per fault of issue "One owner per run", named after it: the GrpoJob provider and the run
supervisor's decider against real Ray processes on 127.0.0.1 (a head restart is a kill and a new head
on the same ports, as a KubeRay head pod restart without GCS fault tolerance) and the loopback
Kubernetes API stand-in (tests/kube_api.py) that keeps the run records, the Lease and the RayCluster.
Each scenario has a RayCluster (and so a Lease and records) of its own.

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
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import yaml

from components.grpo_job import GrpoJobProvider
from components.job_spec import JobSpec
from domain.config import ConfigError, load_config
from domain.grpo_spec import entrypoint
from domain.platforms import VERL_0_9_0
from domain.verl_wheel import config_dir
from domain.stack_run import stack_run
from tests.conftest import BASE_CONFIG, verl_value
from tests.kube_api import KubeApiStandIn, kube_api
from tests.ray_head import MULTI_NODE_ENV, RayHead, restart_head, start_head, stop_head
from workloads import run_lifecycle
from workloads.kube import KubernetesApi, RayClusterControl
from workloads.run_lifecycle import LIVE, Decider, RayJobs
from workloads.run_record import Attempt, RecordStore, RunRecord
from workloads.run_supervisor import SupervisorConfig, decider, run_forever

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

NAMESPACE = "ray"
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
    with kube_api() as found:
        yield found


def cluster_path(name: str) -> str:
    return f"/apis/ray.io/v1/namespaces/{NAMESPACE}/rayclusters/{name}"


def job_props(head: RayHead, api: tuple[str, KubeApiStandIn], entry: str, **extra: Any) -> dict[str, Any]:
    """Props of a stack of its own, on a RayCluster of its own (its records and Lease with it)."""
    url, state = api
    stack = f"t{uuid.uuid4().hex[:8]}"
    name = f"rc-{stack}"
    state.put_object(cluster_path(name), {
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name},
        "spec": {"workerGroupSpecs": [{"groupName": "gpu-group", "replicas": 1, "minReplicas": 1, "maxReplicas": 1}]}})
    return {"dashboard_url": head.dashboard_url, "kube_api_url": url, "namespace": NAMESPACE, "stack": stack,
            "head_service": f"{name}-head-svc", "run_record": f"{name}-run", "entrypoint": entry, "runtime_env": {},
            "startup_grace_s": 0, "ready_timeout_s": 60, "supervised_attempts": 3, **extra}


def supervisor(head: RayHead, api_url: str, spec: JobSpec, clock: Callable[[], float] = time.monotonic,
               **config: Any) -> Decider:
    settings = {"settle_s": 0.0, "poll_s": 0.2, "backoff_s": 1.0, "budget_grace_s": 0.0, "replace_window_s": 0.0,
                **config}
    return decider(SupervisorConfig(
        head_url=head.dashboard_url, submission_ids=spec.attempt_ids, entrypoint=spec.entrypoint,
        runtime_env=spec.runtime_env, expected_workers=spec.expected_workers, expected_gpus=spec.expected_gpus,
        run_id=spec.run_key, generation=spec.attempt, **settings), KubernetesApi(api_url), NAMESPACE,
        spec.ray_cluster, log=lambda _line: None, ray=RayJobs(head.dashboard_url), clock=clock)


@contextmanager
def supervising(running: Decider) -> Iterator[None]:
    """The supervisor stepping in the background, as in its pod (it hands the Lease to `pulumi up`)."""
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            try:
                running.step()
            except Exception:  # noqa: BLE001 - run_forever logs and goes on
                pass
            done.wait(0.2)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=60)


def records(api_url: str, spec: JobSpec) -> RecordStore:
    return RecordStore(KubernetesApi(api_url), NAMESPACE, spec.ray_cluster)


def record(api_url: str, spec: JobSpec) -> RunRecord | None:
    return records(api_url, spec).get(spec.run_key).record


def write(api_url: str, spec: JobSpec, change: Callable[[RunRecord | None], RunRecord]) -> RunRecord:
    store = records(api_url, spec)
    found = store.get(spec.run_key)
    written = store.write(found, change(found.record)).record
    assert written is not None
    return written


def live(head: RayHead, spec: JobSpec) -> list[str]:
    jobs = RayJobs(head.dashboard_url).jobs()
    return [sid for sid in spec.attempt_ids if sid in jobs and jobs[sid]["status"] in LIVE]


def status(head: RayHead, submission_id: str) -> str | None:
    job = RayJobs(head.dashboard_url).jobs().get(submission_id)
    return job["status"] if job else None


def released(state: KubeApiStandIn, spec: JobSpec) -> bool:
    """Whether the RayCluster is suspended (KubeRay then deletes its pods, GPU workers included)."""
    return bool(state.objects[cluster_path(spec.ray_cluster)]["spec"].get("suspend"))


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def stop_all(head: RayHead, spec: JobSpec) -> None:
    """Stops the run's live attempts and waits until they ended: a release waits while any job holds
    the workers, so a later test's would otherwise wait for this one's."""
    for sid in live(head, spec):
        RayJobs(head.dashboard_url).stop(sid)
    wait_for(lambda: not live(head, spec), 60, "the stopped attempts to end")


def outs(result: Any) -> dict[str, Any]:
    return dict(result.outs)


def test_1_head_restart_then_refresh_and_up_leave_one_live_attempt(heads, api):
    url, _ = api
    props = job_props(heads["head"], api, SLEEP)
    spec = JobSpec.from_props(props)
    provider = GrpoJobProvider()
    created = provider.create(props)
    # The Ray contract of every head restart here and on the stand-ins (tests/ray_jobs.py `restart`): a head
    # restarted without GCS fault tolerance knows none of its jobs.
    heads["head"] = restart_head(heads["head"])
    head = heads["head"]
    # The refresh keeps the resource: Pulumi does not forget it and run `create` beside the run.
    read = provider.read(created.id, outs(created))
    assert (read.id, outs(read)["status"]) == (created.id, "LOST")
    running = supervisor(head, url, spec)
    running.step()  # the supervisor resubmits the lost run
    assert live(head, spec) == [spec.attempt_ids[1]]
    # Even if `create` runs again (the supervisor hands it the Lease), it adopts the supervisor's attempt.
    with supervising(running):
        again = provider.create(props)
    assert again.id == spec.attempt_ids[1]
    assert live(head, spec) == [spec.attempt_ids[1]]
    assert [(a.index, a.by) for a in record(url, spec).attempts] == [(0, "pulumi-up"), (1, "supervisor")]
    stop_all(head, spec)


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


def test_3_a_truncated_reply_is_the_head_not_answering_and_no_step_error_ends_the_run(api):
    """No Ray head: the reply is cut short by a server of this test (a head restart with a supervisor
    restart is test_run_lifecycle::test_a_head_restart_with_a_supervisor_restart_..., on the stand-ins)."""
    url, _ = api
    nowhere = RayHead(None, "http://127.0.0.1:9", None)  # type: ignore[arg-type]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Truncated)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        spec = JobSpec.from_props(job_props(nowhere, api, SLEEP))
        broken = supervisor(nowhere, url, spec)
        broken.ray = RayJobs(f"http://127.0.0.1:{server.server_port}", timeout_s=5)
        lines: list[str] = []
        broken.log = lines.append
        write(url, spec, lambda _r: RunRecord(spec.run_key, attempts=(
            Attempt(0, spec.attempt_ids[0], "pulumi-up", "pulumi-up", submitted=True),)))
        pauses: list[float] = []
        run_forever(broken, poll_s=0.2, sleep=pauses.append, steps=3)
    finally:
        server.shutdown()
        server.server_close()
    # A truncated reply is the head not answering: the run stays open, the step goes on.
    assert len(lines) == 3 and all(line.startswith("run decider: the Ray head did not answer: IncompleteRead")
                                   for line in lines)
    assert not record(url, spec).outcome and record(url, spec).outage_s > 0 and pauses == [0.2, 0.2, 0.2]


def test_4_a_failed_deploy_and_a_jobattempt_bump_release_the_workers(heads, api):
    url, state = api
    # The release waits while any job holds the workers: the earlier tests' stops must have landed.
    wait_for(lambda: not [j for j in RayJobs(heads["head"].dashboard_url).jobs().values() if j["status"] in LIVE],
             120, "the earlier tests' jobs to end")
    props = job_props(heads["head"], api, SLEEP, expected_workers=1, expected_gpus=1, ready_timeout_s=3)
    spec = JobSpec.from_props(props)
    with pytest.raises(TimeoutError, match="not submitted within ready_timeout_s=3 s"):
        GrpoJobProvider().create(props)
    assert record(url, spec).outcome == run_lifecycle.DEPLOY_FAILED
    supervisor(heads["head"], url, spec).step()
    assert released(state, spec) and record(url, spec).released

    # A refused second run: the workers are released only once the other run no longer holds them.
    props = job_props(heads["head"], api, SLEEP)
    spec = JobSpec.from_props(props)
    other = f"verl-grpo-{props['stack']}-000000000000"
    RayJobs(heads["head"].dashboard_url).submit(other, SLEEP, {}, {})
    with pytest.raises(RuntimeError, match="another run or a model export of stack"):
        GrpoJobProvider().create(props)
    watcher = supervisor(heads["head"], url, spec)
    watcher.step()
    assert record(url, spec).outcome == run_lifecycle.DEPLOY_FAILED and not released(state, spec)
    RayJobs(heads["head"].dashboard_url).stop(other)
    wait_for(lambda: status(heads["head"], other) == "STOPPED", 30, "the other run's stop")
    watcher.step()
    assert released(state, spec) and record(url, spec).released

    # A cluster that never becomes whole ends the run at its bound, on the decider's own clock:
    # test_run_lifecycle::test_the_capacity_wait_is_bounded_by_its_accumulator (the message exactly).

    # A jobAttempt bump: `pulumi up` deploys the new generation's supervisor, then the job's replace
    # deletes the old generation (recording it) and creates the new one. An up that dies between the
    # two leaves the older record to the new supervisor, the only one left: it releases the workers.
    props = job_props(heads["head"], api, SLEEP)
    old = JobSpec.from_props(props)
    provider = GrpoJobProvider()
    created = provider.create(props)
    new = JobSpec.from_props({**props, "attempt": 1})
    provider.delete(created.id, outs(created))
    supervisor(heads["head"], url, new).step()
    assert record(url, old).outcome == run_lifecycle.DELETED
    assert released(state, old) and record(url, old).released

    # An up that fails before the replace leaves the older generation running, never resubmitted and
    # released once it ends: test_run_lifecycle::test_item3_variant_an_older_generation_left_by_a_failed_up_...


def test_5_budget_is_enforced_before_every_submission(heads, api):
    url, _ = api
    head = heads["head"]

    def failed_attempt(budget_s: float) -> JobSpec:
        spec = JobSpec.from_props(job_props(head, api, CRASH, budget_s=budget_s))
        attempt = Attempt(0, spec.attempt_ids[0], "pulumi-up", "pulumi-up",
                          dead_nodes=RayJobs(head.dashboard_url).capacity().dead)
        claimed = write(url, spec, lambda _r: run_lifecycle.claimed(RunRecord(spec.run_key, budget_s=budget_s),
                                                                    attempt))
        run_lifecycle.submit_attempt(RayJobs(head.dashboard_url), claimed, attempt, spec.entrypoint, {})
        wait_for(lambda: status(head, spec.attempt_ids[0]) == "FAILED", 60, "the attempt's failure")
        return spec

    # The budget spent (here, during the backoff): no attempt is submitted.
    spec = failed_attempt(budget_s=1)
    now = [0.0]
    watcher = supervisor(head, url, spec, clock=lambda: now[0], budget_s=1, max_retries=3, backoff_s=30.0)
    watcher.step()
    now[0] += 2
    watcher.step()
    assert record(url, spec).outcome == run_lifecycle.budget_spent(1)
    assert status(head, spec.attempt_ids[1]) is None

    # Refused where nothing would enforce the budget, or where its stop would lose the whole run.
    with pytest.raises(ConfigError) as caught:
        load_config({**BASE_CONFIG, "verl-gke:runBudgetHours": "6", "verl-gke:runSupervisor": "false",
                     "verl-gke:exportModel": "false",
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


def test_6_no_resubmission_after_a_delete(heads, api):
    url, state = api
    head = heads["head"]
    # Attempt 0 has a dead-node baseline: a later failure is judged against it.
    props = job_props(head, api, CRASH)
    spec = JobSpec.from_props(props)
    provider = GrpoJobProvider()
    created = provider.create(props)
    assert record(url, spec).attempts[0].dead_nodes == RayJobs(head.dashboard_url).capacity().dead
    wait_for(lambda: status(head, created.id) == "FAILED", 60, "the failure")
    now = [0.0]
    watcher = supervisor(head, url, spec, clock=lambda: now[0], backoff_s=30.0)
    watcher.step()  # in its backoff
    watcher.lease.release()  # (its pod is gone: `pulumi up` need not wait for its Lease to expire)
    provider.delete(created.id, outs(created))
    now[0] += 60
    watcher.step()
    assert status(head, spec.attempt_ids[1]) is None  # nothing submitted after the delete
    assert record(url, spec).outcome == run_lifecycle.DELETED and released(state, spec)

    # A replace that keeps the ids (delete, then create: attempt 1, opened at 1) is
    # test_run_lifecycle::test_item1_a_same_run_replace_keeps_its_gpus_and_its_run on the stand-ins; a delete
    # stopping a real job is test_grpo_job::test_delete_stops_a_running_job.


def test_7_pulumi_and_the_supervisor_never_own_the_same_field(api):
    url, state = api
    kube = KubernetesApi(url)
    props = job_props(RayHead(None, "http://127.0.0.1:9", None), api, "e")  # type: ignore[arg-type]
    path = cluster_path(JobSpec.from_props(props).ray_cluster)
    name = path.rsplit("/", 1)[1]
    # A strategic merge patch of a custom resource is refused, as by the real API server.
    with pytest.raises(Exception, match="415"):
        kube.request("PATCH", path, {"spec": {}}, content_type="application/strategic-merge-patch+json")

    # Someone else writes the RayCluster between the decider's read and its patch: 409, read again.
    class Racing(KubernetesApi):
        raced = False

        def request(self, method: str, path_: str, body: Any = None, content_type: str = "application/json") -> Any:
            if method == "PATCH" and not self.raced:
                self.raced = True
                state.put_object(path, {**state.get(path), "spec": {"workerGroupSpecs": [
                    {"groupName": "gpu-group", "replicas": 1, "minReplicas": 1, "maxReplicas": 1},
                    {"groupName": "added", "replicas": 3}]}})
            return super().request(method, path_, body, content_type)

    RayClusterControl(Racing(url), NAMESPACE, name).set_suspended(True)
    spec_now = state.objects[path]["spec"]
    assert spec_now["suspend"] is True  # the patch made again from the fresh read
    assert [(g["groupName"], g["replicas"]) for g in spec_now["workerGroupSpecs"]] == [("gpu-group", 1), ("added", 3)]
    patches = [r for r in state.requests if r[0] == "PATCH" and r[2].get("Content-Type") == "application/merge-patch+json"]
    assert len(patches) == 2 and all(p[3]["metadata"]["resourceVersion"] for p in patches)
    assert all(set(p[3]["spec"]) == {"suspend"} for p in patches)  # nothing but its own field

    # A later `pulumi up` applies the program's RayCluster, which never names spec.suspend: with or
    # without force (Pulumi's patchForce) the released cluster stays released.
    apply = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name}, "spec": {
        "rayVersion": "2.49.0",
        "workerGroupSpecs": [{"groupName": "gpu-group", "replicas": 1, "minReplicas": 1, "maxReplicas": 1}]}}
    kube.request("PATCH", f"{path}?fieldManager=pulumi-kubernetes", apply, content_type="application/apply-patch+yaml")
    kube.request("PATCH", f"{path}?fieldManager=pulumi-kubernetes&force=true", apply,
                 content_type="application/apply-patch+yaml")
    assert state.objects[path]["spec"]["suspend"] is True and state.objects[path]["spec"]["rayVersion"] == "2.49.0"
    # Were the program ever to send the field, the API server would refuse it as the supervisor's.
    with pytest.raises(Exception, match="409"):
        kube.request("PATCH", f"{path}?fieldManager=pulumi-kubernetes",
                     {**apply, "spec": {**apply["spec"], "suspend": False}}, content_type="application/apply-patch+yaml")

    # Why the release is not a replica count: the worker group list is one atomic field, so a merge
    # patch of one group's replicas takes the whole list, and the program's next apply conflicts on it.
    kube.request("PATCH", f"{path}?fieldManager=kubectl-edit", {"spec": {"workerGroupSpecs": [
        {"groupName": "gpu-group", "replicas": 0, "minReplicas": 0, "maxReplicas": 1}]}},
        content_type="application/merge-patch+json")
    with pytest.raises(Exception, match="409"):
        kube.request("PATCH", f"{path}?fieldManager=pulumi-kubernetes", apply, content_type="application/apply-patch+yaml")


def test_7_the_run_that_needs_a_released_cluster_resumes_it_itself(heads, api):
    """The job provider resumes a suspended RayCluster once its run has begun (whatever the
    supervisor's settings), with the decider's field manager: one owner of spec.suspend."""
    url, state = api
    props = job_props(heads["head"], api, QUICK)
    spec = JobSpec.from_props(props)
    path = cluster_path(spec.ray_cluster)
    state.objects[path]["spec"]["suspend"] = True
    GrpoJobProvider().create(props)
    assert not released(state, spec)
    (resume,) = [r for r in state.requests if r[0] == "PATCH" and path in r[1]]
    assert resume[1].endswith("?fieldManager=verl-gke-run-supervisor") and resume[3]["spec"] == {"suspend": False}
    wait_for(lambda: status(heads["head"], spec.attempt_ids[0]) == "SUCCEEDED", 60, "the run's end")

    # A run whose record says it succeeded (as the supervisor read it from the head) is reported done
    # when applied again: not trained again, and the GPUs not brought back.
    watcher = supervisor(heads["head"], url, spec)
    watcher.step()
    watcher.lease.release()
    assert record(url, spec).outcome == run_lifecycle.SUCCEEDED and released(state, spec)
    done = GrpoJobProvider().create({**props, "attempt": 0})
    assert (done.id, outs(done)["status"]) == (spec.attempt_ids[0], "SUCCEEDED") and released(state, spec)
    assert len(record(url, spec).attempts) == 1


def test_8_each_run_has_its_own_checkpoint_folder():
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


def test_9_read_reports_the_newest_attempt_and_keeps_the_resource_when_the_head_is_unreachable(heads, api):
    url, _ = api
    head = heads["head"]
    props = job_props(head, api, SLEEP)
    spec = JobSpec.from_props(props)
    provider = GrpoJobProvider()
    created = provider.create(props)
    RayJobs(head.dashboard_url).stop(created.id)
    wait_for(lambda: status(head, created.id) == "STOPPED", 30, "the stop")
    attempt = Attempt(1, spec.attempt_ids[1], "supervisor", "node-lost")
    claimed = write(url, spec, lambda r: run_lifecycle.claimed(r, attempt))
    run_lifecycle.submit_attempt(RayJobs(head.dashboard_url), claimed, attempt, spec.entrypoint, {})
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
