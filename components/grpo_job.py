"""GrpoJob: the tutorial's `ray job submit ... python3 -m verl.trainer.main_ppo` as a resource.

A Pulumi dynamic provider that submits the run once the cluster is whole, under a submission id
derived from the stack and a hash of the job spec, and adopts a job already under that id, so
`pulumi up` twice never starts two runs. Pickled by reference to this module (so stateless; the
components/job_*.py it uses load from the install); Ray imported inside its methods; ints arrive as
floats, unknowns in check/diff during preview; the default `update` would drop the outputs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, NotRequired, Required, TypedDict

import pulumi
import pulumi.dynamic

from access.head_access import HeadAccessError, HeadGoneError, HeadRequestError
from components import job_gates, job_head, job_lease, job_polling, provider_reference
from components.job_spec import DEFAULTS, OUTPUT_KEYS, SPEC_KEYS, JobSpec, is_unknown, problems, spec_props
from domain.run_identity import whole_numbers
from workloads import run_lifecycle
from workloads.run_lifecycle import SUCCEEDED, RayJobs
from workloads.run_lease import HeldLease, Lease
from workloads.run_record import MemoryRecords, RecordStore

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

LOST = "LOST"
"""Status when the head answers but no longer knows the run's newest attempt (it restarted)."""
UNREACHABLE = "UNREACHABLE"
"""Status when the head does not answer a refresh: the resource is kept, its last status unknown."""
# What the run is, and where it runs: a new cluster or head needs a new submission on it. How the head
# is reached (dashboard_url, cluster_endpoint, the CA) is not where it runs: an update, the run goes on.
_REPLACE_KEYS = ("entrypoint", "runtime_env", "attempt", "cluster_name", "namespace", "head_service")


class GrpoJobArgs(TypedDict, total=False):
    """Inputs of a GrpoJob; all but `entrypoint` and `runtime_env` have defaults (see components/job_spec.py)."""

    entrypoint: Required[pulumi.Input[str]]
    """The full shell command the Ray job runs (the verl trainer invocation)."""
    runtime_env: Required[pulumi.Input[Mapping[str, Any]]]
    """The Ray runtime_env dict (env_vars for NCCL, HF_HOME, ...)."""
    dashboard_url: NotRequired[pulumi.Input[str | None]]
    """A privately reachable dashboard (http://host:8265); no port-forward when set. Like the endpoint
    and the CA, a change updates the resource: the run goes on."""
    cluster_endpoint: NotRequired[pulumi.Input[str | None]]
    """GKE cluster endpoint, for the port-forward through the Kubernetes API."""
    cluster_ca_certificate: NotRequired[pulumi.Input[str | None]]
    """GKE cluster CA certificate (base64), for the port-forward."""
    cluster_name: NotRequired[pulumi.Input[str | None]]
    """GKE cluster name, for the port-forward's kubeconfig."""
    namespace: NotRequired[pulumi.Input[str]]
    """Namespace of the Ray head service."""
    head_service: NotRequired[pulumi.Input[str | None]]
    """The RayCluster's head service (`<cluster>-head-svc`)."""
    stack: NotRequired[pulumi.Input[str]]
    """Stack name, part of the submission id."""
    ready_timeout_s: NotRequired[pulumi.Input[float]]
    """How long `create` waits for the dashboard to answer (the head pod may still be scheduling)."""
    wait_for_completion: NotRequired[pulumi.Input[bool]]
    """When true, `create` returns only when the run ends, and fails unless it SUCCEEDED."""
    completion_timeout_s: NotRequired[pulumi.Input[float]]
    """With wait_for_completion: how long the run may take."""
    poll_interval_s: NotRequired[pulumi.Input[float]]
    """With wait_for_completion: seconds between status polls."""
    outage_window_s: NotRequired[pulumi.Input[float]]
    """With wait_for_completion: how long the head may stay unreachable before the wait fails."""
    metadata: NotRequired[pulumi.Input[Mapping[str, str] | None]]
    """Ray job metadata (string to string)."""
    attempt: NotRequired[pulumi.Input[int]]
    """Bump to run an unchanged spec again under a new submission id (default 0)."""
    startup_grace_s: NotRequired[pulumi.Input[float]]
    """`create` returns once the job has been RUNNING this long (0: as soon as it runs)."""
    expected_workers: NotRequired[pulumi.Input[int]]
    """GPU workers that must be alive in the Ray cluster before the job is submitted (0: no gate)."""
    expected_gpus: NotRequired[pulumi.Input[int]]
    """GPUs Ray must see among them (gpuNodes x gpusPerNode), within ready_timeout_s."""
    fabric_check: NotRequired[pulumi.Input[bool]]
    """Before submitting, all-reduce across the expected workers' GPUs (access.fabric) and fail
    below fabric_min_busbw_gbps; the figure becomes the `fabric_busbw_gbps` output."""
    fabric_min_busbw_gbps: NotRequired[pulumi.Input[float]]
    """The bus bandwidth floor in GB/s (0: measure and report only)."""
    fabric_backend: NotRequired[pulumi.Input[str]]
    """`nccl` on GPUs; `gloo` runs the same check on CPUs."""
    fabric_python: NotRequired[pulumi.Input[str]]
    """The Python that runs the check on the head (the image's python3)."""
    fabric_runtime_env: NotRequired[pulumi.Input[Mapping[str, Any]]]
    """The check's Ray runtime env (access.fabric.fabric_runtime_env: the platform's NCCL settings)."""
    fabric_timeout_s: NotRequired[pulumi.Input[float]]
    """How long the check may take (placement, NCCL set-up, the all-reduces) before it is stopped."""
    fabric_transports: NotRequired[pulumi.Input[Sequence[str]]]
    """NCCL transports the check must see between nodes (Platform.fabric_transports); fails on any other
    `NET/...` such as NET/Socket."""
    budget_s: NotRequired[pulumi.Input[float]]
    """The run's budget from its submission (0: none): the deadline goes into the job's metadata and
    into verl's MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP, so verl checkpoints before it;
    the run supervisor stops the run there."""
    supervised_attempts: NotRequired[pulumi.Input[int]]
    """Attempts the run supervisor may submit after this one: a live one of them is adopted."""
    run_id: NotRequired[pulumi.Input[str | None]]
    """The run (domain/run_identity.run_id): its record and checkpoint folder. Default: the
    submission id of the spec's attempt 0."""
    run_record: NotRequired[pulumi.Input[str | None]]
    """`<rayClusterName>-run`: the prefix of the run records in `namespace` (one ConfigMap per run,
    `<prefix>-<12 hex>`), and so the RayCluster whose Lease says who decides (default: the head
    service's RayCluster, else `verl-grpo-<stack>`)."""
    kube_api_url: NotRequired[pulumi.Input[str | None]]
    """The Kubernetes API the record is kept through when it is reached without credentials
    (`kubectl proxy`, a test's stand-in). Default: the cluster endpoint with the CA and a token of
    gke-gcloud-auth-plugin; with neither, the record lives only for the call (docs/architecture.md, "The run")."""


def planned_outs(props: Mapping[str, Any], unknown: str) -> dict[str, Any]:
    """The outputs a create with these props would return, for an offline synth (no head): the
    run's status and the fabric figure are `unknown`."""
    spec = JobSpec.from_props(spec_props(props))
    return spec.outs(spec.submission_id, unknown, unknown if spec.fabric_check else None)


def _differs(key: str, old: Any, new: Any) -> bool:
    """Whether a prop changed, comparing effective values (defaults applied, floats cast)."""
    if is_unknown(new):
        return True

    def effective(value: Any) -> Any:
        return DEFAULTS[key] if value is None else whole_numbers(value)

    return bool(effective(old) != effective(new))


class GrpoJobProvider(pulumi.dynamic.ResourceProvider):
    """Submits, adopts, refreshes and stops the GRPO Ray job."""

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.CheckResult:
        failures = [pulumi.dynamic.CheckFailure(key, reason) for key, reason in problems(news)]
        if (lowered := _lowered_attempt(olds, news)) is not None:
            # Refused here, before the replace's delete stops the live run: the older generation's
            # supervisor would not watch the newer one's record, nor release it.
            failures.append(pulumi.dynamic.CheckFailure("attempt", lowered))
        return pulumi.dynamic.CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.DiffResult:
        replaces = [key for key in _REPLACE_KEYS if _differs(key, olds.get(key), news.get(key))]
        changed = provider_reference.moved(olds, news) or any(
            _differs(key, olds.get(key), news.get(key)) for key in SPEC_KEYS)
        if not replaces and _deleted_under_the_state(olds):
            # A targeted `up` deleted the job through a replace cascade and kept its old state: submit again.
            replaces, changed = ["status"], True
        # The old run holds the GPUs: stop it before the new one is submitted.
        return pulumi.dynamic.DiffResult(changes=changed, replaces=replaces, delete_before_replace=True)

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        """Takes the cluster's Lease (the supervisor hands it over), begins or reopens the run, resumes
        the cluster, runs the deploy gates, submits (or adopts) the run's attempt, watches its start-up
        grace, and releases the Lease. A create that dies anywhere leaves the record to the next
        decider: its Lease expires and the supervisor goes on by the same rules."""
        spec = JobSpec.from_props(props)
        records, lease = job_lease.records(spec), job_lease.lease(spec)
        lease.acquire()
        with lease.renewing():
            submission_id, status, busbw = _create(spec, records, lease)
        if spec.wait_for_completion and status != "SUCCEEDED":
            submission_id, status = job_polling.await_completion(spec, records, submission_id)
        record = records.get(spec.run_key).record
        exported = record.export_outcome if record is not None else ""
        return pulumi.dynamic.CreateResult(submission_id, spec.outs(submission_id, status, busbw, exported))

    def read(self, id_: str, props: dict[str, Any]) -> pulumi.dynamic.ReadResult:
        """The run's newest attempt and its status, from the record and the head; writes nothing."""
        spec = JobSpec.from_props(spec_props(props))
        previous = props.get("fabric_busbw_gbps")
        try:
            record = job_lease.records(spec).get(spec.run_key).record
        except Exception as error:  # noqa: BLE001 - a refresh reports, it never fails the stack
            pulumi.log.warn(f"GrpoJob {id_}: run record not readable: {error}")
            record = None
        exported = record.export_outcome if record else ""
        newest = record.attempts[-1].submission_id if record and record.attempts else None
        if record is not None and record.released:
            # Ended and its RayCluster suspended: no head to ask, and the record is the truth.
            sid = newest or props.get("submission_id") or id_
            return pulumi.dynamic.ReadResult(id_, spec.outs(sid, record.job_status, previous, exported))
        try:
            with job_head.client(spec, spec.reach_timeout_s) as client:
                jobs = client.list_jobs()
        except (HeadAccessError, HeadRequestError) as error:
            # Kept, not forgotten: forgetting it would make the next `up` submit beside a live run.
            pulumi.log.warn(f"GrpoJob {id_}: Ray head unreachable, status kept as {UNREACHABLE}: {error}")
            sid = newest or props.get("submission_id") or id_
            return pulumi.dynamic.ReadResult(id_, spec.outs(sid, UNREACHABLE, previous, exported))
        on_head = [sid for sid in spec.attempt_ids if job_head.find_job(jobs, sid) is not None]
        sid = newest or (on_head[-1] if on_head else props.get("submission_id") or id_)
        job = job_head.find_job(jobs, sid)
        if job is not None:
            status = job_head.value(job.status)
        elif record is not None and record.outcome == SUCCEEDED:
            status = "SUCCEEDED"
        else:
            status = LOST  # the head restarted and forgot it; the supervisor's next attempt follows
        return pulumi.dynamic.ReadResult(id_, spec.outs(sid, status, previous, exported))

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.UpdateResult:
        # diff replaces on every prop that touches the run, so the job and its state stay; the new
        # props (how the head is reached) are what read and delete get from now on.
        spec = JobSpec.from_props(spec_props(news))
        return pulumi.dynamic.UpdateResult(spec.outs(olds["submission_id"], olds["status"],
                                                     olds.get("fabric_busbw_gbps"), olds.get("export_outcome") or ""))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        """Takes the Lease, records the run stopped by the stack (desired stopped: the supervisor
        submits nothing more of it and stops what this could not), stops every attempt the record
        names and waits for them, and releases the Lease."""
        spec = JobSpec.from_props(spec_props(props))
        try:
            records, lease = job_lease.records(spec), job_lease.lease(spec)
            lease.acquire()
            with lease.renewing(), ExitStack() as stack:
                def reach() -> RayJobs:
                    return job_head.head_jobs(stack.enter_context(job_head.client(spec, spec.reach_timeout_s)), spec)

                # The record first (the decider submits nothing more of a run the stack stopped), then the
                # stops; a released run has no head to ask.
                steps = run_lifecycle.delete_run(records, lease, spec.run, reach, also=(id_,))
                give_up = time.monotonic() + spec.reach_timeout_s + job_head.STOP_TIMEOUT_S
                try:
                    for label in steps:
                        if label.startswith("waiting"):
                            if time.monotonic() >= give_up:
                                raise RuntimeError(f"the run's attempts are still live {job_head.STOP_TIMEOUT_S:g} s after "
                                                   "they were stopped")
                            time.sleep(0.5)
                except HeadGoneError:
                    raise
                except (HeadAccessError, HeadRequestError) as error:
                    if not job_lease.stop_through_cluster(spec, records, lease):
                        raise
                    pulumi.log.warn(f"GrpoJob run {spec.run_key}: the Ray head did not answer; stopped through "
                                    f"RayCluster {spec.namespace}/{spec.ray_cluster} (spec.suspend: true), its GPU "
                                    f"workers released, the delete goes on: {_first_line(error)}")
        except HeadGoneError as error:
            # The Kubernetes API says the head's service is gone, and its jobs with it.
            pulumi.log.warn(f"GrpoJob {id_}: nothing to stop; {error}")
        except Exception as error:  # noqa: BLE001 - any doubt must fail the delete
            # Succeeding here would let Pulumi start a replacement beside a run that may be live.
            raise RuntimeError(
                f"GrpoJob {id_} (run {spec.run_key}): cannot tell whether it still runs, so the delete fails: "
                f"{_first_line(error)}. "
                "Restore access to the head (cluster credentials, network) and run again; if the "
                "cluster is gone for good, remove the job with `pulumi state delete`."
            ) from None


def _deleted_under_the_state(olds: Mapping[str, Any]) -> bool:
    """Whether the run the state holds was ended by the job's own delete (DELETED in its record, its
    generation): `pulumi up --target`/`--exclude` runs the delete of a replace cascade but keeps the
    untargeted job's old state (docs/pulumi-lifecycle.md). False when the record cannot be read."""
    if is_unknown(dict(olds)) or olds.get("status") in (None, ""):
        return False
    try:
        spec = JobSpec.from_props(spec_props(olds))
        record = job_lease.records(spec).get(spec.run_key).record
    except Exception as error:  # noqa: BLE001 - a diff never fails on the record: the next one reads again
        pulumi.log.debug(f"GrpoJob: run record not readable in diff: {_first_line(error)}")
        return False
    return record is not None and record.generation == spec.attempt and record.outcome == run_lifecycle.DELETED


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _create(spec: JobSpec, records: RecordStore | MemoryRecords,
            lease: Lease | HeldLease) -> tuple[str, str, float | None]:
    """create's steps while it holds the Lease: (submission id, status, fabric bus bandwidth)."""
    started = time.monotonic()
    busbw: list[float | None] = []
    with ExitStack() as stack:
        clients: list[JobSubmissionClient] = []

        def reach() -> RayJobs:
            # The record says the run has begun: now the head (a released cluster has none) may come back.
            job_lease.resume_cluster(spec, lease)
            clients.append(stack.enter_context(job_head.client(spec, spec.ready_timeout_s)))
            return job_head.head_jobs(clients[0], spec)

        def gates() -> None:
            busbw.append(job_gates.run_gates(clients[0], spec, started))

        try:
            created = run_lifecycle.drive(run_lifecycle.create_run(records, lease, spec.run, reach, gates))
        except run_lifecycle.Refused as refused:
            raise RuntimeError(f"GrpoJob: {refused}") from None
        fabric_gbps = busbw[0] if busbw else None
        if created.done:
            pulumi.log.info(f"GrpoJob: run {spec.run_key} already succeeded ({created.submission_id}); nothing "
                            "submitted")
            return created.submission_id, "SUCCEEDED", None
        if created.job is not None:
            if created.job.get("status") == "SUCCEEDED":
                return created.submission_id, "SUCCEEDED", fabric_gbps
            job_gates.check_adoptable(created.job, spec)
        # The gates used their own time: the run gets the whole timeout to start.
        try:
            status = job_polling.await_start(clients[0], spec, created.submission_id,
                                             time.monotonic() + spec.ready_timeout_s)
        except TimeoutError:
            # A failed create leaves no resource behind in Pulumi's state: nor may it leave a run.
            run_lifecycle.drive(run_lifecycle.fail_start(records, lease, job_head.head_jobs(clients[0], spec),
                                                         spec.run_key, created.submission_id),
                                sleep=lambda: time.sleep(0.5), timeout_s=job_head.STOP_TIMEOUT_S)
            raise
    return created.submission_id, status, fabric_gbps


def _lowered_attempt(olds: Mapping[str, Any], news: Mapping[str, Any]) -> str | None:
    """Why a jobAttempt below the deployed one of the same run is refused; None when it is not lower."""
    old, new = olds.get("attempt"), news.get("attempt")
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (old, new))
    if not numbers or new >= old or olds.get("run_id") != news.get("run_id") or is_unknown(news.get("run_id")):
        return None
    return (f"attempt = {new:g}: below jobAttempt {old:g} of the deployed run {news.get('run_id')}; set "
            f"verl-gke:jobAttempt back to {old:g}, or above it to start a new generation")


class GrpoJob(pulumi.dynamic.Resource, name="GrpoJob"):
    """The GRPO training run submitted to the Ray cluster; replaced when its spec changes."""

    submission_id: pulumi.Output[str]
    status: pulumi.Output[str]
    dashboard_command: pulumi.Output[str]
    fabric_busbw_gbps: pulumi.Output[float | None]
    """The fabric check's all-reduce bus bandwidth in GB/s, measured before the run was submitted."""
    export_outcome: pulumi.Output[str]
    """The model export's outcome as the run record says at the last create or refresh ('SUCCEEDED':
    the model is in the bucket)."""

    def __init__(self, name: str, args: GrpoJobArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        props: dict[str, Any] = {**args, **{key: None for key in OUTPUT_KEYS}}
        # `pulumi up --replace` must stop the old run before submitting again, as diff's replace does.
        opts = pulumi.ResourceOptions.merge(pulumi.ResourceOptions(delete_before_replace=True), opts)
        super().__init__(GrpoJobProvider(), name, props, opts)
