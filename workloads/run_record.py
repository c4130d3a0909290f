"""The run record: one ConfigMap per run, the durable memory of the run lifecycle.

Standard library only: it ships into the cluster with the run supervisor. Desired state (run id,
generation, desired running or stopped, the budget) is written by the stack (the GrpoJob provider's
create and delete); every other field only by the holder of the cluster's Lease, through
workloads/run_lifecycle.decide. Every write is conditional on the resourceVersion read (409 when
another write came first). No field holds a time to compare with another machine's clock: durations
are accumulators advanced by the decider's own monotonic clock (docs/run-lifecycle.md).
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from workloads.kube import Conflict, Invalid, KubernetesApi

RECORD_KEY = "record.json"
COMPONENT = "run-record"
CLUSTER_LABEL = "verl-gke/ray-cluster"
RUN_ANNOTATION = "verl-gke/run-id"
MAX_RECORD_BYTES = 256 * 1024
"""Checked before every write: a quarter of the API server's 1 MiB object limit."""
DECISIONS_KEPT = 20
DECISION_CHARS = 300
REASON_CHARS = 500
ENDED_KEPT = 10
"""Ended runs whose records are kept (the newest by creationTimestamp); every open run is kept."""
LEGACY_SUFFIX = "-run"
"""0.5.1 kept every run in one ConfigMap `<rayClusterName>-run`, a key `<run id>.json` each."""

RUNNING, STOPPED = "running", "stopped"


class Ended(enum.Enum):
    """How a run ended (KubeRay's state beside a reason and a message): what `wait`'s exit status, the
    stack output grpoJobStatus and `runs` follow. The value is the word people read."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    OVER_BUDGET = "over budget"
    LOST = "lost"


@dataclass(frozen=True)
class Outcome:
    """Why a run ended: its state, a CamelCase reason for machines, a message for people."""

    state: Ended
    reason: str
    message: str

    def __str__(self) -> str:
        """The outcome in one phrase, as decisions, errors and 0.8.0's records say it."""
        return f"lost: {self.message}" if self.state is Ended.LOST else self.message

    @property
    def shown(self) -> str:
        """The state, then the message unless it says nothing more: 'LOST: the Ray head did not answer ...'."""
        label = self.state.value.upper()
        return label if self.message == self.state.value else f"{label}: {self.message}"

    @classmethod
    def from_text(cls, text: str) -> Outcome:
        """An outcome as 0.8.0 (and before) wrote it, free text: mapped here, once, by its whole wording."""
        for pattern, state, reason in _LEGACY:
            if (found := pattern.fullmatch(text)) is not None:
                return cls(state, reason, found.group("message"))
        return cls(Ended.FAILED, "Unrecognized", text)  # 0.8.0 read every other text as a failure


def _legacy(pattern: str, state: Ended, reason: str) -> tuple[re.Pattern[str], Ended, str]:
    return re.compile(pattern if "?P<message>" in pattern else f"(?P<message>{pattern})", re.DOTALL), state, reason


# 0.8.0's texts, each as workloads/run_lifecycle.py words it now (tests/test_run_lifecycle.py round-trips them).
_LEGACY = (
    _legacy("succeeded", Ended.SUCCEEDED, "Succeeded"),
    _legacy(r"stopped by pulumi \(delete or replace\)", Ended.STOPPED, "StackDeleted"),
    _legacy("stopped by verl-gke stop", Ended.STOPPED, "StopAsked"),
    _legacy(r"\S+ was stopped", Ended.STOPPED, "StoppedOutside"),
    _legacy(r"budget of \S+ s spent", Ended.OVER_BUDGET, "BudgetSpent"),
    _legacy("lost: (?P<message>no record of it and no job of it on the Ray head)", Ended.LOST, "RecordLost"),
    _legacy("lost: (?P<message>no record of it, and the Ray head did not answer)", Ended.LOST,
            "RecordLostHeadSilent"),
    _legacy("lost: (?P<message>.*)", Ended.LOST, "HeadOutage"),
    _legacy("deploy failed before any attempt ran", Ended.FAILED, "DeployFailed"),
    _legacy(r"attempt \d+ \(.*\) was claimed and never submitted", Ended.FAILED, "NeverSubmitted"),
    _legacy(r"jobAttempt \d+ of .* ended while the stack names .*", Ended.FAILED, "NoLongerNamed"),
    _legacy(r"failed by itself \d+ times: .*", Ended.FAILED, "RetriesSpent"),
    _legacy(r"no submission id left after \d+ attempts", Ended.FAILED, "SubmissionIdsSpent"),
    _legacy(r"lost nodes \d+ times", Ended.FAILED, "PreemptionsSpent"),
    _legacy(r"the cluster was not whole within .*", Ended.FAILED, "CapacityTimeout"),
)


@dataclass(frozen=True)
class Attempt:
    index: int
    """Position in the generation's submission ids (0: `pulumi up`'s)."""
    submission_id: str
    by: str
    """`pulumi-up` or `supervisor`."""
    cause: str
    """`pulumi-up`, `node-lost` or `run-failed`."""
    reason: str = ""
    dead_nodes: int | None = None
    """Nodes the head had lost when the attempt was claimed: the baseline a later failure is judged by."""
    submitted: bool = False
    stopped_for: str = ""
    """Why the decider stopped it ('stalled'): a stop of its own is a failure, not the run's end."""


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    generation: int = 0
    """verl-gke:jobAttempt: a bump starts the run's attempts over (same run id, same checkpoints)."""
    desired: str = RUNNING
    budget_s: float = 0.0
    """The stack's budget for the run (0: none); desired state like `desired`."""
    attempts: tuple[Attempt, ...] = ()
    opened_at: int = 0
    """The first attempt since the run was last opened: retries and preemptions count from it."""
    outcome: Outcome | None = None
    """Why the run ended (None while it has not)."""
    released: bool = False
    budget_used_s: float = 0.0
    grace_s: float = 0.0
    waiting_s: float = 0.0
    outage_s: float = 0.0
    stall_s: float = 0.0
    last_step: int | None = None
    stopped_s: float = 0.0
    export_id: str = ""
    export_target: str = ""
    export_s: float = 0.0
    export_outcome: str = ""
    """'SUCCEEDED', or 'FAILED: <why>' ('' while the export is not over, or none was made)."""
    decisions: tuple[str, ...] = ()
    start_from: str = ""
    """The run's lineage: the warm start it began from (start_of), "" for none."""

    @property
    def newest(self) -> Attempt | None:
        """The newest attempt since the run was last opened."""
        return self.attempts[-1] if len(self.attempts) > self.opened_at else None

    @property
    def job_status(self) -> str:
        """The run as a Ray job status: the stack output grpoJobStatus and `--json`'s status."""
        if self.outcome is None:
            return "RUNNING"
        return self.outcome.state.name if self.outcome.state in (Ended.SUCCEEDED, Ended.STOPPED) else "FAILED"

    @property
    def opened(self) -> tuple[Attempt, ...]:
        return self.attempts[self.opened_at:]

    def decided(self, decision: str, now: float | None = None) -> RunRecord:
        """With `decision` noted, stamped with the writer's clock (for people; never compared)."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))
        line = f"{stamp} {decision}"[:DECISION_CHARS]
        return replace(self, decisions=(*self.decisions, line)[-DECISIONS_KEPT:])

    def to_json(self) -> str:
        text = _json(self)
        record = self
        while len(text.encode()) > MAX_RECORD_BYTES and record.decisions:
            record = replace(record, decisions=record.decisions[1:])
            text = _json(record)
        return text

    @classmethod
    def from_json(cls, text: str) -> RunRecord:
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("run_id"), str):
            raise ValueError("not a run record")
        if data.get("version", 1) < 2:
            return _from_v1(data)
        # A later verl-gke may add fields: read what this one knows (a rolling upgrade has both).
        known = _known(cls, data)
        known["attempts"] = tuple(Attempt(**_known(Attempt, a)) for a in known.get("attempts", ()))
        known["decisions"] = tuple(known.get("decisions", ()))
        known["outcome"] = _outcome(data)
        return cls(**known)


def _json(record: RunRecord) -> str:
    """`outcome` keeps 0.8.0's text (a 0.8.0 reader in a rolling upgrade reads it as before); the state,
    reason and message beside it are what this version reads."""
    data: dict[str, Any] = {"version": 2, **asdict(record), "outcome": str(record.outcome or "")}
    if record.outcome is not None:
        data.update(outcome_state=record.outcome.state.name, outcome_reason=record.outcome.reason,
                    outcome_message=record.outcome.message)
    return json.dumps(data, sort_keys=True)


def _outcome(data: Mapping[str, Any]) -> Outcome | None:
    state = data.get("outcome_state")
    if state in Ended.__members__:
        return Outcome(Ended[state], str(data.get("outcome_reason", "")), str(data.get("outcome_message", "")))
    return Outcome.from_text(data["outcome"]) if data.get("outcome") else None  # 0.8.0's record


_START = re.compile(r"(?:^|\s)'?(?:trainer\.resume_from_path=\S*/(?P<run>run-[0-9a-f]{12})/global_step_(?P<step>[0-9]+)"
                    r"|actor_rollout_ref\.model\.path=\S*/(?P<model>models/run-[0-9a-f]{12}/model[^\s']*))")


def start_of(entrypoint: str) -> str:
    """The warm start in the run's command (verl-gke:startFrom, domain/start_from.py): `run <id> step <N>` or
    `model models/<run id>/model` (under the stack's bucket); "" for none."""
    found = _START.search(entrypoint)
    if found is None:
        return ""
    return f"model {found['model']}" if found["model"] else f"run {found['run']} step {found['step']}"


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {key: value for key, value in data.items() if key in names}


def _from_v1(data: Mapping[str, Any]) -> RunRecord:
    """0.5.1's record: its times were wall clocks (dropped); `reopened_at` is `opened_at`."""
    attempts = tuple(Attempt(index=a["index"], submission_id=a["submission_id"], by=a.get("by", ""),
                             cause=a.get("cause", ""), reason=a.get("reason", ""), dead_nodes=a.get("dead_nodes"),
                             submitted=bool(a.get("submitted"))) for a in data.get("attempts", ()))
    return RunRecord(run_id=data["run_id"], generation=int(data.get("generation", 0)), attempts=attempts,
                     opened_at=int(data.get("reopened_at", 0)), outcome=_outcome(data),
                     released=bool(data.get("released")), export_id=data.get("export_id", ""),
                     export_target=data.get("export_target", ""), export_outcome=data.get("export_outcome", ""),
                     decisions=tuple(data.get("decisions", ()))[-DECISIONS_KEPT:])


@dataclass(frozen=True)
class Stored:
    """A record as read: None when its text is not a record (a hand edit), with what a write needs."""

    run_id: str
    record: RunRecord | None
    name: str
    version: str | None = None
    """resourceVersion read (None: not stored yet)."""
    uid: str = ""
    created: str = ""
    immutable: bool = False

    @property
    def broken(self) -> bool:
        """Cannot be written in place: replaced (deleted with a uid precondition, then created)."""
        return self.record is None or self.immutable


class Gone(Exception):
    """The record was deleted between the read and the write (a PUT answered 404)."""


def record_name(ray_cluster: str, run_id: str) -> str:
    return f"{ray_cluster}-run-{hashlib.sha256(run_id.encode()).hexdigest()[:12]}"


@dataclass
class RecordStore:
    """The records of one RayCluster's runs, in ConfigMaps of its namespace. Rights: list, get,
    create, update and delete on ConfigMaps labelled as run records of this cluster."""

    api: KubernetesApi
    namespace: str
    ray_cluster: str

    @property
    def _path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps"

    @property
    def selector(self) -> str:
        return f"app.kubernetes.io/component={COMPONENT},{CLUSTER_LABEL}={self.ray_cluster}"

    def list(self) -> dict[str, Stored]:
        reply = self.api.request("GET", f"{self._path}?labelSelector={self.selector}") or {}
        found = [_stored(item) for item in reply.get("items") or []]
        return {s.run_id: s for s in found if s.run_id}

    def get(self, run_id: str) -> Stored:
        found = self.api.request("GET", f"{self._path}/{record_name(self.ray_cluster, run_id)}")
        return _stored(found) if found is not None else Stored(run_id, None, record_name(self.ray_cluster, run_id))

    def write(self, stored: Stored, record: RunRecord) -> Stored:
        """Writes `record` if nothing changed since `stored` was read: Conflict when something did, Gone
        when the record was deleted meanwhile; Invalid (422) is the API server's refusal."""
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": stored.name, "namespace": self.namespace,
                         "labels": {"app.kubernetes.io/name": "verl-gke", "app.kubernetes.io/component": COMPONENT,
                                    CLUSTER_LABEL: self.ray_cluster},
                         "annotations": {RUN_ANNOTATION: record.run_id}},
            "data": {RECORD_KEY: record.to_json()},
        }
        if len(body["data"][RECORD_KEY].encode()) > MAX_RECORD_BYTES:
            raise Invalid(f"run record {stored.name}: over {MAX_RECORD_BYTES} bytes even without its decisions")
        if stored.version is None:
            reply = self.api.request("POST", self._path, body)  # a second creator gets 409 AlreadyExists
        else:
            body["metadata"]["resourceVersion"] = stored.version
            reply = self.api.request("PUT", f"{self._path}/{stored.name}", body)
            if reply is None:
                raise Gone(f"run record {stored.name} was deleted meanwhile")
        assert reply is not None
        return _stored(reply)

    def delete(self, stored: Stored) -> None:
        """Deletes the record read, not one recreated since (a uid precondition: 409 otherwise)."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": stored.uid}}
        self.api.request("DELETE", f"{self._path}/{stored.name}", body)

    def legacy(self, run_id: str) -> RunRecord | None:
        """The run's entry in 0.5.1's single record ConfigMap, converted; None when there is none."""
        found = self.api.request("GET", f"{self._path}/{self.ray_cluster}{LEGACY_SUFFIX}")
        text = ((found or {}).get("data") or {}).get(f"{run_id}.json")
        try:
            return RunRecord.from_json(text) if text else None
        except (ValueError, KeyError, TypeError):
            return None


def _stored(obj: Mapping[str, Any]) -> Stored:
    meta = obj.get("metadata") or {}
    text = (obj.get("data") or {}).get(RECORD_KEY)
    try:
        record = RunRecord.from_json(text) if text else None
    except (ValueError, KeyError, TypeError):
        record = None
    run_id = (meta.get("annotations") or {}).get(RUN_ANNOTATION) or (record.run_id if record else "")
    return Stored(run_id=run_id, record=record, name=meta.get("name", ""), version=meta.get("resourceVersion"),
                  uid=meta.get("uid", ""), created=meta.get("creationTimestamp", ""),
                  immutable=bool(obj.get("immutable")))


@dataclass
class MemoryRecords:
    """Records in this process only: for a provider that has no Kubernetes API to keep them in
    (only `dashboard_url` given); the head's job table is then the only other truth."""

    ray_cluster: str = "memory"
    objects: dict[str, Stored] = field(default_factory=dict)
    serial: int = 0

    def list(self) -> dict[str, Stored]:
        return {s.run_id: s for s in self.objects.values()}

    def get(self, run_id: str) -> Stored:
        name = record_name(self.ray_cluster, run_id)
        return self.objects.get(name) or Stored(run_id, None, name)

    def write(self, stored: Stored, record: RunRecord) -> Stored:
        current = self.objects.get(stored.name)
        if (current.version if current else None) != stored.version:
            raise Conflict(f"run record {stored.name}: changed since it was read")
        self.serial += 1
        new = Stored(record.run_id, record, stored.name, str(self.serial), uid=stored.uid or str(self.serial),
                     created=stored.created or f"{self.serial:012d}")
        self.objects[stored.name] = new
        return new

    def delete(self, stored: Stored) -> None:
        self.objects.pop(stored.name, None)

    def legacy(self, run_id: str) -> RunRecord | None:
        return None


def to_prune(stored: Mapping[str, Stored]) -> list[Stored]:
    """Ended, released records beyond the newest ENDED_KEPT (by creationTimestamp, which the API
    server sets); open runs and broken records are never pruned here."""
    ended = [s for s in stored.values() if s.record is not None and s.record.outcome and s.record.released]
    ended.sort(key=lambda s: s.created, reverse=True)
    return ended[ENDED_KEPT:]
