"""The GrpoJob's inputs as the provider sees them: a pydantic model whose field types carry the rules,
every default in one place, and the ids and outputs derived from them.

Props come from the engine: numbers as floats, None for unset, and during preview unknowns at any
depth, which are not judged. A bad prop reads `<key>: <reason>`; every one is reported at once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from pulumi.output import Unknown
from pulumi.runtime import rpc
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError

from access import fabric, head_access
from access.kubeconfig import is_dns_endpoint
from components import provider_reference
from domain.run_identity import SUBMISSION_ID_PREFIX, submission_id, submission_ids, whole_numbers
from manifests.ray_cluster import ray_cluster_of
from workloads.run_lifecycle import RunSpec

REACH_TIMEOUT_S = 30.0
"""Deadline to reach a head that already took the job (refresh, delete, completion polls), capped
by ready_timeout_s; past it, `delete` fails (only the Kubernetes API can say the head is gone)."""
START_GRACE_S = 60.0
"""How long `create` watches a RUNNING job before calling it started: verl fails on a bad config,
a missing module or an unreachable model within its first minute."""
OUTPUT_KEYS = ("submission_id", "status", "dashboard_command", "fabric_busbw_gbps", "export_outcome")
ACCESS_KEYS = ("dashboard_url", "cluster_endpoint", "cluster_ca_certificate", "cluster_name", "head_service")


def _rule(check: Callable[[Any], bool], reason: Callable[[Any], str],
          convert: Callable[[Any], Any] = lambda value: value) -> BeforeValidator:
    """A field's rule on the engine's raw value: `reason(value)` when `check` fails, else `convert(value)`."""
    def validate(value: Any) -> Any:
        if not check(value):
            raise PydanticCustomError("grpo_job", "{reason}", {"reason": reason(value)})
        return convert(value)
    return BeforeValidator(validate)


def _number(value: Any, positive: bool = False) -> bool:
    return (not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
            and value >= 0 and not (positive and value == 0))


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _unset_or_text(value: Any) -> str:
    return f"must be a non-empty string or unset, got {type(value).__name__}"


Command = Annotated[str, _rule(_text, lambda _: "a non-empty shell command is required")]
Env = Annotated[dict[str, Any], _rule(lambda v: isinstance(v, Mapping), lambda _: "a dict is required (use {} for none)",
                                      lambda v: whole_numbers(dict(v)))]
Text = Annotated[str, _rule(_text, _unset_or_text)]
Url = Annotated[Text, _rule(lambda v: not _text(v) or v.startswith(("http://", "https://")),
                            lambda v: f"{v!r} must start with http:// or https://")]
ObjectName = Annotated[Text, _rule(
    lambda v: not _text(v) or re.match(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", v) is not None,
    lambda v: f"{v!r} must be a Kubernetes object name")]
Name = Annotated[str, _rule(lambda v: isinstance(v, str) and re.match(r"^[A-Za-z0-9._-]+$", v) is not None,
                            lambda v: f"{v!r} must be letters, digits, '.', '_' or '-'")]
PositiveSeconds = Annotated[float, _rule(lambda v: _number(v, positive=True),
                                         lambda v: f"{v!r} must be a positive number of seconds", float)]
Seconds = Annotated[float, _rule(_number, lambda v: f"{v!r} must be a number of seconds >= 0", float)]
Count = Annotated[int, _rule(lambda v: _number(v) and v == int(v), lambda v: f"{v!r} must be a whole number >= 0", int)]
Flag = Annotated[bool, _rule(lambda v: isinstance(v, bool), lambda v: f"{v!r} must be true or false")]
GBps = Annotated[float, _rule(_number, lambda v: f"{v!r} must be a number of GB/s >= 0", float)]
Backend = Annotated[Literal["nccl", "gloo"], _rule(lambda v: v in ("nccl", "gloo"),
                                                   lambda v: f"{v!r} must be 'nccl' or 'gloo'")]
Transports = Annotated[tuple[str, ...], _rule(
    lambda v: isinstance(v, list | tuple) and all(isinstance(t, str) and t.strip() for t in v),
    lambda v: f"{v!r} must be a list of NCCL transport names such as ['NET/IB']", tuple)]
Metadata = Annotated[dict[str, str], _rule(
    lambda v: isinstance(v, Mapping) and all(isinstance(k, str) and isinstance(i, str) for k, i in v.items()),
    lambda _: "must map strings to strings", dict)]


class JobSpec(BaseModel):
    """What GrpoJobArgs documents, typed and defaulted; built by `from_props`, which also checks the
    rules across props."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    entrypoint: Command
    runtime_env: Env
    dashboard_url: Url | None = None
    cluster_endpoint: Text | None = None
    cluster_ca_certificate: Text | None = None
    cluster_name: Text | None = None
    namespace: Name = "default"
    head_service: Text | None = None
    stack: Name = "dev"
    ready_timeout_s: PositiveSeconds = 1800.0
    wait_for_completion: Flag = False
    # A GRPO run of the tutorial's size takes hours; a day bounds a stuck `pulumi up`.
    completion_timeout_s: PositiveSeconds = 86400.0
    poll_interval_s: PositiveSeconds = 15.0
    outage_window_s: PositiveSeconds = head_access.OUTAGE_WINDOW_S
    metadata: Metadata = Field(default_factory=dict)
    # Bumped to run the same spec again: Ray never reuses a submission id, so a new attempt is a new id.
    attempt: Count = 0
    startup_grace_s: Seconds = START_GRACE_S  # 0: none
    expected_workers: Count = 0
    expected_gpus: Count = 0
    fabric_check: Flag = False
    fabric_min_busbw_gbps: GBps = 0.0
    fabric_backend: Backend = "nccl"
    fabric_python: Text = "python3"
    fabric_runtime_env: Env = Field(default_factory=dict)
    fabric_timeout_s: PositiveSeconds = fabric.TIMEOUT_S
    fabric_transports: Transports = ()
    budget_s: Seconds = 0.0  # 0: none
    supervised_attempts: Count = 0
    run_id: Text | None = None
    run_record: ObjectName | None = None
    kube_api_url: Url | None = None

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> JobSpec:
        """Parses the spec part of props (None means default); ValueError names every bad prop."""
        if found := problems(props):
            raise ValueError("GrpoJob: " + "; ".join(f"{key}: {reason}" for key, reason in found))
        given = _given(props)
        # A preview's unknown values are kept as they are (the outputs echo them unknown), never judged.
        unknown = {key: value for key, value in given.items() if is_unknown(value)}
        known = {key: value for key, value in given.items() if key not in unknown}
        spec = cls.model_validate({**known, **{key: _PREVIEW_STAND_INS[key] for key in unknown if key in _REQUIRED}})
        return spec.model_copy(update=unknown) if unknown else spec

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
        command = head_access.dashboard_command(self.stack) if self.head_service else None
        return {**self.model_dump(), "submission_id": submission_id, "status": status,
                "dashboard_command": command, "fabric_busbw_gbps": fabric_busbw_gbps,
                "export_outcome": export_outcome}

    @property
    def fabric(self) -> fabric.FabricCheck:
        return fabric.FabricCheck(
            nodes=self.expected_workers, gpus_per_node=self.expected_gpus // max(1, self.expected_workers),
            min_busbw_gbps=self.fabric_min_busbw_gbps, backend=self.fabric_backend, python=self.fabric_python,
            runtime_env=self.fabric_runtime_env, timeout_s=self.fabric_timeout_s, transports=self.fabric_transports)


SPEC_KEYS = tuple(JobSpec.model_fields)
DEFAULTS: dict[str, Any] = {key: None if info.is_required() else info.get_default(call_default_factory=True)
                            for key, info in JobSpec.model_fields.items()}
_REQUIRED = tuple(key for key, info in JobSpec.model_fields.items() if info.is_required())
_PREVIEW_STAND_INS: dict[str, Any] = {"entrypoint": "unknown", "runtime_env": {}}
"""What a required prop unknown at preview is validated as (its output stays unknown)."""


def is_unknown(value: Any) -> bool:
    """A preview placeholder at any depth: the rpc sentinel string or pulumi's Unknown object."""
    if isinstance(value, Unknown) or (isinstance(value, str) and value == rpc.UNKNOWN):
        return True
    if isinstance(value, Mapping):
        return any(is_unknown(item) for item in value.values())
    if isinstance(value, list | tuple):
        return any(is_unknown(item) for item in value)
    return False


def spec_props(props: Mapping[str, Any]) -> dict[str, Any]:
    """The spec part of stored outputs (without the outputs and the serialized provider)."""
    return {key: props[key] for key in SPEC_KEYS if key in props}


def _given(props: Mapping[str, Any]) -> dict[str, Any]:
    """The props the model judges: unset (None) optional ones take their defaults."""
    return {key: value for key, value in props.items() if key not in (*OUTPUT_KEYS, provider_reference.KEY)
            and (value is not None or key in _REQUIRED)}


def problems(props: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every bad prop as (key, reason), the model's then the rules across props; unknown (preview)
    values are not judged."""
    unknown = {key for key, value in props.items() if is_unknown(value)}
    known = {key: value for key, value in props.items() if key not in unknown}
    found: list[tuple[str, str]] = []
    try:
        JobSpec.model_validate({key: value for key, value in _given(props).items() if key not in unknown})
    except ValidationError as error:
        for item in error.errors():
            key = str(item["loc"][0])
            if key in unknown:
                continue
            reason = ("is required" if item["type"] == "missing"
                      else f"not a GrpoJob prop (allowed: {', '.join(SPEC_KEYS)})" if item["type"] == "extra_forbidden"
                      else item["msg"])
            found.append((key, reason))
    if not unknown & set(ACCESS_KEYS) and not known.get("dashboard_url"):
        endpoint = known.get("cluster_endpoint")
        # The DNS endpoint's certificate is publicly trusted: no CA needed there.
        optional = ("cluster_ca_certificate",) if isinstance(endpoint, str) and is_dns_endpoint(endpoint) else ()
        missing = [key for key in ACCESS_KEYS[1:] if not known.get(key) and key not in optional]
        if missing:
            found.append(("dashboard_url", "unset, so the head is reached by a port-forward through the cluster's "
                                           f"API, which needs {', '.join(missing)}"))
    if known.get("fabric_check") and not known.get("expected_workers", 1):
        found.append(("fabric_check", "needs expected_workers: the nodes to measure across"))
    return found
