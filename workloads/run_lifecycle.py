"""The run lifecycle the GrpoJob provider (`pulumi up`) and the run supervisor (in the cluster) share.

Standard library only: it ships into the cluster beside workloads/run_supervisor.py.

One durable place holds the truth about a run: the run record, a ConfigMap of the stack's
namespace with one JSON document per run id, written only by compare-and-swap on the ConfigMap's
resourceVersion (the API server answers 409 Conflict to a write with a stale one). It holds the
run id, every attempt claimed (index, submission id, by whom, when, why), the budget's deadline, the
outcome, and whether the GPU workers were released. Before either party submits an attempt it
claims it in the record; the loser of a race adopts the winner's attempt. Nothing about a run lives
only in a process's memory or only in the Ray head's job table (a head restarted without GCS fault
tolerance knows no jobs).
"""

from __future__ import annotations

import json
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

DEADLINE_ENV = "MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
"""verl's legacy trainer saves a checkpoint when this epoch time is within one step (+60 s) of now."""
META_PREFIX = "verl-gke."
REQUEST_TIMEOUT_S = 30.0
LIVE = ("PENDING", "RUNNING")
"""Ray job states of a run that holds, or is about to hold, the GPUs."""
RECORD_KEY_SUFFIX = ".json"
CAS_TRIES = 8
"""Compare-and-swap rounds before a write gives up (each loses only to another writer's success)."""
SUBMIT_RETRY_S = 60.0
"""How long a submission is retried while the head answers 5xx (its job agent still starting)."""
CLAIM_GRACE_S = 120.0
"""How long a claimed attempt may stay unsubmitted before another party submits it for the claimer
(which may have died between its claim and its submission)."""

# Outcomes a later `pulumi up` of the same run continues from: the run is not over.
DELETED = "stopped by pulumi (delete or replace)"
DEPLOY_FAILED = "deploy failed before any attempt ran"
SUCCEEDED = "succeeded"
REOPENABLE = (DELETED, DEPLOY_FAILED)


@dataclass(frozen=True)
class Capacity:
    """What the head sees: GPU workers alive, GPUs among them, and nodes it lost. The one count
    the job provider's readiness gate, `verl-gke status` and the supervisor share."""

    workers: int
    gpus: float
    dead: int

    def short_of(self, workers: int, gpus: float) -> str:
        """'' when whole, else what is missing, e.g. '1 of 2 GPU workers, 8 of 16 GPUs'."""
        if self.workers >= workers and self.gpus >= gpus:
            return ""
        return f"{self.workers} of {workers} GPU workers, {self.gpus:g} of {gpus:g} GPUs"


class RayJobs:
    """The head's job and state REST API (what ray.job_submission wraps), each call bounded."""

    def __init__(self, url: str, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        # A head with Ray's token authentication (Ray >= 2.52): the supervisor's pod gets the token as
        # KubeRay gives it to Ray's own processes; the deployer's requests get it from its local proxy.
        token = os.environ.get("RAY_AUTH_TOKEN")
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json", **self._auth})
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            return json.load(response)

    def jobs(self) -> dict[str, dict[str, Any]]:
        return {job["submission_id"]: job for job in self._call("GET", "/api/jobs/") if job.get("submission_id")}

    def submit(self, submission_id: str, entrypoint: str, runtime_env: dict[str, Any], metadata: dict[str, str],
               **resources: float) -> None:
        """`resources`: JobSubmitRequest's entrypoint_num_cpus, entrypoint_memory (bytes), ... (ray's
        dashboard/modules/job/common.py, in 2.47 and 2.60): Ray starts the driver on a node that has them."""
        self._call("POST", "/api/jobs/", {"submission_id": submission_id, "entrypoint": entrypoint,
                                          "runtime_env": runtime_env, "metadata": metadata, **resources})

    def upload_package(self, name: str, data: bytes) -> str:
        """Stores a zip in the head's GCS as `gcs://<name>` (what JobSubmissionClient does for a local
        working_dir: PUT /api/packages/gcs/<name>, ray's dashboard/modules/job/job_head.py) and
        returns that URI, which a runtime env's working_dir may name."""
        request = urllib.request.Request(f"{self.url}/api/packages/gcs/{urllib.parse.quote(name)}", data=data,
                                         method="PUT", headers={"Content-Type": "application/octet-stream",
                                                                **self._auth})
        with urllib.request.urlopen(request, timeout=self.timeout_s):
            return f"gcs://{name}"

    def stop(self, submission_id: str) -> None:
        self._call("POST", f"/api/jobs/{urllib.parse.quote(submission_id)}/stop")

    def capacity(self) -> Capacity:
        """The head's nodes: GPU workers are alive non-head nodes with GPUs (the head's own resources
        are not a worker's)."""
        reply = self._call("GET", f"/api/v0/nodes?limit=10000&timeout={max(1, int(self.timeout_s))}")
        nodes = reply["data"]["result"]["result"]
        alive = [n for n in nodes if n.get("state") == "ALIVE"]
        gpus = [float((n.get("resources_total") or {}).get("GPU", 0)) for n in alive if not n.get("is_head_node")]
        return Capacity(workers=sum(1 for g in gpus if g > 0), gpus=float(sum(gpus)), dead=len(nodes) - len(alive))


def attempt_submission(runtime_env: Mapping[str, Any], record: Mapping[str, str],
                       deadline: float | None) -> tuple[dict[str, Any], dict[str, str]]:
    """The runtime env and Ray job metadata an attempt is submitted with (by `pulumi up` or by the
    supervisor): `record` under META_PREFIX, and the budget's deadline in both (verl checkpoints
    before it; the supervisor stops the run at it)."""
    env = json.loads(json.dumps(dict(runtime_env)))
    metadata = {f"{META_PREFIX}{key}": value for key, value in record.items()}
    if deadline:
        env.setdefault("env_vars", {})[DEADLINE_ENV] = str(int(deadline))
        metadata[f"{META_PREFIX}budget_deadline"] = str(int(deadline))
    return env, metadata


def meta(job: Mapping[str, Any], key: str) -> str:
    return str((job.get("metadata") or {}).get(META_PREFIX + key, ""))


# --- the run record -------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    index: int
    """Position in the generation's submission ids (0: the first `pulumi up`)."""
    submission_id: str
    by: str
    """`pulumi-up` or `supervisor`."""
    at: float
    """When it was claimed (epoch seconds)."""
    cause: str
    reason: str = ""
    dead_nodes: int | None = None
    """Nodes the head had lost when the attempt was claimed: the baseline a later failure is judged by."""
    submitted: bool = False


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    generation: int = 0
    """verl-gke:jobAttempt: a bump starts the run's attempts over (same run id, same checkpoints)."""
    attempts: tuple[Attempt, ...] = ()
    deadline: float | None = None
    """The budget's end (epoch seconds), fixed when the generation's first attempt is claimed."""
    outcome: str = ""
    """Why the run ended ('' while it is not over)."""
    released: bool = False
    """The GPU workers were released after the outcome."""
    reopened_at: int = 0
    """The first attempt of the run since `pulumi up` last reopened it (those before were all stopped)."""
    waiting_since: float | None = None
    """Since when the supervisor waits for a whole cluster before the next attempt."""
    export_id: str = ""
    """The model export's Ray submission id, claimed once the run succeeded ('' before)."""
    export_target: str = ""
    """Where the export writes the model (the folder under the bucket's mount)."""
    export_at: float | None = None
    """When the export was claimed: its time bound starts there."""
    export_outcome: str = ""
    """'SUCCEEDED', or 'FAILED: <why>' ('' while the export is not over, or none was made)."""
    decisions: tuple[str, ...] = ()

    @property
    def newest(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunRecord:
        # A later verl-gke may add fields: read what this one knows (a rolling upgrade has both).
        data = _known(cls, json.loads(text))
        data["attempts"] = tuple(Attempt(**_known(Attempt, a)) for a in data.get("attempts", ()))
        data["decisions"] = tuple(data.get("decisions", ()))
        return cls(**data)

    def decided(self, decision: str, now: float) -> RunRecord:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        return replace(self, decisions=(*self.decisions, f"{stamp} {decision}")[-20:])


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {key: value for key, value in data.items() if key in names}


class Conflict(Exception):
    """The record changed since it was read (HTTP 409 on a stale resourceVersion)."""


class KubernetesApi:
    """Bounded JSON requests to the Kubernetes API. `token` is called per request (kubelet rotates
    the pod's token; the provider's comes from gke-gcloud-auth-plugin); None sends none (a
    `kubectl proxy`, or a test's stand-in)."""

    def __init__(self, url: str, token: Callable[[], str] | None = None, ca_file: str | None = None,
                 ca_data: str | None = None, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self.ca_file, self.ca_data = ca_file, ca_data

    @classmethod
    def in_cluster(cls) -> KubernetesApi:
        account = Path("/var/run/secrets/kubernetes.io/serviceaccount")
        return cls("https://kubernetes.default.svc", lambda: (account / "token").read_text().strip(),
                   ca_file=str(account / "ca.crt"))

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json") -> dict[str, Any] | None:
        """The reply, None for 404; Conflict for 409; other HTTP errors raise."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token()}"
        if body is not None:
            headers["Content-Type"] = content_type
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        context = (ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_data)
                   if (self.ca_file or self.ca_data) else None)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=context) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            if error.code == 409:
                raise Conflict(f"{method} {path}: {error.code} {error.reason}") from None
            raise


class RecordStore:
    """Run records by run id, with the version they were read at."""

    def load(self) -> tuple[dict[str, RunRecord], str | None]:
        raise NotImplementedError

    def save(self, records: Mapping[str, RunRecord], version: str | None) -> None:
        """Writes all records if nothing changed since `version` (None: nothing existed); else Conflict."""
        raise NotImplementedError

    def get(self, run_id: str) -> RunRecord | None:
        return self.load()[0].get(run_id)

    def update(self, run_id: str, change: Callable[[RunRecord | None], RunRecord | None]) -> RunRecord | None:
        """Applies `change` to the run's current record and writes the result by compare-and-swap,
        reading again and re-applying after each conflict; returns the record as stored."""
        for _ in range(CAS_TRIES):
            records, version = self.load()
            old = records.get(run_id)
            new = change(old)
            if new is None or new == old:
                return old
            try:
                self.save({**records, run_id: new}, version)
            except Conflict:
                continue
            return new
        raise Conflict(f"run record of {run_id}: still changing after {CAS_TRIES} tries")


class ConfigMapRecords(RecordStore):
    """The records in one ConfigMap (`data["<run id>.json"]`), replaced (PUT) with the resourceVersion
    read, created (POST) when absent. Rights needed: get and update on it; create when it is new."""

    def __init__(self, api: KubernetesApi, namespace: str, name: str) -> None:
        self.api, self.namespace, self.name = api, namespace, name

    @property
    def _path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps"

    def load(self) -> tuple[dict[str, RunRecord], str | None]:
        found = self.api.request("GET", f"{self._path}/{self.name}")
        if found is None:
            return {}, None
        data = found.get("data") or {}
        records = {key.removesuffix(RECORD_KEY_SUFFIX): RunRecord.from_json(text)
                   for key, text in data.items() if key.endswith(RECORD_KEY_SUFFIX)}
        return records, found["metadata"]["resourceVersion"]

    def save(self, records: Mapping[str, RunRecord], version: str | None) -> None:
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": self.name, "namespace": self.namespace,
                         "labels": {"app.kubernetes.io/name": "verl-gke",
                                    "app.kubernetes.io/component": "run-record"}},
            "data": {f"{run_id}{RECORD_KEY_SUFFIX}": record.to_json() for run_id, record in records.items()},
        }
        if version is None:
            # Two creators: the API server answers the second 409 AlreadyExists.
            self.api.request("POST", self._path, body)
        else:
            body["metadata"]["resourceVersion"] = version
            self.api.request("PUT", f"{self._path}/{self.name}", body)


class MemoryRecords(RecordStore):
    """Records in this process only: for a provider that has no Kubernetes API to keep them in
    (only `dashboard_url` given); the head's job table is then the only other truth."""

    def __init__(self) -> None:
        self._records: dict[str, RunRecord] = {}
        self._version = 0

    def load(self) -> tuple[dict[str, RunRecord], str | None]:
        return dict(self._records), (str(self._version) if self._version else None)

    def save(self, records: Mapping[str, RunRecord], version: str | None) -> None:
        if version != (str(self._version) if self._version else None):
            raise Conflict("stale version")
        self._records, self._version = dict(records), self._version + 1


# --- the transitions both parties make ---------------------------------------------------------


def begin(store: RecordStore, run_id: str, generation: int, now: float) -> RunRecord:
    """The run's record for `generation`: created when new, started over when the generation is
    newer, reopened when an earlier `pulumi up` ended it without the run itself ending; a record of a
    newer generation is returned as it is."""

    def change(record: RunRecord | None) -> RunRecord:
        if record is None or record.generation < generation:
            return RunRecord(run_id=run_id, generation=generation).decided(
                f"generation {generation} begun by pulumi-up", now)
        if record.generation > generation:
            return record  # a newer generation's: not an older spec's to reopen (the caller refuses)
        if record.outcome in REOPENABLE:
            return replace(record, outcome="", released=False, waiting_since=None,
                           reopened_at=len(record.attempts)).decided(
                f"reopened by pulumi-up after: {record.outcome}", now)
        return record

    result = store.update(run_id, change)
    assert result is not None
    return result


def claim(store: RecordStore, run_id: str, attempt: Attempt, budget_s: float) -> tuple[RunRecord, bool]:
    """Claims `attempt` (its index is the next of the generation) before it is submitted; the
    generation's first claim fixes the budget's deadline. Returns the record and whether this
    claim won: False when another party claimed that index (or a later one) first, or the run ended."""
    won = False

    def change(record: RunRecord | None) -> RunRecord | None:
        nonlocal won
        won = False
        if record is None or record.outcome or len(record.attempts) != attempt.index:
            return None
        won = True
        deadline = record.deadline or (attempt.at + budget_s if budget_s else None)
        return replace(record, attempts=(*record.attempts, attempt), deadline=deadline,
                       waiting_since=None).decided(
            f"{attempt.by} claimed attempt {attempt.index} ({attempt.submission_id}, {attempt.cause})", attempt.at)

    record = store.update(run_id, change)
    if record is None:
        raise Conflict(f"run record of {run_id} is gone")
    return record, won


def mark_submitted(store: RecordStore, run_id: str, index: int) -> None:
    def change(record: RunRecord | None) -> RunRecord | None:
        if record is None or len(record.attempts) <= index or record.attempts[index].submitted:
            return None
        attempts = list(record.attempts)
        attempts[index] = replace(attempts[index], submitted=True)
        return replace(record, attempts=tuple(attempts))

    store.update(run_id, change)


def end(store: RecordStore, run_id: str, outcome: str, now: float, released: bool = False,
        generation: int | None = None) -> RunRecord | None:
    """Records the run's outcome (the first one stays); with `generation`, only that generation's."""

    def change(record: RunRecord | None) -> RunRecord | None:
        if record is None or record.outcome or generation not in (None, record.generation):
            return None
        return replace(record, outcome=outcome, released=released).decided(f"run ended: {outcome}", now)

    store.update(run_id, change)
    return store.get(run_id)


def submit_claimed(ray: RayJobs, store: RecordStore, record: RunRecord, attempt: Attempt, entrypoint: str,
                   runtime_env: Mapping[str, Any], extra_metadata: Mapping[str, str] | None = None) -> None:
    """Submits a claimed attempt under its id (Ray refuses a second job under one id, so two parties
    submitting the same claim start one run) and marks it submitted."""
    env, metadata = attempt_submission(runtime_env, {
        "attempt": str(attempt.index), "cause": attempt.cause, "reason": attempt.reason,
        "dead_nodes": "" if attempt.dead_nodes is None else str(attempt.dead_nodes),
        "run_id": record.run_id}, record.deadline)
    give_up = time.monotonic() + SUBMIT_RETRY_S
    while True:
        try:
            ray.submit(attempt.submission_id, entrypoint, env, {**(extra_metadata or {}), **metadata})
            break
        except urllib.error.HTTPError as error:
            error.close()
            if attempt.submission_id in ray.jobs():
                break  # submitted by the other party meanwhile
            # A head that just started answers 500 "No available agent to submit job" for a while.
            if error.code < 500 or time.monotonic() >= give_up:
                raise
            time.sleep(1.0)
    mark_submitted(store, record.run_id, attempt.index)


def claim_export(store: RecordStore, run_id: str, submission_id: str, target: str, now: float) -> RunRecord:
    """Claims the model export of a succeeded run (the first claim stays, with its time); returns the
    record as stored, whoever claimed."""

    def change(record: RunRecord | None) -> RunRecord | None:
        if record is None or record.outcome != SUCCEEDED or record.export_id:
            return None
        return replace(record, export_id=submission_id, export_target=target, export_at=now).decided(
            f"model export claimed ({submission_id} into {target})", now)

    record = store.update(run_id, change)
    if record is None:
        raise Conflict(f"run record of {run_id} is gone")
    return record


def end_export(store: RecordStore, run_id: str, outcome: str, now: float) -> RunRecord | None:
    """Records the export's outcome (the first one stays)."""

    def change(record: RunRecord | None) -> RunRecord | None:
        if record is None or record.export_outcome:
            return None
        return replace(record, export_outcome=outcome).decided(f"model export ended: {outcome}", now)

    return store.update(run_id, change)


@dataclass
class Backoff:
    """Capped exponential backoff for a loop that must go on after any error."""

    base_s: float
    cap_s: float
    failures: int = field(default=0)

    def next(self) -> float:
        self.failures += 1
        return min(self.cap_s, self.base_s * 2 ** (self.failures - 1))

    def reset(self) -> None:
        self.failures = 0
