"""GrpoJob: the tutorial's `ray job submit ... python3 -m verl.trainer.main_ppo` as a resource.

A Pulumi dynamic provider that waits for the Ray dashboard with its own deadline,
submits the run under a submission id derived from the stack and a hash of the job spec, and
adopts the job when one with that id already exists, so `pulumi up` twice never starts two runs.

Dynamic-provider rules followed here: the provider is pickled with dill by
reference to this module, so it keeps no state and imports Ray inside its methods; ints arrive as
floats; unknowns arrive in check/diff during preview; the default `update` would drop the outputs.
"""

from __future__ import annotations

import json
import math
import re
import http.client
import time
import urllib.error
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, NotRequired, Required, TypedDict

import pulumi
import pulumi.dynamic
from pulumi.output import Unknown
from pulumi.runtime import rpc

from components import provider_reference
from domain.run_identity import SUBMISSION_ID_PREFIX, submission_id, submission_ids, whole_numbers
from access import head_access
from access import fabric
from access.cluster_readiness import await_capacity
from access.cluster_api import cluster_api
from access.kubeconfig import is_dns_endpoint
from access.log_text import inert
from manifests.ray_cluster import ray_cluster_of
from workloads import export_model, run_lifecycle
from workloads.kube import KubernetesApi, RayClusterControl
from workloads.run_lease import PULUMI_UP, HeldLease, Lease, identity
from workloads.run_lifecycle import DEADLINE_ENV, LIVE, SUCCEEDED, RayJobs, RunSpec
from workloads.run_record import MemoryRecords, RecordStore
from access.head_access import (
    HeadAccessError,
    HeadAccessSetupError,
    HeadGoneError,
    HeadRequestError,
    OutageClock,
    dashboard,
    dashboard_command,
    job_client,
    wait_for_dashboard,
)

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobSubmissionClient

REACH_TIMEOUT_S = 30.0
"""Deadline to reach a head that already took the job (refresh, delete, completion polls), capped
by ready_timeout_s; past it, `delete` fails (only the Kubernetes API can say the head is gone)."""
START_GRACE_S = 60.0
"""How long `create` watches a RUNNING job before calling it started: verl fails on a bad config,
a missing module or an unreachable model within its first minute."""
START_POLL_S = 0.25
"""Status polls while a job starts: a cheap GET, and `pulumi up` returns that much sooner."""
STOP_TIMEOUT_S = 60.0
"""How long `delete` waits for a stopped job to reach a terminal state."""
LOG_TAIL_LINES = 20

_TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
_OUTPUT_KEYS = ("submission_id", "status", "dashboard_command", "fabric_busbw_gbps", "export_outcome")
LOST = "LOST"
"""Status when the head answers but no longer knows the run's newest attempt (it restarted)."""
UNREACHABLE = "UNREACHABLE"
"""Status when the head does not answer a refresh: the resource is kept, its last status unknown."""
# What the run is, and where it runs: a new cluster or head needs a new submission on it. How the head
# is reached (dashboard_url, cluster_endpoint, the CA) is not where it runs: an update, the run goes on.
_REPLACE_KEYS = ("entrypoint", "runtime_env", "attempt", "cluster_name", "namespace", "head_service")
_POSITIVE_SECONDS_KEYS = ("completion_timeout_s", "poll_interval_s", "ready_timeout_s", "outage_window_s",
                          "fabric_timeout_s")
# A start-up grace or a budget of 0 means none.
_SECONDS_KEYS = (*_POSITIVE_SECONDS_KEYS, "startup_grace_s", "budget_s")
_COUNT_KEYS = ("attempt", "expected_workers", "expected_gpus", "supervised_attempts")
_ACCESS_KEYS = ("dashboard_url", "cluster_endpoint", "cluster_ca_certificate", "cluster_name", "head_service")
_OPTIONAL_NAME_KEYS = ("run_id", "run_record", "kube_api_url")
_NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")


class GrpoJobArgs(TypedDict, total=False):
    """Inputs of a GrpoJob; all but `entrypoint` and `runtime_env` have defaults (see `_JobSpec`)."""

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


@dataclass(frozen=True)
class _JobSpec:
    """The provider's view of the props, with every default in one place."""

    entrypoint: str
    runtime_env: dict[str, Any]
    dashboard_url: str | None = None
    cluster_endpoint: str | None = None
    cluster_ca_certificate: str | None = None
    cluster_name: str | None = None
    namespace: str = "default"
    head_service: str | None = None
    stack: str = "dev"
    ready_timeout_s: float = 1800.0
    wait_for_completion: bool = False
    # A GRPO run of the tutorial's size takes hours; a day bounds a stuck `pulumi up`.
    completion_timeout_s: float = 86400.0
    poll_interval_s: float = 15.0
    outage_window_s: float = head_access.OUTAGE_WINDOW_S
    metadata: dict[str, str] = field(default_factory=dict)
    # Bumped to run the same spec again: Ray never reuses a submission id, so a new attempt is a new id.
    attempt: int = 0
    startup_grace_s: float = START_GRACE_S
    expected_workers: int = 0
    expected_gpus: int = 0
    fabric_check: bool = False
    fabric_min_busbw_gbps: float = 0.0
    fabric_backend: str = "nccl"
    fabric_python: str = "python3"
    fabric_runtime_env: dict[str, Any] = field(default_factory=dict)
    fabric_timeout_s: float = fabric.TIMEOUT_S
    fabric_transports: tuple[str, ...] = ()
    budget_s: float = 0.0
    supervised_attempts: int = 0
    run_id: str | None = None
    run_record: str | None = None
    kube_api_url: str | None = None

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> _JobSpec:
        """Parses the spec part of props (None means default); ValueError names every bad prop."""
        problems = _problems(props)
        if problems:
            raise ValueError("GrpoJob: " + "; ".join(f"{key}: {reason}" for key, reason in problems))
        given = {key: props[key] for key in _SPEC_KEYS if props.get(key) is not None}
        given["runtime_env"] = whole_numbers(given["runtime_env"])
        if "fabric_runtime_env" in given:
            given["fabric_runtime_env"] = whole_numbers(given["fabric_runtime_env"])
        if "fabric_min_busbw_gbps" in given:
            given["fabric_min_busbw_gbps"] = float(given["fabric_min_busbw_gbps"])
        if "fabric_transports" in given:
            given["fabric_transports"] = tuple(given["fabric_transports"])
        for key in _SECONDS_KEYS:
            if key in given:
                given[key] = float(given[key])
        if "metadata" in given:
            given["metadata"] = dict(given["metadata"])
        for key in _COUNT_KEYS:
            if key in given:
                given[key] = int(given[key])  # the engine sends numbers as floats
        return cls(**given)

    @property
    def submission_id(self) -> str:
        """`verl-grpo-<stack>-<12 hex>`: the same job spec on the same stack gives the same id."""
        return submission_id(self.stack, self.entrypoint, self.runtime_env, self.attempt)

    @property
    def supervised_ids(self) -> list[str]:
        """The ids the run supervisor submits later attempts under, in order."""
        return submission_ids(self.stack, self.entrypoint, self.runtime_env, self.attempt,
                              self.supervised_attempts + 1)[1:]

    @property
    def attempt_ids(self) -> list[str]:
        """Every submission id of this generation: `pulumi up`'s first, then the supervisor's."""
        return [self.submission_id, *self.supervised_ids]

    @property
    def run_key(self) -> str:
        return self.run_id or submission_id(self.stack, self.entrypoint, self.runtime_env, 0)

    @property
    def run(self) -> RunSpec:
        return RunSpec(run_id=self.run_key, generation=self.attempt, submission_ids=tuple(self.attempt_ids),
                       entrypoint=self.entrypoint, runtime_env=self.runtime_env, budget_s=self.budget_s,
                       metadata=self.metadata)

    @property
    def ray_cluster(self) -> str:
        """The RayCluster the run's records and Lease belong to."""
        if self.run_record:
            return self.run_record.removesuffix("-run")
        if self.head_service:
            return ray_cluster_of(self.head_service)
        return re.sub(r"[^a-z0-9-]", "-", f"{SUBMISSION_ID_PREFIX}-{self.stack}".lower())[:40].strip("-")

    def kube_api(self) -> KubernetesApi | None:
        """The cluster's Kubernetes API (see GrpoJobArgs.kube_api_url); None when neither is given."""
        timeout = self.reach_timeout_s
        if self.kube_api_url:
            return KubernetesApi(self.kube_api_url, timeout_s=timeout)
        if self.cluster_endpoint and (self.cluster_ca_certificate or is_dns_endpoint(self.cluster_endpoint)):
            return cluster_api(self.cluster_endpoint, self.cluster_ca_certificate, timeout)
        return None

    def records(self) -> RecordStore | MemoryRecords:
        """Where the run records are kept (for the call only without a Kubernetes API)."""
        api = self.kube_api()
        return MemoryRecords() if api is None else RecordStore(api, self.namespace, self.ray_cluster)

    def lease(self) -> Lease | HeldLease:
        """The cluster's decider Lease (always held without a Kubernetes API: nothing else decides)."""
        api = self.kube_api()
        return HeldLease() if api is None else Lease(api, self.namespace, self.ray_cluster, identity(PULUMI_UP),
                                                     log=pulumi.log.info)

    def resume_cluster(self, lease: Lease | HeldLease) -> None:
        """Brings back a RayCluster an earlier run's end released (suspended), before the readiness
        gate waits for it: the same field and field manager as the decider's release. Nothing to do
        without the API or the head service."""
        api = self.kube_api()
        if api is None or not self.head_service:
            return
        lease.check()
        try:
            RayClusterControl(api, self.namespace, self.ray_cluster).set_suspended(False)
        except Exception as error:  # noqa: BLE001 - one line naming what was being done
            raise RuntimeError(f"GrpoJob: resuming RayCluster {self.namespace}/{self.ray_cluster} (spec.suspend: "
                               f"false) failed: {error}") from None

    @property
    def address(self) -> str:
        """Where the head is reached, for messages."""
        if self.dashboard_url:
            return self.dashboard_url
        return (f"svc/{self.head_service} in namespace {self.namespace} of GKE cluster "
                f"{self.cluster_name} (port-forward through its API)")

    @property
    def reach_timeout_s(self) -> float:
        return min(REACH_TIMEOUT_S, self.ready_timeout_s)

    def outs(self, submission_id: str, status: str, fabric_busbw_gbps: float | None = None,
             export_outcome: str = "") -> dict[str, Any]:
        """Outputs: the props later calls need (read and delete get only these), the job's state, and
        the model export's outcome as the run record says (modelUri names a model only once SUCCEEDED)."""
        command = dashboard_command(self.stack) if self.head_service else None
        return {**asdict(self), "submission_id": submission_id, "status": status,
                "dashboard_command": command, "fabric_busbw_gbps": fabric_busbw_gbps,
                "export_outcome": export_outcome}

    @property
    def fabric(self) -> fabric.FabricCheck:
        return fabric.FabricCheck(
            nodes=self.expected_workers, gpus_per_node=self.expected_gpus // max(1, self.expected_workers),
            min_busbw_gbps=self.fabric_min_busbw_gbps, backend=self.fabric_backend, python=self.fabric_python,
            runtime_env=self.fabric_runtime_env, timeout_s=self.fabric_timeout_s, transports=self.fabric_transports)


_SPEC_KEYS = tuple(f.name for f in fields(_JobSpec))
_DEFAULTS: dict[str, Any] = {
    f.name: f.default_factory() if f.default_factory is not MISSING
    else None if f.default is MISSING else f.default
    for f in fields(_JobSpec)
}


def planned_outs(props: Mapping[str, Any], unknown: str) -> dict[str, Any]:
    """The outputs a create with these props would return, for an offline synth (no head): the
    run's status and the fabric figure are `unknown`."""
    spec = _JobSpec.from_props(_spec_props(props))
    return spec.outs(spec.submission_id, unknown, unknown if spec.fabric_check else None)


def _is_unknown(value: Any) -> bool:
    """A preview placeholder at any depth: the rpc sentinel string or pulumi's Unknown object."""
    if isinstance(value, Unknown) or (isinstance(value, str) and value == rpc.UNKNOWN):
        return True
    if isinstance(value, Mapping):
        return any(_is_unknown(item) for item in value.values())
    if isinstance(value, list | tuple):
        return any(_is_unknown(item) for item in value)
    return False


def _problems(props: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every bad prop as (key, reason); unknown (preview) values are not judged."""
    known = {key: value for key, value in props.items() if not _is_unknown(value)}
    problems = [(key, f"not a GrpoJob prop (allowed: {', '.join(_SPEC_KEYS)})")
                for key in sorted(set(props) - set(_SPEC_KEYS) - set(_OUTPUT_KEYS) - {provider_reference.KEY})]
    if "entrypoint" in known and not (isinstance(known["entrypoint"], str) and known["entrypoint"].strip()):
        problems.append(("entrypoint", "a non-empty shell command is required"))
    if "runtime_env" in known and not isinstance(known["runtime_env"], Mapping):
        problems.append(("runtime_env", "a dict is required (use {} for none)"))
    for key in ("entrypoint", "runtime_env"):
        if key not in props:
            problems.append((key, "is required"))
    for key in _ACCESS_KEYS:
        value = known.get(key)
        if value is not None and not (isinstance(value, str) and value.strip()):
            problems.append((key, f"must be a non-empty string or unset, got {type(value).__name__}"))
    for key in ("dashboard_url", "kube_api_url"):
        url = known.get(key)
        if isinstance(url, str) and not url.startswith(("http://", "https://")):
            problems.append((key, f"{url!r} must start with http:// or https://"))
    for key in _OPTIONAL_NAME_KEYS:
        value = known.get(key)
        if value is not None and not (isinstance(value, str) and value.strip()):
            problems.append((key, f"must be a non-empty string or unset, got {type(value).__name__}"))
    record = known.get("run_record")
    if isinstance(record, str) and not re.match(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", record):
        problems.append(("run_record", f"{record!r} must be a Kubernetes object name"))
    if all(key in known or key not in props for key in _ACCESS_KEYS) and not known.get("dashboard_url"):
        endpoint = known.get("cluster_endpoint")
        # The DNS endpoint's certificate is publicly trusted: no CA needed there.
        optional = ("cluster_ca_certificate",) if isinstance(endpoint, str) and is_dns_endpoint(endpoint) else ()
        missing = [key for key in _ACCESS_KEYS[1:] if not known.get(key) and key not in optional]
        if missing:
            problems.append(("dashboard_url", "unset, so the head is reached by a port-forward through the cluster's API, "
                                              f"which needs {', '.join(missing)}"))
    for key in ("namespace", "stack"):
        value = known.get(key)
        if value is not None and not (isinstance(value, str) and _NAME_RE.match(value)):
            problems.append((key, f"{value!r} must be letters, digits, '.', '_' or '-'"))
    for key in _SECONDS_KEYS:
        value = known.get(key)
        positive = key in _POSITIVE_SECONDS_KEYS
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not math.isfinite(value) or value < 0 or (positive and value == 0)):
            allowed = "a positive number of seconds" if positive else "a number of seconds >= 0"
            problems.append((key, f"{value!r} must be {allowed}"))
    for key in ("wait_for_completion", "fabric_check"):
        flag = known.get(key)
        if flag is not None and not isinstance(flag, bool):
            problems.append((key, f"{flag!r} must be true or false"))
    floor = known.get("fabric_min_busbw_gbps")
    if floor is not None and (isinstance(floor, bool) or not isinstance(floor, int | float)
                              or not math.isfinite(floor) or floor < 0):
        problems.append(("fabric_min_busbw_gbps", f"{floor!r} must be a number of GB/s >= 0"))
    if known.get("fabric_backend") not in (None, "nccl", "gloo"):
        problems.append(("fabric_backend", f"{known['fabric_backend']!r} must be 'nccl' or 'gloo'"))
    if known.get("fabric_check") and not known.get("expected_workers", 1):
        problems.append(("fabric_check", "needs expected_workers: the nodes to measure across"))
    for key in _COUNT_KEYS:
        count = known.get(key)
        if count is not None and (isinstance(count, bool) or not isinstance(count, int | float)
                                  or not math.isfinite(count) or count < 0 or count != int(count)):
            problems.append((key, f"{count!r} must be a whole number >= 0"))
    metadata = known.get("metadata")
    if metadata is not None and not (isinstance(metadata, Mapping) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        problems.append(("metadata", "must map strings to strings"))
    return problems


def _differs(key: str, old: Any, new: Any) -> bool:
    """Whether a prop changed, comparing effective values (defaults applied, floats cast)."""
    if _is_unknown(new):
        return True

    def effective(value: Any) -> Any:
        return _DEFAULTS[key] if value is None else whole_numbers(value)

    return bool(effective(old) != effective(new))


class GrpoJobProvider(pulumi.dynamic.ResourceProvider):
    """Submits, adopts, refreshes and stops the GRPO Ray job."""

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.CheckResult:
        failures = [pulumi.dynamic.CheckFailure(key, reason) for key, reason in _problems(news)]
        if (lowered := _lowered_attempt(olds, news)) is not None:
            # Refused here, before the replace's delete stops the live run: the older generation's
            # supervisor would not watch the newer one's record, nor release it.
            failures.append(pulumi.dynamic.CheckFailure("attempt", lowered))
        return pulumi.dynamic.CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.DiffResult:
        replaces = [key for key in _REPLACE_KEYS if _differs(key, olds.get(key), news.get(key))]
        changed = provider_reference.moved(olds, news) or any(
            _differs(key, olds.get(key), news.get(key)) for key in _SPEC_KEYS)
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
        spec = _JobSpec.from_props(props)
        records, lease = spec.records(), spec.lease()
        lease.acquire()
        with lease.renewing():
            submission_id, status, busbw = _create(spec, records, lease)
        if spec.wait_for_completion and status != "SUCCEEDED":
            submission_id, status = _await_completion(spec, records, submission_id)
        record = records.get(spec.run_key).record
        exported = record.export_outcome if record is not None else ""
        return pulumi.dynamic.CreateResult(submission_id, spec.outs(submission_id, status, busbw, exported))

    def read(self, id_: str, props: dict[str, Any]) -> pulumi.dynamic.ReadResult:
        """The run's newest attempt and its status, from the record and the head; writes nothing."""
        spec = _JobSpec.from_props(_spec_props(props))
        previous = props.get("fabric_busbw_gbps")
        try:
            record = spec.records().get(spec.run_key).record
        except Exception as error:  # noqa: BLE001 - a refresh reports, it never fails the stack
            pulumi.log.warn(f"GrpoJob {id_}: run record not readable: {error}")
            record = None
        exported = record.export_outcome if record else ""
        newest = record.attempts[-1].submission_id if record and record.attempts else None
        if record is not None and record.released:
            # Ended and its RayCluster suspended: no head to ask, and the record is the truth.
            sid = newest or props.get("submission_id") or id_
            return pulumi.dynamic.ReadResult(id_, spec.outs(sid, ended_status(record.outcome), previous, exported))
        try:
            with _client(spec, spec.reach_timeout_s) as client:
                jobs = client.list_jobs()
        except (HeadAccessError, HeadRequestError) as error:
            # Kept, not forgotten: forgetting it would make the next `up` submit beside a live run.
            pulumi.log.warn(f"GrpoJob {id_}: Ray head unreachable, status kept as {UNREACHABLE}: {error}")
            sid = newest or props.get("submission_id") or id_
            return pulumi.dynamic.ReadResult(id_, spec.outs(sid, UNREACHABLE, previous, exported))
        on_head = [sid for sid in spec.attempt_ids if _find_job(jobs, sid) is not None]
        sid = newest or (on_head[-1] if on_head else props.get("submission_id") or id_)
        job = _find_job(jobs, sid)
        if job is not None:
            status = _value(job.status)
        elif record is not None and record.outcome == SUCCEEDED:
            status = "SUCCEEDED"
        else:
            status = LOST  # the head restarted and forgot it; the supervisor's next attempt follows
        return pulumi.dynamic.ReadResult(id_, spec.outs(sid, status, previous, exported))

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.UpdateResult:
        # diff replaces on every prop that touches the run, so the job and its state stay; the new
        # props (how the head is reached) are what read and delete get from now on.
        spec = _JobSpec.from_props(_spec_props(news))
        return pulumi.dynamic.UpdateResult(spec.outs(olds["submission_id"], olds["status"],
                                                     olds.get("fabric_busbw_gbps"), olds.get("export_outcome") or ""))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        """Takes the Lease, records the run stopped by the stack (desired stopped: the supervisor
        submits nothing more of it and stops what this could not), stops every attempt the record
        names and waits for them, and releases the Lease."""
        spec = _JobSpec.from_props(_spec_props(props))
        try:
            records, lease = spec.records(), spec.lease()
            lease.acquire()
            with lease.renewing(), ExitStack() as stack:
                def reach() -> RayJobs:
                    return _head_jobs(stack.enter_context(_client(spec, spec.reach_timeout_s)), spec)

                # The record first (the decider submits nothing more of a run the stack stopped), then the
                # stops; a released run has no head to ask.
                steps = run_lifecycle.delete_run(records, lease, spec.run, reach, also=(id_,))
                give_up = time.monotonic() + spec.reach_timeout_s + STOP_TIMEOUT_S
                try:
                    for label in steps:
                        if label.startswith("waiting"):
                            if time.monotonic() >= give_up:
                                raise RuntimeError(f"the run's attempts are still live {STOP_TIMEOUT_S:g} s after "
                                                   "they were stopped")
                            time.sleep(0.5)
                except HeadGoneError:
                    raise
                except (HeadAccessError, HeadRequestError) as error:
                    if not _stop_through_cluster(spec, records, lease):
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
    if _is_unknown(dict(olds)) or olds.get("status") in (None, ""):
        return False
    try:
        spec = _JobSpec.from_props(_spec_props(olds))
        record = spec.records().get(spec.run_key).record
    except Exception as error:  # noqa: BLE001 - a diff never fails on the record: the next one reads again
        pulumi.log.debug(f"GrpoJob: run record not readable in diff: {_first_line(error)}")
        return False
    return record is not None and record.generation == spec.attempt and record.outcome == run_lifecycle.DELETED


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _stop_through_cluster(spec: _JobSpec, records: RecordStore | MemoryRecords, lease: Lease | HeldLease) -> bool:
    """A delete whose head does not answer (Pending on a CPU pool at zero, a stalled dashboard) while the
    Kubernetes API does: suspends the RayCluster, which stops every attempt with its pods (KubeRay 1.6.2
    deletes every pod of a suspended cluster, the head's included, and resumes only once none is left, so a
    replacement's create that resumes it cannot overlap them), and records the run released. False (the
    delete fails) without the API or the RayCluster: then nothing says the run stopped."""
    api = spec.kube_api()
    if api is None:
        return False
    lease.check()
    if not RayClusterControl(api, spec.namespace, spec.ray_cluster).set_suspended(True):
        return False
    where = f"{spec.namespace}/{spec.ray_cluster}"
    run_lifecycle.write_record(records, spec.run_key, lambda r: None if r is None else
                               run_lifecycle.suspended_by_stack(r, where), lease)
    return True


def ended_status(outcome: str) -> str:
    """A Ray job status for a run's recorded outcome."""
    kind = run_lifecycle.outcome_kind(outcome)
    return "SUCCEEDED" if kind == "succeeded" else "STOPPED" if kind == "stopped" else "FAILED"


def _spec_props(props: Mapping[str, Any]) -> dict[str, Any]:
    """The spec part of stored outputs (without the outputs and the serialized provider)."""
    return {key: props[key] for key in _SPEC_KEYS if key in props}


@contextmanager
def _client(spec: _JobSpec, timeout_s: float) -> Iterator[JobSubmissionClient]:
    """A JobSubmissionClient on the head, reached within `timeout_s`, or HeadAccessError naming it.

    The port-forward is retried until the deadline: there is no head pod to forward to while it is pending.
    The last error's kind is kept, so a head the API says is gone stays HeadGoneError.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        stack = ExitStack()
        try:
            url = stack.enter_context(dashboard(
                spec.dashboard_url, api=None if spec.dashboard_url else spec.kube_api(),
                namespace=spec.namespace, head_service=spec.head_service))
            wait_for_dashboard(url, max(0.1, deadline - time.monotonic()))
            break
        except HeadAccessSetupError:
            stack.close()
            raise
        except HeadAccessError as error:
            stack.close()
            if time.monotonic() >= deadline:
                raise type(error)(
                    f"Ray head at {spec.address} not reachable within {timeout_s:g} s: {error}"
                ) from None
            time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
    with stack:
        yield job_client(url, spec.address)


def _create(spec: _JobSpec, records: RecordStore | MemoryRecords,
            lease: Lease | HeldLease) -> tuple[str, str, float | None]:
    """create's steps while it holds the Lease: (submission id, status, fabric bus bandwidth)."""
    started = time.monotonic()
    busbw: list[float] = []
    with ExitStack() as stack:
        clients: list[JobSubmissionClient] = []

        def reach() -> RayJobs:
            # The record says the run has begun: now the head (a released cluster has none) may come back.
            spec.resume_cluster(lease)
            clients.append(stack.enter_context(_client(spec, spec.ready_timeout_s)))
            return _head_jobs(clients[0], spec)

        def gates() -> None:
            client = clients[0]
            _end_fabric_checks(client, spec)
            _refuse_a_second_run(client.list_jobs(), spec)
            if spec.expected_workers:
                # A head that answers is not a whole cluster: a missing worker fails the run at start.
                await_capacity(client.get_address(), workers=spec.expected_workers, gpus=spec.expected_gpus,
                               deadline=started + spec.ready_timeout_s, address=spec.address,
                               what=f"GrpoJob {spec.submission_id} not submitted within ready_timeout_s="
                                    f"{spec.ready_timeout_s:g} s")
            if spec.fabric_check:
                busbw.append(_check_fabric(client, spec))

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
            _check_adoptable(created.job, spec)
        # The gates used their own time: the run gets the whole timeout to start.
        try:
            status = _await_start(clients[0], spec, created.submission_id, time.monotonic() + spec.ready_timeout_s)
        except TimeoutError:
            # A failed create leaves no resource behind in Pulumi's state: nor may it leave a run.
            run_lifecycle.drive(run_lifecycle.fail_start(records, lease, _head_jobs(clients[0], spec), spec.run_key,
                                                         created.submission_id),
                                sleep=lambda: time.sleep(0.5), timeout_s=STOP_TIMEOUT_S)
            raise
    return created.submission_id, status, fabric_gbps


def _head_jobs(client: JobSubmissionClient, spec: _JobSpec) -> RayJobs:
    """The run lifecycle's REST client on the head `client` reached, each request bounded; a stall or
    a broken connection raises HeadRequestError naming the head and the request, as the SDK's does."""

    class Named(RayJobs):
        def send(self, method: str, path: str, data: bytes | None, content_type: str) -> tuple[bytes, str | None]:
            try:
                return super().send(method, path, data, content_type)
            except urllib.error.HTTPError as error:
                if method != "GET":
                    raise  # a submission's refusal is read by the lifecycle (an id used once, a head starting)
                error.close()
                raise RuntimeError(f"Ray head at {spec.address}: {method} {path.split('?')[0]} answered "
                                   f"{error.code} {error.reason}") from None
            except (OSError, http.client.HTTPException) as error:
                raise HeadRequestError(f"Ray head at {spec.address}: {method} {path.split('?')[0]} got no answer "
                                       f"within {self.timeout_s:g} s ({type(error).__name__})") from None

    return Named(client.get_address(), head_access.REQUEST_TIMEOUT_S)


def _lowered_attempt(olds: Mapping[str, Any], news: Mapping[str, Any]) -> str | None:
    """Why a jobAttempt below the deployed one of the same run is refused; None when it is not lower."""
    old, new = olds.get("attempt"), news.get("attempt")
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (old, new))
    if not numbers or new >= old or olds.get("run_id") != news.get("run_id") or _is_unknown(news.get("run_id")):
        return None
    return (f"attempt = {new:g}: below jobAttempt {old:g} of the deployed run {news.get('run_id')}; set "
            f"verl-gke:jobAttempt back to {old:g}, or above it to start a new generation")


def _check_fabric(client: JobSubmissionClient, spec: _JobSpec) -> float:
    """The fabric check's bus bandwidth; raises (nothing submitted) below the floor."""
    check = spec.fabric
    pulumi.log.info(f"fabric check: all-reduce across {check.nodes} nodes x {check.gpus_per_node} GPUs, "
                    f"up to {check.timeout_s:g} s")
    result = fabric.run_fabric_check(client, check, spec.stack)
    seen = fabric.transports_text(result["transports"]) or "none logged"
    pulumi.log.info(f"fabric check: all-reduce bus bandwidth {result['busbw_gbps']:g} GB/s over "
                    f"{result['nodes']} nodes x {check.gpus_per_node} GPUs ({result['backend']}); "
                    f"NCCL transports: {seen}")
    if message := fabric.verdict(result, check):
        raise fabric.FabricError(message)
    return float(result["busbw_gbps"])


def _find_job(jobs: list[JobDetails], submission_id: str) -> JobDetails | None:
    # From list_jobs, not get_job_info: the latter does not tell "no such job" from other failures.
    return next((job for job in jobs if job.submission_id == submission_id), None)


def _end_fabric_checks(client: JobSubmissionClient, spec: _JobSpec) -> None:
    """Stops the stack's fabric checks still live (one whose deploy failed while polling it, or a
    `verl-gke fabric` under way): a check holds every GPU the run needs, and its figure is of no use
    to this deploy. Waits up to STOP_TIMEOUT_S for Ray to report them ended."""
    live = sorted(j.submission_id for j in client.list_jobs() if j.submission_id
                  and fabric.is_check_of(j.submission_id, spec.stack) and _value(j.status) in LIVE)
    if live:
        pulumi.log.warn(f"GrpoJob {spec.submission_id}: stopping fabric check(s) {', '.join(live)} of stack "
                        f"{spec.stack}: they hold the GPUs the run needs")
        _stop(client, *live)


def _refuse_a_second_run(jobs: list[JobDetails], spec: _JobSpec) -> None:
    """One stack, one live run: another run of this stack (one an interrupted update left behind,
    say) holds the GPUs and writes the same checkpoints; so does a fabric check of the stack, and a
    model export on this head (its merge holds a GPU node's memory; the head is the stack's own)."""
    prefix = f"{SUBMISSION_ID_PREFIX}-{spec.stack}-"
    live = sorted(j.submission_id for j in jobs if j.submission_id and _value(j.status) in LIVE and (
        j.submission_id.startswith(prefix) and j.submission_id not in spec.attempt_ids
        or fabric.is_check_of(j.submission_id, spec.stack)
        or j.submission_id.startswith(export_model.SUBMISSION_PREFIX)))
    if live:
        raise RuntimeError(
            f"GrpoJob {spec.submission_id}: another run or a model export of stack {spec.stack} is live on "
            f"{spec.address}: {', '.join(live)}. They would share the GPUs (and a run the checkpoint folder); "
            f"let it end or stop it (`ray job stop {live[0]}` through `verl-gke dashboard`) and run again."
        )


def _check_adoptable(job: Mapping[str, Any], spec: _JobSpec) -> None:
    """A job under our id is ours only if it runs our spec: Ray ids say nothing about the job."""
    theirs = {"entrypoint": job.get("entrypoint"), "runtime_env": whole_numbers(job.get("runtime_env") or {})}
    # The budget's deadline is set at submission, not part of the spec.
    theirs["runtime_env"].get("env_vars", {}).pop(DEADLINE_ENV, None)
    if not theirs["runtime_env"].get("env_vars") and "env_vars" not in spec.runtime_env:
        theirs["runtime_env"].pop("env_vars", None)
    ours = {"entrypoint": spec.entrypoint, "runtime_env": spec.runtime_env}
    # Ray stores runtime_env.config with its own defaults filled in (eager_install, log_files).
    their_config = theirs["runtime_env"].get("config") or {}
    same_config = all(their_config.get(key) == value for key, value in (ours["runtime_env"].get("config") or {}).items())

    def without_config(env: dict[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in env.items() if key != "config"}

    if not (theirs["entrypoint"] == ours["entrypoint"] and same_config
            and without_config(theirs["runtime_env"]) == without_config(ours["runtime_env"])):
        raise RuntimeError(
            f"GrpoJob {job.get('submission_id')}: the head already has a job under this id that runs something "
            f"else, so it is not adopted. Its spec: {json.dumps(theirs, sort_keys=True)}; this stack's: "
            f"{json.dumps(ours, sort_keys=True)}. Stop it, or bump verl-gke:jobAttempt for a new id."
        )


def _await_start(client: JobSubmissionClient, spec: _JobSpec, submission_id: str, deadline: float) -> str:
    """Waits for the job to be RUNNING (by `deadline`) and to stay so for its start-up grace;
    a job that ends badly first raises with the end of its log."""
    running_since: float | None = None
    while True:
        status = _value(client.get_job_status(submission_id))
        now = time.monotonic()
        if status in ("FAILED", "STOPPED"):
            raise RuntimeError(_ended_message(client, submission_id, status, "while starting"))
        if status == "SUCCEEDED":
            return status
        if status == "RUNNING":
            running_since = running_since or now
            if now - running_since >= spec.startup_grace_s:
                return status
        elif now >= deadline:
            raise TimeoutError(f"GrpoJob {submission_id} still {status} after ready_timeout_s="
                               f"{spec.ready_timeout_s:g} s on {spec.address}; it was stopped")
        time.sleep(START_POLL_S)


def _ended_message(client: JobSubmissionClient, submission_id: str, status: str, when: str) -> str:
    job = client.get_job_info(submission_id)
    # Ray's message embeds up to 20,000 chars of logs after its first line: keep that line.
    message = inert(job.message or "no message").splitlines()[0]
    tail = log_tail(client, job, LOG_TAIL_LINES)
    return (f"GRPO job {submission_id} {status} {when}: {message}\n"
            f"last {len(tail)} log lines:\n" + "\n".join(tail))


def log_tail(client: JobSubmissionClient, job: JobDetails, lines: int) -> list[str]:
    """The last `lines` lines of the job's driver log, cut by the head (the log may be GBs)."""
    if not job.driver_node_id:
        return ["(no log tail: the job's driver never started)"]
    query = urllib.parse.urlencode({"submission_id": job.submission_id, "node_id": job.driver_node_id,
                                    "lines": lines, "timeout": int(head_access.REQUEST_TIMEOUT_S)})
    try:
        response = client._do_request("GET", f"/api/v0/logs/file?{query}")
    except HeadRequestError as e:
        return [f"(no log tail: {e})"]
    if response.status_code != 200:
        return [f"(no log tail: the head answered HTTP {response.status_code})"]
    # Shown by `pulumi up` in a terminal or a CI log: written by the job, so made inert.
    return inert(response.text).splitlines()[-lines:]


def _value(status: Any) -> str:
    """JobStatus is a str enum; outputs hold its plain value."""
    return str(getattr(status, "value", status))


def _stop(client: JobSubmissionClient, *submission_ids: str) -> None:
    """Stops those of the jobs that have not ended (one listing for all), and waits until Ray
    reports each ended."""
    jobs = client.list_jobs()
    live = [sid for sid in dict.fromkeys(submission_ids)
            if (job := _find_job(jobs, sid)) is not None and _value(job.status) not in _TERMINAL]
    for sid in live:
        client.stop_job(sid)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for sid in live:
        while (status := _value(client.get_job_status(sid))) not in _TERMINAL:
            if time.monotonic() >= deadline:
                raise RuntimeError(f"GrpoJob {sid} still {status} {STOP_TIMEOUT_S:g} s after stop_job")
            time.sleep(0.5)


def _await_completion(spec: _JobSpec, records: RecordStore | MemoryRecords, submission_id: str) -> tuple[str, str]:
    """Polls until the run ends, following it across attempts through its record (the supervisor's
    resubmissions); returns (the last attempt, SUCCEEDED) or raises with the log tail. An attempt that
    ended badly while the record stays open is waited past for `outage_window_s` (the decider's next
    attempt, or its outcome), then reported.

    Each poll opens its own connection: one port-forward held for hours would break.
    """
    deadline = time.monotonic() + spec.completion_timeout_s
    outage, undecided = OutageClock(spec.outage_window_s), OutageClock(spec.outage_window_s)
    status = "RUNNING"
    while True:
        try:
            record = records.get(spec.run_key).record
        except Exception as error:  # noqa: BLE001 - the head may still tell; the next poll reads again
            pulumi.log.warn(f"GrpoJob {spec.run_key}: run record not readable: {error}")
            record = None
        if record is not None and record.attempts:
            submission_id = record.attempts[-1].submission_id
        if record is not None and record.outcome == SUCCEEDED:
            return submission_id, "SUCCEEDED"
        try:
            with _client(spec, spec.reach_timeout_s) as client:
                status = _value(client.get_job_info(submission_id).status)
                outage.reached()
                if status == "SUCCEEDED":
                    return submission_id, status
                if status in _TERMINAL and (record is None or record.outcome or undecided.lost() >= spec.outage_window_s):
                    ended = f" (the run ended: {record.outcome})" if record is not None and record.outcome else ""
                    raise RuntimeError(_ended_message(client, submission_id, status, "after it started") + ended)
                if status not in _TERMINAL:
                    undecided.reached()
        except HeadGoneError:
            raise
        except (HeadAccessError, HeadRequestError) as error:
            # A head pod restart or a dropped port-forward must not fail a wait of many hours.
            if (lost := outage.lost()) >= spec.outage_window_s:
                raise RuntimeError(f"GRPO job {submission_id}: lost the Ray head for {lost:.0f} s "
                                   f"(outage_window_s={spec.outage_window_s:g}): {error}") from None
            pulumi.log.warn(f"GRPO job {submission_id}: head unreachable, retrying: {error}")
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"GRPO job {submission_id} still {status} after completion_timeout_s="
                f"{spec.completion_timeout_s:g} s; it keeps running on {spec.address}"
            )
        time.sleep(min(spec.poll_interval_s, max(0.0, deadline - time.monotonic())))


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
        props: dict[str, Any] = {**args, **{key: None for key in _OUTPUT_KEYS}}
        # `pulumi up --replace` must stop the old run before submitting again, as diff's replace does.
        opts = pulumi.ResourceOptions.merge(pulumi.ResourceOptions(delete_before_replace=True), opts)
        super().__init__(GrpoJobProvider(), name, props, opts)
