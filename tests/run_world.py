"""A cluster in one process for the run lifecycle's interleaving tests: the Kubernetes API stand-in
(tests/kube_api.py: records, the Lease, the RayCluster with KubeRay's atomic suspend) linked to the Ray
job-table stand-in (tests/ray_jobs.py: a suspended cluster has no head), and the processes that
decide, each with a monotonic clock of its own (another rate, another origin): supervisors
(workloads/run_supervisor.decider, the real program) and `pulumi up`'s create and delete
(workloads/run_lifecycle.create_run and delete_run, the provider's real steps), advanced one step at
a time so that any interleaving, and a crash after any write, can be played."""

from __future__ import annotations

import http.client
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from domain.run_identity import submission_ids
from tests.kube_api import InProcessApi, KubeApiStandIn
from tests.ray_jobs import RayHeadStandIn
from verl_gke.stack_outputs import StackOutputs
from workloads.kube import Conflict, Invalid, RayClusterControl
from workloads.run_lease import LEASE_WAIT_S, PULUMI_UP, RENEW_EVERY_S, Lease, LeaseLost
from workloads.run_lifecycle import (
    Created,
    SUCCEEDED,
    Decider,
    RayJobs,
    Refused,
    RunSpec,
    create_run,
    delete_run,
    fail_start,
    meta,
)
from workloads.run_record import RECORD_KEY, Gone, RecordStore
from workloads.run_supervisor import SupervisorConfig, decider

NS, RC = "ray", "rc"
RC_PATH = f"/apis/ray.io/v1/namespaces/{NS}/rayclusters/{RC}"
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{RC}-decider"
WORKERS, GPUS = 2, 8
IDS = 4
"""Submission ids per generation: attempt 0 and three more (max_retries 1 + max_preemptions 2)."""
HEAD_OUTAGE_S = 900.0
"""runHeadOutageSeconds of the world's supervisors."""
OUTPUTS = StackOutputs(
    source="the exploration", cluster_name="c", cluster_location="l", namespace=NS, ray_head_service=f"{RC}-head-svc",
    grpo_submission_id="", grpo_job_status=None, dashboard_command="", checkpoint_uri="", gpu_platform="a4",
    gpu_nodes=2, gpus_per_node=8, cluster_endpoint=None, cluster_ca_certificate=None)
"""What `verl-gke stop` reads of the stack: where the records are."""
START_STEPS = 3
FAULTS = (OSError, http.client.HTTPException, Conflict, Invalid, Gone, LeaseLost)
"""What the world's faults raise (and nothing else): an API server or head that does not answer (URLError,
HTTPError, timeouts are OSErrors), the API's 409/422/404, a Lease that ran out in a step. Any other
exception is a bug that the exploration reports."""


class StartFailed(RuntimeError):
    """The provider's start-up grace saw its job fail (the create fails, as GrpoJobProvider's does)."""
"""How many looks `create` takes at a job it submitted before it calls it started or gives up."""


class Clock:
    """A process's monotonic clock: its own origin and rate (within 1%, as NTP keeps them)."""

    def __init__(self, world: World, rate: float, origin: float) -> None:
        self.world, self.rate, self.origin = world, rate, origin

    def __call__(self) -> float:
        return self.origin + self.rate * self.world.t


def run_spec(run_id: str, generation: int, budget_s: float = 0.0) -> RunSpec:
    ids = tuple(submission_ids("s", f"train {run_id}", {}, generation, IDS))  # one stack, one id prefix
    return RunSpec(run_id=run_id, generation=generation, submission_ids=ids, entrypoint=f"train {run_id}",
                   runtime_env={}, budget_s=budget_s)


@dataclass
class Provider:
    """One `pulumi up` create or delete in flight: its steps, its Lease, its clock."""

    kind: str
    run: RunSpec
    lease: Lease
    steps: Iterator[str]
    last_renew: float = 0.0


@dataclass
class World:
    kube: KubeApiStandIn = field(default_factory=KubeApiStandIn)
    head: RayHeadStandIn = field(default_factory=lambda: RayHeadStandIn(workers=WORKERS, gpus_per_worker=GPUS))
    t: float = 0.0
    link_up: bool = True
    """The network to the head (a port-forward, a NetworkPolicy): independent of its pods."""
    pods: bool = True
    api_down: bool = False
    fail_next: list[int] = field(default_factory=list)
    supervisors: dict[int, Decider] = field(default_factory=dict)
    configs: dict[int, SupervisorConfig] = field(default_factory=dict)
    provider: Provider | None = None
    desired: RunSpec = field(default_factory=lambda: run_spec("run-a", 0))
    """The run the stack names now (its supervisor config, its GrpoJob)."""
    budget_s: float = 0.0
    log: list[str] = field(default_factory=list)
    exported: set[str] = field(default_factory=set)
    counter: Iterator[int] = field(default_factory=itertools.count)
    runs: dict[str, RunSpec] = field(default_factory=dict)
    suspended_under: list[str] = field(default_factory=list)
    """Jobs live when a suspend (the decider's only way to delete the pods) took their head."""
    lost_under: list[str] = field(default_factory=list)
    """The same past the stated bound: a head that did not answer a supervisor for runHeadOutageSeconds."""
    answered_at: float = 0.0
    """When the head last answered a supervisor's request (supervisor_steps sets it)."""
    head_calls: int = 0
    """Requests the head answered."""
    by_hand: bool = False
    cut: set[str] = field(default_factory=set)
    """Processes cut off from the API server (a partition, a node gone NotReady with its pod on it)."""
    bad_stops: list[str] = field(default_factory=list)
    """Attempts stopped while their run's record gave no reason to (a budget, the stack, a stall, a
    start that failed)."""
    unheld: list[str] = field(default_factory=list)
    """Writes (records, the RayCluster) a supervisor or `pulumi up` sent while the Lease in the API named
    another holder or none (deleted): a decider acts only on a Lease it has read back."""
    undeleted: list[str] = field(default_factory=list)
    """Runs a `pulumi up` delete reported done while their attempt still ran or their record was open, or a
    create reported done with no attempt of them running or succeeded."""
    busy_submits: int = 0
    """The head answers this many more submissions 500 "No available agent to submit job" (its job agent
    still starting, what Ray's job_head.py answers then): submit_attempt retries them."""
    on_sleep: list[Callable[[], None]] = field(default_factory=list)
    """What happens during each coming sleep of a process (one each, in order): a takeover mid-retry."""
    sleeping: bool = False
    _listed: tuple[list[tuple[str, Any, Any]], dict[str, Any]] = field(default_factory=lambda: ([], {}), repr=False)

    def __post_init__(self) -> None:
        self.kube.on_head = self._pods
        handle = self.head.handle

        def watched(method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
            self.head_calls += 1
            if method == "POST" and path == "/api/jobs/" and self.busy_submits > 0:
                self.busy_submits -= 1
                return 500, b"No available agent to submit job, please try again later."
            if method == "POST" and path.endswith("/stop"):
                self._judge_stop(path.split("/")[-2])
            return handle(method, path, body)

        self.head.handle = watched  # type: ignore[method-assign]
        self.kube.handle("POST", f"/apis/ray.io/v1/namespaces/{NS}/rayclusters", {}, {
            "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": RC, "namespace": NS},
            "spec": {"workerGroupSpecs": [{"groupName": "gpu", "replicas": WORKERS}]}})
        self.runs[self.desired.run_id + f"/{self.desired.generation}"] = self.desired

    # --- the world --------------------------------------------------------------------------------

    def _pods(self, path: str, alive: bool) -> None:
        if path != RC_PATH:
            return
        if not alive and not self.by_hand:
            # The world's own count, not the records' (a released record counts nothing while another waits):
            # the head has not answered a supervisor for the bound, on the fastest clock (1%).
            past_bound = not self.link_up and (self.t - self.answered_at) * 1.01 >= HEAD_OUTAGE_S
            (self.lost_under if past_bound else self.suspended_under).extend(self.head.live())
        self.pods = alive
        # Pods deleted: the head and its job table go, workers too; created: a new, empty head.
        self.head.restart()
        self.head.workers = WORKERS if alive else 0
        self._head_reach()

    def _head_reach(self) -> None:
        self.head.up = self.pods and self.link_up

    def set_link(self, up: bool) -> None:
        self.link_up = up
        self._head_reach()

    def api(self, process: str = "") -> Any:
        """A process's own connection to the API server: down for everyone, or cut for it alone."""
        world = self
        api = InProcessApi(self.kube)
        send = api.send

        def faulty(method: str, path: str, data: bytes | None, headers: dict[str, str]) -> tuple[int, Any]:
            if world.api_down or process in world.cut:
                import urllib.error

                raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
            # 409 and 422 answer writes only; 404 a write or a read of an object deleted meanwhile.
            if method != "GET" and "/leases" not in path:
                world._judge_write(process, method, path)
            if world.fail_next and (method != "GET" or world.fail_next[0] in (404, 500)):
                api.fail_next.append(world.fail_next.pop(0))
            return send(method, path, data, headers)

        api.send = faulty  # type: ignore[method-assign]
        return api

    def clock(self, skew: int) -> Clock:
        """Process clocks: origins far apart, rates within 1% (skew picks one)."""
        rates = (1.0, 0.99, 1.01, 0.995)
        return Clock(self, rates[skew % len(rates)], 10_000.0 * (skew + 1) - 3_000.0 * (skew % 3))

    def passes(self, seconds: float) -> None:
        while seconds > 0:
            chunk = min(seconds, RENEW_EVERY_S)
            seconds -= chunk
            self.t += chunk
            self.head.now += chunk
            self._renew()
        self.head.tick()
        self.kube.reconcile()

    def _renew(self) -> None:
        """`pulumi up`'s renewing thread: every RENEW_EVERY_S while it holds the Lease."""
        provider = self.provider
        if provider is None:
            return
        now = provider.lease.clock()
        if provider.lease.valid() and now - provider.last_renew >= RENEW_EVERY_S:
            try:
                provider.lease.renew()
                provider.last_renew = now
            except FAULTS:  # the thread logs it and tries again
                pass

    def ray(self, process: str) -> RayJobs:
        """A process's head client: its submissions and stops are judged like its API writes."""
        client = self.head.client()
        send = client.send

        def judged(method: str, path: str, data: bytes | None, content_type: str) -> tuple[bytes, str | None]:
            if method == "POST" and (path == "/api/jobs/" or path.endswith("/stop")):
                self._judge_write(process, method, path)
            return send(method, path, data, content_type)

        client.send = judged  # type: ignore[method-assign]
        return client

    def sleeper(self, process: str) -> Callable[[float], None]:
        """A process's sleep (submit_attempt's between retries): the world's time passes, and every other
        supervisor takes a step meanwhile (a sleep within that step only lets time pass)."""

        def sleep(seconds: float) -> None:
            self.passes(seconds)
            if self.sleeping:
                return
            self.sleeping = True
            try:
                if self.on_sleep:
                    self.on_sleep.pop(0)()
                for slot in sorted(self.supervisors):
                    if f"supervisor {slot}" != process:
                        self.step_supervisor(slot)
            finally:
                self.sleeping = False

        return sleep

    def step_supervisor(self, slot: int) -> bool:
        """One step of the supervisor in `slot`; an injected fault fails the step (run_forever retries it)."""
        decider, calls = self.supervisors[slot], self.head_calls
        decided = False
        try:
            decided = decider.step()
        except FAULTS as error:  # anything else is a bug: the exploration fails
            self.log.append(f"supervisor {slot}: step failed: {error!r}")
        if self.head_calls > calls:
            self.answered_at = self.t
        return decided

    # --- the stack's processes --------------------------------------------------------------------

    def start_supervisor(self, slot: int, skew: int) -> None:
        """A new supervisor process in `slot` (a restart, a second replica, a rollout's new pod)."""
        run = self.desired
        config = SupervisorConfig(
            head_url="http://head", submission_ids=list(run.submission_ids), entrypoint=run.entrypoint,
            runtime_env={}, expected_workers=WORKERS, expected_gpus=WORKERS * GPUS, run_id=run.run_id,
            generation=run.generation, max_retries=1, max_preemptions=2, backoff_s=30.0, budget_s=self.budget_s,
            budget_grace_s=60.0, settle_s=15.0, capacity_timeout_s=600.0, head_outage_s=HEAD_OUTAGE_S, stall_s=0.0,
            replace_window_s=120.0, poll_s=15.0,
            export={"checkpoint_dir": f"/data/ck/{run.run_id}", "mount": "/data", "memory_bytes": 1})
        clock = self.clock(skew)
        self.configs[slot] = config
        self.supervisors[slot] = decider(config, self.api(f"supervisor {slot}"), NS, RC, log=self.log.append,
                                         ray=self.ray(f"supervisor {slot}"), clock=clock,
                                         sleep=self.sleeper(f"supervisor {slot}"))
        self.supervisors[slot].lease.holder = f"supervisor/pod-{slot}/{next(self.counter)}"

    def start_provider(self, kind: str, skew: int, run: RunSpec | None = None) -> None:
        self.log.append(f"pulumi up: {kind} {(run or self.desired).run_id}/{(run or self.desired).generation}")
        run = run or self.desired
        lease = Lease(self.api("pulumi up"), NS, RC, f"{PULUMI_UP}/laptop/{next(self.counter)}", clock=self.clock(skew),
                      log=self.log.append)
        records = RecordStore(lease.api, NS, RC)
        self.provider = Provider(kind, run, lease, self._provider_steps(kind, run, lease, records))

    def _provider_steps(self, kind: str, run: RunSpec, lease: Lease, records: RecordStore) -> Iterator[str]:
        yield from lease.acquiring(LEASE_WAIT_S)
        yield "acquired"
        ray = self.ray("pulumi up")

        def reach() -> RayJobs:
            RayClusterControl(lease.api, NS, RC).set_suspended(False)
            # The provider waits for the head (ready_timeout_s): KubeRay finishes a suspend under way
            # (the head goes, whatever spec.suspend says now), then brings the pods back.
            for _ in range(3):
                self.kube.reconcile()
            if not self.head.up:
                raise OSError("Ray head not reachable")
            return ray

        if kind == "delete":
            yield from delete_run(records, lease, run, reach)
            return
        created: Created = yield from create_run(records, lease, run, reach, lambda: None, clock=lease.clock,
                                                 sleep=self.sleeper("pulumi up"))
        if created.done or created.job is not None:
            return
        # The start-up grace: a job that fails first fails the create (its attempt stays in the record);
        # one still PENDING after it is given up on.
        for _ in range(START_STEPS):
            yield "waiting for the start"
            job = ray.jobs().get(created.submission_id)
            if job is not None and job["status"] in ("FAILED", "STOPPED"):
                raise StartFailed(f"{created.submission_id} {job['status']} while starting")
            if job is not None and job["status"] in ("RUNNING", "SUCCEEDED"):
                return
        yield from fail_start(records, lease, ray, run.run_id, created.submission_id)
        raise StartFailed(f"{created.submission_id} did not start")

    def provider_step(self) -> str:
        """One step of `pulumi up`; its renewing thread renews when due. 'done', 'failed' or the step."""
        provider = self.provider
        assert provider is not None
        try:
            return next(provider.steps)
        except StopIteration:
            if provider.kind == "delete":
                record = self.records().get(provider.run.run_id)
                live = [sid for sid in self.head.live() if sid in provider.run.submission_ids]
                if live or (record is not None and not record.outcome):
                    self.undeleted.append(f"{provider.run.run_id}: live {live}, record {record}")
            if provider.kind == "create":
                record = self.records().get(provider.run.run_id)
                ran = [sid for sid, job in self.head.jobs.items() if sid in provider.run.submission_ids
                       and job["status"] in ("PENDING", "RUNNING", "SUCCEEDED")]
                if record is None or (record.outcome != SUCCEEDED and (record.outcome or not ran)):
                    self.undeleted.append(f"{provider.run.run_id}: created, yet nothing of it ran: {record}")
            provider.lease.release()
            self.provider = None
            return "done"
        except (*FAULTS, Refused, StartFailed) as error:  # a failed `pulumi up`: its Lease is released
            self.log.append(f"pulumi up failed: {error}")
            provider.lease.release()
            self.provider = None
            return "failed"

    # --- what the promises look at -----------------------------------------------------------------

    def _judge_stop(self, submission_id: str) -> None:
        if self.provider is not None and self.provider.kind == "delete":
            return  # the stack's delete: desired stopped, whatever the record says
        owner = self.owner(submission_id)
        job = self.head.jobs.get(submission_id)
        if owner is None or job is None or job["status"] not in ("PENDING", "RUNNING"):
            return
        record = self.records().get(owner.run_id)
        reasons = record is not None and (
            record.desired == "stopped"
            or (record.outcome is not None and record.outcome.reason in ("BudgetSpent", "DeployFailed", "HeadOutage"))
            or any(a.stopped_for for a in record.attempts if a.submission_id == submission_id)
            or record.generation != owner.generation)
        if not reasons:
            self.bad_stops.append(f"{submission_id}: {record}")

    def _judge_write(self, process: str, method: str, path: str) -> None:
        if process.startswith("supervisor "):
            decider = self.supervisors.get(int(process.split()[1]))
            mine = decider.lease.holder if decider is not None else None
        elif process == "pulumi up" and self.provider is not None:
            mine = self.provider.lease.holder
        else:
            return  # `verl-gke stop` writes only the record's desired state, without the Lease
        lease = self.kube.objects.get(LEASE_PATH)
        holder = ((lease or {}).get("spec") or {}).get("holderIdentity") or ""
        if holder != mine:
            self.unheld.append(f"{process} {method} {path} while the Lease names {holder or 'nobody'}")

    def owner(self, submission_id: str) -> RunSpec | None:
        return next((r for r in self.runs.values() if submission_id in r.submission_ids), None)

    def live_attempts(self) -> list[str]:
        return [sid for sid in self.head.live() if self.owner(sid) is not None]

    def records(self) -> dict[str, Any]:
        """RecordStore.list's answer, listed again only when a ConfigMap changed: a write (its
        resourceVersion) or a hand edit of its text (the promises read the records after every step;
        listing and parsing them each time was a third of the exploration's CPU)."""
        seen = [(path, obj["metadata"].get("resourceVersion"), (obj.get("data") or {}).get(RECORD_KEY))
                for path, obj in self.kube.objects.items() if "/configmaps/" in path]
        if seen != self._listed[0]:
            self._listed = (seen, {s.run_id: s.record
                                   for s in RecordStore(InProcessApi(self.kube), NS, RC).list().values()})
        return dict(self._listed[1])

    def suspended(self) -> bool | None:
        cluster = self.kube.objects.get(RC_PATH)
        return None if cluster is None else bool((cluster.get("spec") or {}).get("suspend"))

    def deciders(self) -> list[str]:
        """Every process that may act now: by its own clock, on the Lease in the API that names it (each
        action reads it back first; `unheld` catches an action that did not)."""
        leases = [(f"supervisor {slot}", d.lease) for slot, d in self.supervisors.items()]
        if self.provider is not None:
            leases.append(("pulumi up", self.provider.lease))
        holder = ((self.kube.objects.get(LEASE_PATH) or {}).get("spec") or {}).get("holderIdentity")
        return [name for name, lease in leases if lease.valid() and lease.holder == holder]

    def job_run(self, submission_id: str) -> tuple[str, str]:
        job = self.head.jobs[submission_id]
        return meta(job, "run_id"), meta(job, "generation")
