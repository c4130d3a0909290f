"""The run lifecycle: one pure `decide(view)` that the GrpoJob provider (`pulumi up`) and the run
supervisor (in the cluster) share, and the step that reads the world, decides, writes the records
and only then acts.

Standard library only: it ships into the cluster beside workloads/run_supervisor.py. One process
decides for a RayCluster's runs at a time, the holder of its Lease (workloads/run_lease.py); desired
state comes only from the stack, observed state is written only by the holder, and no decision
compares two machines' clocks. The rules in full: docs/run-lifecycle.md.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from workloads.kube import REQUEST_TIMEOUT_S, Conflict, Invalid
from workloads.run_lease import UNANSWERED_ANNOTATION
from workloads.run_record import (
    REASON_CHARS,
    RUNNING,
    STOPPED,
    Attempt,
    Ended,
    Gone,
    Outcome,
    RunRecord,
    Stored,
    start_of,
    to_prune,
)

DEADLINE_ENV = "MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
"""verl's legacy trainer saves a checkpoint when this epoch time is within one step (+60 s) of now."""
META_PREFIX = "verl-gke."
LIVE = ("PENDING", "RUNNING")
"""Ray job states of a job that holds, or is about to hold, the GPUs."""
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
MAX_BACKOFF_S = 1800.0
"""The longest wait between two retries of a run that failed by itself."""
SUBMIT_RETRY_S = 60.0
"""How long a submission is retried while the head answers 5xx (its job agent still starting)."""
LOG_LINES = 200
EXPORT_PREFIX = "verl-export-"
"""workloads.export_model.SUBMISSION_PREFIX (the lifecycle imports no export code)."""

# Every outcome the decider records is made here (workloads/run_record.py maps 0.8.0's texts to them).
# REOPENABLE: those a later `pulumi up` of the same run continues from (the run is not over).
DELETED = Outcome(Ended.STOPPED, "StackDeleted", "stopped by pulumi (delete or replace)")
DEPLOY_FAILED = Outcome(Ended.FAILED, "DeployFailed", "deploy failed before any attempt ran")
SUCCEEDED = Outcome(Ended.SUCCEEDED, "Succeeded", "succeeded")
UNTRACED = Outcome(Ended.LOST, "RecordLost", "no record of it and no job of it on the Ray head")
"""Recorded by the decider for the stack's run when the GPU workers are up with no record of any run
and nothing on the head (its record and the head's job table were lost, or a first `pulumi up`
stopped before the job's create)."""
UNANSWERED = Outcome(Ended.LOST, "RecordLostHeadSilent", "no record of it, and the Ray head did not answer")
"""Recorded by the decider for the stack's run when, with no record of any run, the head has not answered
for the replace window (its record lost while the head is unreachable): the outage then counts on it."""
REOPENABLE = (DELETED, DEPLOY_FAILED, UNTRACED, UNANSWERED)
FORGOTTEN = "not on the Ray head when the record was rebuilt (it restarted since)"
HELD_FOR_CREATE = (DELETED, UNTRACED)
"""Outcomes whose GPUs stay for the replace window: a create may follow and reopen the run."""
STALLED = "stalled"
USER_STOPPED = Outcome(Ended.STOPPED, "StopAsked", "stopped by verl-gke stop")
"""The user's `verl-gke stop` asked for it (desired stopped in the record): not reopened by a later `up`."""


def stopped_outside(submission_id: str) -> Outcome:
    """Stopped by someone other than the decider (a hand stop, e.g. `ray job stop`)."""
    return Outcome(Ended.STOPPED, "StoppedOutside", f"{submission_id} was stopped")


def budget_spent(budget_s: float) -> Outcome:
    return Outcome(Ended.OVER_BUDGET, "BudgetSpent", f"budget of {budget_s:g} s spent")


def head_outage(outage_s: float) -> Outcome:
    """The head did not answer for runHeadOutageSeconds."""
    return Outcome(Ended.LOST, "HeadOutage", f"the Ray head did not answer for {outage_s:.0f} s")


def failed(reason: str, message: str) -> Outcome:
    return Outcome(Ended.FAILED, reason, message)


@dataclass(frozen=True)
class Capacity:
    """What the head sees: GPU workers alive, GPUs among them, and nodes it lost. The one count
    the job provider's readiness gate, `verl-gke status` and the decider share."""

    workers: int
    gpus: float
    dead: int

    def short_of(self, workers: int, gpus: float) -> str:
        """'' when whole, else what is missing, e.g. '1 of 2 GPU workers, 8 of 16 GPUs'."""
        if self.workers >= workers and self.gpus >= gpus:
            return ""
        return f"{self.workers} of {workers} GPU workers, {self.gpus:g} of {gpus:g} GPUs"


@dataclass(frozen=True)
class LogState:
    """What a live attempt's driver log says: its newest training step (verl's console logger writes
    `step:N - ...`, verl/utils/logger/aggregate_logger.py) and whether a checkpoint is being written
    (verl's `_save_checkpoint` prints `local_global_step_folder: ...` first and the step's metrics
    after it, verl/trainer/ppo/ray_trainer.py in 0.6.1 and 0.9.0)."""

    step: int | None = None
    saving: bool = False


_STEP = re.compile(r"(?:^|\s)step:(\d+)\b")
_SAVE = "local_global_step_folder:"


def log_state(lines: list[str]) -> LogState:
    step, saving = None, False
    for line in lines:
        if (found := _STEP.search(line)) is not None:
            step, saving = int(found.group(1)), False
        elif _SAVE in line:
            saving = True
    return LogState(step, saving)


class RayJobs:
    """The head's job and state REST API (what ray.job_submission wraps), each call bounded. The
    head's clock (its HTTP `Date`) is kept from the last answer: the cluster's clock."""

    def __init__(self, url: str, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.head_time: float | None = None
        # A head with Ray's token authentication (Ray >= 2.52): the supervisor's pod gets the token as
        # KubeRay gives it to Ray's own processes; the deployer's requests get it from its local proxy.
        token = os.environ.get("RAY_AUTH_TOKEN")
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}

    def send(self, method: str, path: str, data: bytes | None, content_type: str) -> tuple[bytes, str | None]:
        """One request: (the body, the `Date` header); urllib's errors raise."""
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": content_type, **self._auth})
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            return response.read(), response.headers.get("Date")

    def _call(self, method: str, path: str, body: Any = None, raw: bool = False,
              content_type: str = "application/json") -> Any:
        data = body if raw else (None if body is None else json.dumps(body).encode())
        payload, date = self.send(method, path, data, content_type)
        if date:
            self.head_time = email.utils.parsedate_to_datetime(date).timestamp()
        return payload if raw else json.loads(payload)

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
        self._call("PUT", f"/api/packages/gcs/{urllib.parse.quote(name)}", data, raw=True,
                   content_type="application/octet-stream")
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

    def log_tail(self, job: Mapping[str, Any], lines: int = LOG_LINES) -> list[str]:
        """The last lines of a job's driver log, cut by the head (the log may be GBs)."""
        if not job.get("driver_node_id"):
            return []
        text = self._call("GET", driver_log_path(job, lines, self.timeout_s), raw=True).decode(errors="replace")
        return without_rays_echo(text, job).splitlines()[-lines:]


def _rays_echo(job: Mapping[str, Any]) -> str:
    """Ray's own line in a driver log, which its supervisor flushes only once the driver runs (ray's
    job_supervisor.py _exec_entrypoint): a driver that writes at once can have it after, or inside, its last line."""
    return f"Running entrypoint for job {job.get('submission_id')}: {job.get('entrypoint')}\n"


def driver_log_path(job: Mapping[str, Any], lines: int, timeout_s: float) -> str:
    """The head's log API request for the last `lines` of the driver's own output (room for Ray's echo)."""
    query = urllib.parse.urlencode({"submission_id": job["submission_id"], "node_id": job["driver_node_id"],
                                    "lines": lines + _rays_echo(job).count("\n"), "timeout": int(timeout_s)})
    return f"/api/v0/logs/file?{query}"


def without_rays_echo(text: str, job: Mapping[str, Any]) -> str:
    """A driver log's tail without Ray's echo of the entrypoint, wherever it landed."""
    echo = _rays_echo(job)
    return text[:at] + text[at + len(echo):] if (at := text.rfind(echo)) >= 0 else text


def meta(job: Mapping[str, Any], key: str) -> str:
    return str((job.get("metadata") or {}).get(META_PREFIX + key, ""))


def attempt_submission(runtime_env: Mapping[str, Any], record: RunRecord, attempt: Attempt,
                       head_time: float | None) -> tuple[dict[str, Any], dict[str, str]]:
    """The runtime env and Ray job metadata an attempt is submitted with: its run id, generation and
    index (a lost record is rebuilt from them), why it was submitted, and with a budget the deadline
    on the head's clock (verl checkpoints before it)."""
    env = json.loads(json.dumps(dict(runtime_env)))
    metadata = {f"{META_PREFIX}{key}": value for key, value in {
        "run_id": record.run_id, "generation": str(record.generation), "attempt": str(attempt.index),
        "cause": attempt.cause, "reason": attempt.reason,
        "dead_nodes": "" if attempt.dead_nodes is None else str(attempt.dead_nodes)}.items()}
    if record.budget_s and head_time is not None:
        deadline = str(int(head_time + max(0.0, record.budget_s - record.budget_used_s)))
        env.setdefault("env_vars", {})[DEADLINE_ENV] = deadline
        metadata[f"{META_PREFIX}budget_deadline"] = deadline
    return env, metadata


# --- the transitions ---------------------------------------------------------------------------


def opened(record: RunRecord | None, run_id: str, generation: int, budget_s: float, start_from: str = "") -> RunRecord:
    """`pulumi up`'s create: the run's record for `generation`, desired running: new when there is
    none or the generation is newer, reopened when an earlier `pulumi up` ended it without the run
    itself ending (its attempts then count from here); a newer generation's, or an older one that has
    not ended (its attempt may be live), is returned as it is."""
    if record is None or (record.generation < generation and record.outcome):
        return RunRecord(run_id=run_id, generation=generation, budget_s=budget_s, start_from=start_from).decided(
            f"generation {generation} begun by pulumi-up")
    if record.generation != generation:
        return record
    # A recorded stop (`verl-gke stop`) is never cleared here: only a new generation clears it.
    if record.outcome in REOPENABLE and (record.desired != STOPPED or record.outcome in (DELETED, UNANSWERED)):
        return replace(record, desired=RUNNING, outcome=None, released=False, waiting_s=0.0, stopped_s=0.0,
                       outage_s=0.0, stall_s=0.0, last_step=None, grace_s=0.0, budget_s=budget_s,
                       opened_at=len(record.attempts)).decided(f"reopened by pulumi-up after: {record.outcome}")
    return replace(record, budget_s=budget_s) if not record.outcome else record


def claimed(record: RunRecord, attempt: Attempt) -> RunRecord:
    """`attempt` claimed before it is submitted (its index is the next of the generation)."""
    assert attempt.index == len(record.attempts) and not record.outcome
    return replace(record, attempts=(*record.attempts, attempt), waiting_s=0.0, stall_s=0.0, last_step=None).decided(
        f"{attempt.by} claimed attempt {attempt.index} ({attempt.submission_id}, {attempt.cause})")


def ended(record: RunRecord, outcome: Outcome) -> RunRecord:
    """The run's outcome (the first one stays)."""
    if record.outcome:
        return record
    return replace(record, outcome=outcome).decided(f"run ended: {outcome}")


def stopped_by_stack(record: RunRecord) -> RunRecord:
    """`pulumi destroy` or a replace's delete: desired stopped, and the run ended (reopenable, unless the
    user's stop came first: a replace's create must not undo it)."""
    if record.outcome and not provisional(record):
        return record  # over already: its `desired` stays as the user left it
    return replace(ended(record, USER_STOPPED if record.desired == STOPPED else DELETED), desired=STOPPED)


def provisional(record: RunRecord) -> bool:
    """A run recorded lost while its head did not answer, not released yet: the head may still answer
    with its attempts, and the record is then rebuilt from them (Decider._repair)."""
    return record.outcome == UNANSWERED and not record.released


def stop_asked(record: RunRecord) -> RunRecord | None:
    """`verl-gke stop`: desired stopped, for the run's decider to act on (None: ended or asked already)."""
    if (record.outcome and not provisional(record)) or record.desired == STOPPED:
        return None
    return replace(record, desired=STOPPED).decided("stop asked (verl-gke stop)")


def submitted(record: RunRecord, index: int) -> RunRecord:
    attempts = list(record.attempts)
    attempts[index] = replace(attempts[index], submitted=True)
    return replace(record, attempts=tuple(attempts))


def rebuilt(run_id: str, generation: int, budget_s: float, jobs: Mapping[str, Mapping[str, Any]]) -> RunRecord | None:
    """A lost record of `run_id` from the head's job table: each attempt carries its run id,
    generation and index in its metadata. None when the head knows none of its attempts."""
    found = sorted(((int(meta(j, "generation") or 0), int(meta(j, "attempt") or 0), sid, j)
                    for sid, j in jobs.items() if meta(j, "run_id") == run_id and meta(j, "attempt").isdigit()))
    if not found:
        return None
    # The generation the head runs, else its newest (the stack's may not have begun: an older one's).
    live = [gen for gen, _index, _sid, job in found if job.get("status") in LIVE]
    newest_generation = live[-1] if live else found[-1][0]
    mine = [(index, sid, j) for gen, index, sid, j in found if gen == newest_generation]
    attempts: list[Attempt] = []
    for index, sid, job in mine:
        cause = meta(job, "cause") or "pulumi-up"
        attempt = Attempt(index=index, submission_id=sid, by="pulumi-up" if cause == "pulumi-up" else "supervisor",
                          cause=cause, reason=meta(job, "reason"),
                          dead_nodes=int(meta(job, "dead_nodes")) if meta(job, "dead_nodes").isdigit() else None,
                          submitted=True)
        if index < len(attempts):
            # One index under two ids (a record lost before the create that reused it): the live one.
            if job.get("status") in LIVE:
                attempts[index] = attempt
            continue
        # Attempts a restarted head no longer knows keep their places (the next index is the next id).
        attempts.extend(Attempt(index=i, submission_id="", by="", cause="", reason=FORGOTTEN, submitted=True)
                        for i in range(len(attempts), index))
        attempts.append(attempt)
    known = sum(1 for a in attempts if a.submission_id)
    # The run counts its retries and preemptions from the oldest attempt the head knows.
    return RunRecord(run_id=run_id, generation=newest_generation, budget_s=budget_s if newest_generation == generation
                     else 0.0, attempts=tuple(attempts), opened_at=mine[0][0]).decided(
        f"record rebuilt from the head's job table ({known} attempts)")


def adopted(record: RunRecord, jobs: Mapping[str, Mapping[str, Any]]) -> RunRecord:
    """The record with the attempts of its run and generation that the head knows and the record does
    not (a record lost and begun again): the head's attempts, from their metadata, take the place of
    the record's. The run counts from the live one; with none live and nothing claimed since the run
    was opened, it counts from after them, so its next claim is past every index the head knows (an
    older live attempt never comes to stand behind a newer ended one)."""
    mine = {sid: job for sid, job in jobs.items() if meta(job, "run_id") == record.run_id
            and meta(job, "generation") == str(record.generation) and meta(job, "attempt").isdigit()}
    live = {sid for sid, job in mine.items() if job.get("status") in LIVE}
    named = {a.submission_id for a in record.attempts}
    behind = not record.opened and any(int(meta(job, "attempt")) >= len(record.attempts) for job in mine.values())
    if not live - named and not behind:
        return record
    found = rebuilt(record.run_id, record.generation, record.budget_s, mine)
    assert found is not None
    running = [a.index for a in found.attempts if a.submission_id in live]
    if running:
        return replace(record, attempts=found.attempts, opened_at=min(record.opened_at, running[0])).decided(
            f"adopted {found.attempts[running[0]].submission_id}, live on the head and not in the record")
    return replace(record, attempts=found.attempts, opened_at=len(found.attempts)).decided(
        f"the head knows ended attempts up to {len(found.attempts) - 1} not in the record: the next is "
        f"attempt {len(found.attempts)}")


# --- decide ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """What the stack wants of the run it names, and its limits (the supervisor's config)."""

    run_id: str
    generation: int
    submission_ids: tuple[str, ...]
    expected_workers: int = 0
    expected_gpus: int = 0
    max_retries: int = 2
    max_preemptions: int = 10
    backoff_s: float = 120.0
    budget_s: float = 0.0
    budget_grace_s: float = 900.0
    settle_s: float = 60.0
    capacity_timeout_s: float = 7200.0
    head_outage_s: float = 1800.0
    stall_s: float = 0.0
    replace_window_s: float = 600.0
    export: bool = False
    export_timeout_s: float = 4 * 3600.0
    release_workers: bool = True


@dataclass(frozen=True)
class View:
    """Everything one decision reads."""

    records: Mapping[str, RunRecord]
    """Every run's record on the cluster, by run id."""
    policy: Policy | None
    """The run the supervisor's config names (None: a decider with no run of its own)."""
    jobs: Mapping[str, Mapping[str, Any]] | None
    """The head's job table; None: the head did not answer."""
    capacity: Capacity | None
    cluster: str
    """workloads.kube.cluster_state: absent, suspended, suspending, resuming, running."""
    elapsed_s: float = 0.0
    """The decider's own monotonic time since its previous step (0 right after it took the Lease)."""
    ended_for_s: Mapping[str, float] = field(default_factory=dict)
    """How long this process has seen each ended job ended (its own clock; restarts with it)."""
    logs: Mapping[str, LogState] = field(default_factory=dict)
    """The driver logs of live attempts, by submission id."""
    export_ids: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """run id -> (export submission id, target) for the runs whose success is exported."""
    by: str = "supervisor"
    unanswered_s: float = 0.0
    """How long this decider has seen no record of any run and no answer from the head (its own clock,
    since it took the Lease)."""


@dataclass(frozen=True)
class Effect:
    """An action on the world, taken after the records say so: submit, stop, submit-export, suspend, resume."""

    kind: str
    run_id: str = ""
    submission_id: str = ""


@dataclass
class _Decision:
    view: View
    records: dict[str, RunRecord]
    effects: list[Effect] = field(default_factory=list)

    def end(self, record: RunRecord, outcome: Outcome) -> RunRecord:
        record = ended(record, replace(outcome, message=outcome.message[:REASON_CHARS]))
        self.records[record.run_id] = record
        return record


def decide(view: View) -> tuple[dict[str, RunRecord], list[Effect]]:
    """The records as they should be (only changed ones) and the actions to take after writing them."""
    decision = _Decision(view, dict(view.records))
    for run_id in sorted(view.records):
        record = view.records[run_id]
        if not record.outcome:
            _open_run(decision, record)
        else:
            # Over (its budget, a delete whose stop did not reach the head, a stop while a reopening create
            # adopted an earlier opening's attempt): nothing of it may run on.
            _stop_last_live(decision, record)
    _untraced(decision)
    _release(decision)
    changed = {k: v for k, v in decision.records.items() if view.records.get(k) != v}
    return changed, decision.effects


def _status(view: View, attempt: Attempt) -> str | None:
    job = (view.jobs or {}).get(attempt.submission_id)
    return None if job is None else str(job.get("status"))


def _stop_last_live(d: _Decision, record: RunRecord) -> None:
    """Stop the run's last attempt if the head shows it live: the last, not the newest since the opening, as a
    reopening create may have adopted an earlier opening's attempt."""
    last = record.attempts[-1] if record.attempts else None
    if d.view.jobs is not None and last is not None and _status(d.view, last) in LIVE:
        d.effects.append(Effect("stop", record.run_id, last.submission_id))


def others_live(jobs: Mapping[str, Mapping[str, Any]], record: RunRecord, stack: str,
                known: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Jobs of another run or generation of this cluster (ids under the stack's prefix `stack`, or of a
    run with a record here: an attempt, or a model export) live on the head: one cluster runs one
    attempt at a time, and a run never starts beside another (they would share the GPUs)."""
    return sorted(sid for sid, job in jobs.items() if job.get("status") in LIVE and meta(job, "run_id")
                  and (sid.startswith(stack) or meta(job, "run_id") in known) and (
                      meta(job, "run_id") != record.run_id
                      or meta(job, "generation") not in ("", str(record.generation)) or sid.startswith(EXPORT_PREFIX)))


def stack_prefix(submission_ids: tuple[str, ...] | list[str]) -> str:
    """`verl-grpo-<stack>-`: what every attempt id of the stack starts with (domain/run_identity.py)."""
    return submission_ids[0].rsplit("-", 1)[0] + "-" if submission_ids else "\0"


def _others(view: View, record: RunRecord) -> list[str]:
    ids = view.policy.submission_ids if view.policy else tuple(a.submission_id for a in record.attempts)
    return others_live(view.jobs or {}, record, stack_prefix(ids), set(view.records))


def _supervised(view: View, record: RunRecord) -> bool:
    policy = view.policy
    return policy is not None and policy.run_id == record.run_id and policy.generation == record.generation


def _open_run(d: _Decision, record: RunRecord) -> None:
    view = d.view
    if record.desired == STOPPED:
        # `verl-gke stop`: the run ends; its live attempt is stopped (checkpoints stay), then the release.
        _stop_last_live(d, record)
        d.end(record, USER_STOPPED)
        return
    supervised = _supervised(view, record)
    if view.jobs is None:
        # Neither live nor ended: nothing is submitted, stopped or ended until the outage bound.
        record = replace(record, outage_s=record.outage_s + view.elapsed_s)
        d.records[record.run_id] = record
        bound = view.policy.head_outage_s if view.policy else 0.0
        if bound and record.outage_s >= bound:
            d.end(record, head_outage(record.outage_s))
        elif view.cluster == "suspended" and supervised and record.newest is not None:
            d.effects.append(Effect("resume", record.run_id))  # its head is gone: the run needs it back
        return
    if record.outage_s:
        record = replace(record, outage_s=0.0)
    record = adopted(record, view.jobs)
    d.records[record.run_id] = record
    attempt = record.newest
    if attempt is None:
        # Begun (or reopened) and nothing claimed, while this decider holds the Lease: the create that
        # began it is over.
        d.end(record, DEPLOY_FAILED)
        return
    status = _status(view, attempt)
    if status is not None and not attempt.submitted:
        record = submitted(record, attempt.index)
    budget_s = record.budget_s
    if budget_s:
        record = replace(record, budget_used_s=record.budget_used_s + view.elapsed_s)
    d.records[record.run_id] = record
    if status is None and not attempt.submitted:
        if supervised and _others(view, record):
            return  # another run's job holds the cluster: not beside it
        if supervised and not (budget_s and record.budget_used_s >= budget_s):
            d.records[record.run_id] = record.decided(f"attempt {attempt.index} ({attempt.submission_id}) was "
                                                      "claimed and not submitted: submitting it")
            d.effects.append(Effect("submit", record.run_id, attempt.submission_id))
        else:
            d.end(record, failed("NeverSubmitted", f"attempt {attempt.index} ({attempt.submission_id}) was claimed "
                                                   "and never submitted"))
        return
    if budget_s and record.budget_used_s >= budget_s:
        _budget(d, record, attempt, status)
        return
    if status in LIVE:
        if supervised:
            _watch_progress(d, record, attempt)
        return
    if not supervised:
        _watched_end(d, record, attempt, status)
        return
    if status is None:
        _next(d, record, "node-lost", f"the Ray head no longer knows {attempt.submission_id}: it restarted")
        return
    if status == "SUCCEEDED":
        d.end(record, SUCCEEDED)
    elif status == "STOPPED" and attempt.stopped_for != STALLED:
        d.end(record, stopped_outside(attempt.submission_id))
    else:
        _after_failure(d, record, attempt)


def _watched_end(d: _Decision, record: RunRecord, attempt: Attempt, status: str | None) -> None:
    """A run the stack no longer names (its run id or jobAttempt changed and the `up` failed before
    the job's replace): never resubmitted nor resumed; ended once its attempt ended."""
    if status == "SUCCEEDED":
        d.end(record, SUCCEEDED)
        return
    named = d.view.policy
    now = (f"jobAttempt {named.generation} of {named.run_id}" if named else "no run")
    d.end(record, failed("NoLongerNamed", f"jobAttempt {record.generation} of {record.run_id} ended while the stack "
                                          f"names {now}, so none of its attempts is resubmitted: "
                                          f"{attempt.submission_id} {status or 'lost with the head'}"))


def _watch_progress(d: _Decision, record: RunRecord, attempt: Attempt) -> None:
    """A live attempt with no new training step for the stall bound is stopped, as a failure."""
    policy, log = d.view.policy, d.view.logs.get(attempt.submission_id)
    if policy is None or not policy.stall_s or log is None:
        return
    if log.step != record.last_step:
        d.records[record.run_id] = replace(record, last_step=log.step, stall_s=0.0)
        return
    record = replace(record, stall_s=record.stall_s + d.view.elapsed_s)
    if record.stall_s < policy.stall_s:
        d.records[record.run_id] = record
        return
    attempts = list(record.attempts)
    attempts[attempt.index] = replace(attempt, stopped_for=STALLED)
    d.records[record.run_id] = replace(record, attempts=tuple(attempts)).decided(
        f"{attempt.submission_id} made no training step for {record.stall_s:.0f} s (last: {log.step}): stopping it")
    d.effects.append(Effect("stop", record.run_id, attempt.submission_id))


def _budget(d: _Decision, record: RunRecord, attempt: Attempt, status: str | None) -> None:
    """Past the budget: no new attempt; the live one gets the grace to write its deadline checkpoint,
    and is never stopped while a save is under way (unless it outlasts a second grace)."""
    grace = d.view.policy.budget_grace_s if d.view.policy else 0.0
    if status in LIVE:
        record = replace(record, grace_s=record.grace_s + d.view.elapsed_s)
        d.records[record.run_id] = record
        saving = (log := d.view.logs.get(attempt.submission_id)) is not None and log.saving
        if record.grace_s < grace or (saving and record.grace_s < 2 * grace):
            return
        d.effects.append(Effect("stop", record.run_id, attempt.submission_id))
    d.end(record, budget_spent(record.budget_s))


def _after_failure(d: _Decision, record: RunRecord, attempt: Attempt) -> None:
    view, policy = d.view, d.view.policy
    assert policy is not None
    job = (view.jobs or {}).get(attempt.submission_id) or {}
    seen_s = view.ended_for_s.get(attempt.submission_id, 0.0)
    if seen_s < policy.settle_s:
        return  # let the head notice lost nodes first
    message = (job.get("message") or "").splitlines()[0] if job.get("message") else ""
    if attempt.stopped_for == STALLED:
        message = f"no training step for {policy.stall_s:g} s"
    reason = f"after {attempt.submission_id}: {message}"[:REASON_CHARS]
    capacity = view.capacity
    lost = capacity is not None and (bool(capacity.short_of(policy.expected_workers, policy.expected_gpus)) or (
        attempt.dead_nodes is not None and capacity.dead > attempt.dead_nodes))
    if lost and attempt.stopped_for != STALLED:
        _next(d, record, "node-lost", reason)
        return
    retries = sum(1 for a in record.opened if a.cause == "run-failed")
    if retries >= policy.max_retries:
        d.end(record, failed("RetriesSpent", f"failed by itself {retries + 1} times: {message}"))
        return
    if seen_s < min(MAX_BACKOFF_S, policy.backoff_s * 2 ** retries):
        return
    _next(d, record, "run-failed", reason)


def _next(d: _Decision, record: RunRecord, cause: str, reason: str) -> None:
    """The next attempt, once the cluster is whole (within capacity_timeout_s)."""
    view, policy = d.view, d.view.policy
    assert policy is not None
    index = len(record.attempts)
    if index >= len(policy.submission_ids):
        d.end(record, failed("SubmissionIdsSpent", f"no submission id left after {index} attempts"))
        return
    if cause == "node-lost" and sum(1 for a in record.opened if a.cause == "node-lost") >= policy.max_preemptions:
        d.end(record, failed("PreemptionsSpent", f"lost nodes {policy.max_preemptions} times"))
        return
    if view.capacity is None or _others(view, record):
        return  # another run's job holds the cluster: wait for its end (its own decider ends it)
    if short := view.capacity.short_of(policy.expected_workers, policy.expected_gpus):
        waited = record.waiting_s + view.elapsed_s
        if waited >= policy.capacity_timeout_s:
            d.end(record, failed("CapacityTimeout", f"the cluster was not whole within {policy.capacity_timeout_s:g} s "
                                                    f"({short})"))
        elif not record.waiting_s:
            d.records[record.run_id] = replace(record, waiting_s=max(waited, 1e-9)).decided(
                f"{reason}; waiting up to {policy.capacity_timeout_s:g} s for a whole cluster ({short})")
        else:
            d.records[record.run_id] = replace(record, waiting_s=waited)
        return
    attempt = Attempt(index=index, submission_id=policy.submission_ids[index], by=view.by, cause=cause, reason=reason,
                      dead_nodes=view.capacity.dead)
    d.records[record.run_id] = claimed(record, attempt)
    d.effects.append(Effect("submit", record.run_id, attempt.submission_id))


def _untraced(d: _Decision) -> None:
    """GPU workers up, no record of any run on the cluster and no job live on the head that answers:
    nothing to rebuild a run from, and nothing to decide by. The stack's run is recorded as lost
    (only a create reopens it, never the decider) and released as a run a delete stopped: after the
    replace window, so a first `pulumi up` on its way to the job's create keeps its GPUs. With a head
    that does not answer either, it is recorded once the silence has lasted the replace window, with
    the silence as its outage so far: the release then waits for the outage bound (a live attempt may
    be behind the silence)."""
    view, policy = d.view, d.view.policy
    if d.records or policy is None or not policy.release_workers or view.cluster not in ("running", "resuming"):
        return
    if view.jobs is None:
        if view.unanswered_s < policy.replace_window_s:
            return
        before = view.unanswered_s - view.elapsed_s  # this step's time is the release's to add, as for any record
        d.records[policy.run_id] = ended(RunRecord(
            run_id=policy.run_id, generation=policy.generation, budget_s=policy.budget_s, outage_s=before).decided(
            f"no record of {policy.run_id} and the Ray head has not answered for {view.unanswered_s:.0f} s: "
            f"recorded lost; the GPU workers go once it has not answered for {policy.head_outage_s:g} s, unless "
            "it answers with the run's jobs (the record is then rebuilt from them) or a `pulumi up` that recreates "
            "the job restarts the run"), UNANSWERED)
        return
    if view.capacity is None or not view.capacity.workers \
            or any(job.get("status") in LIVE for job in view.jobs.values()):
        return
    d.records[policy.run_id] = ended(RunRecord(
        run_id=policy.run_id, generation=policy.generation, budget_s=policy.budget_s).decided(
        f"no record of {policy.run_id} and no job of it on the Ray head with {view.capacity.workers} GPU workers "
        "up (the record and the head's job table lost, or `pulumi up` stopped before the job's create): recorded "
        f"lost; the workers go after {policy.replace_window_s:g} s unless a create reopens it"), UNTRACED)


def _release(d: _Decision) -> None:
    """Once every run on the cluster ended (and its export is over), suspend the RayCluster when no
    job may run; after the release, keep it suspended until a new run begins."""
    view, policy = d.view, d.view.policy
    records = d.records
    if not records or policy is None or not policy.release_workers:
        return
    if any(not r.outcome for r in records.values()):
        return
    pending = [r for r in records.values() if not r.released]
    for record in pending:
        if view.jobs is None and view.cluster not in ("suspended", "absent"):
            records[record.run_id] = record = replace(record, outage_s=record.outage_s + view.elapsed_s)
        elif view.jobs is not None and record.outage_s:
            records[record.run_id] = record = replace(record, outage_s=0.0)  # it answered: a silence counts anew
        if record.outcome in HELD_FOR_CREATE and record.stopped_s < policy.replace_window_s:
            records[record.run_id] = replace(record, stopped_s=record.stopped_s + view.elapsed_s)
    if any(r.outcome in HELD_FOR_CREATE and r.stopped_s < policy.replace_window_s
           for r in records.values() if not r.released):
        return  # a (replace's) create may be about to reopen it: the GPUs stay for it
    for record in list(records.values()):
        if not record.released and not _exported(d, record):
            return
    pending = [r for r in records.values() if not r.released]
    headless = view.cluster in ("suspended", "absent", "suspending")
    live = [sid for sid, job in (view.jobs or {}).items() if job.get("status") in LIVE
            and sid not in {r.export_id for r in records.values() if r.export_outcome}]
    # Past the outage bound by every pending record's count: a record begun during the silence (a create
    # that failed) counts less of it, and the head's silence is only known from the shortest count.
    quiet = headless or (view.jobs is not None and not live) or (pending and all(
        r.outage_s >= policy.head_outage_s for r in pending))
    if pending and quiet:
        for record in pending:
            records[record.run_id] = replace(record, released=True).decided("GPU workers released")
        if view.cluster not in ("suspended", "suspending", "absent"):
            d.effects.append(Effect("suspend"))
    elif not pending and view.cluster in ("running", "resuming"):
        # A release is final until a new run begins: a recreated (or hand-resumed) cluster goes again,
        # once no job may run on it. A head that does not answer may hide a live attempt whose record
        # was lost: it goes only past the outage bound, counted on the released records.
        if view.jobs is None:
            for record in list(records.values()):
                records[record.run_id] = replace(record, outage_s=record.outage_s + view.elapsed_s)
            if any(r.outage_s >= policy.head_outage_s for r in records.values()):
                d.effects.append(Effect("suspend"))
            return
        for record in [r for r in records.values() if r.outage_s]:
            records[record.run_id] = replace(record, outage_s=0.0)
        if not live:
            d.effects.append(Effect("suspend"))


def _exported(d: _Decision, record: RunRecord) -> bool:
    """Whether the run's model export is over (or none is due); advances it otherwise. The time
    bound is checked before the head is asked."""
    view, policy = d.view, d.view.policy
    assert policy is not None
    target = view.export_ids.get(record.run_id)
    if record.outcome != SUCCEEDED or record.export_outcome or target is None or not policy.export:
        return True
    export_id, where = target
    if not record.export_id:
        d.records[record.run_id] = replace(record, export_id=export_id, export_target=where).decided(
            f"model export claimed ({export_id} into {where})")
        d.effects.append(Effect("submit-export", record.run_id, export_id))
        return False
    record = replace(record, export_s=record.export_s + view.elapsed_s)
    d.records[record.run_id] = record
    if record.export_s >= policy.export_timeout_s:
        if view.jobs is not None and (view.jobs.get(record.export_id) or {}).get("status") in LIVE:
            d.effects.append(Effect("stop", record.run_id, record.export_id))
        d.records[record.run_id] = _export_ended(record, f"FAILED: not done within {policy.export_timeout_s:g} s")
        return True
    if view.jobs is None:
        return False
    job = view.jobs.get(record.export_id)
    if job is None:
        # Not submitted yet, or a restarted head forgot it (its driver died with it): submit.
        d.effects.append(Effect("submit-export", record.run_id, record.export_id))
        return False
    status = job.get("status")
    if status in LIVE:
        return False
    if status == "SUCCEEDED":
        d.records[record.run_id] = _export_ended(record, "SUCCEEDED")
        return True
    # Ray's message ends with the driver's last log line: export_model's one-line reason.
    message = (job.get("message") or "").strip().splitlines()
    d.records[record.run_id] = _export_ended(record, f"FAILED: {message[-1] if message else status}"[:REASON_CHARS])
    return True


def _export_ended(record: RunRecord, outcome: str) -> RunRecord:
    return replace(record, export_outcome=outcome).decided(f"model export ended: {outcome}")


# --- the step ----------------------------------------------------------------------------------


class Hands(Protocol):
    """The decider's actions on the world, taken only after the records say so."""

    def submit(self, record: RunRecord, attempt: Attempt) -> None: ...

    def submit_export(self, record: RunRecord) -> str:
        """'' once submitted (or submitted before); else why the head refused it."""

    def stop(self, submission_id: str) -> None: ...

    def set_suspended(self, suspended: bool) -> bool: ...


class Store(Protocol):
    def list(self) -> dict[str, Stored]: ...

    def get(self, run_id: str) -> Stored: ...

    def write(self, stored: Stored, record: RunRecord) -> Stored: ...

    def delete(self, stored: Stored) -> None: ...

    def legacy(self, run_id: str) -> RunRecord | None: ...


class LeaseLike(Protocol):
    acquired: int

    def hold(self) -> bool: ...

    def check(self) -> None: ...


def submit_attempt(ray: RayJobs, record: RunRecord, attempt: Attempt, entrypoint: str,
                   runtime_env: Mapping[str, Any], extra_metadata: Mapping[str, str] | None = None,
                   check: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> None:
    """Submits a claimed attempt under its id: Ray refuses a second job under one id, so a second
    submission of one claim starts nothing (its refusal is taken as done). `check` (the Lease's) runs
    before every try: a retry never lands after another decider may have taken over. `clock` and
    `sleep` pace the retries (the interleaving tests' world clock)."""
    env, metadata = attempt_submission(runtime_env, record, attempt, ray.head_time)
    give_up = clock() + SUBMIT_RETRY_S
    while True:
        check()
        try:
            ray.submit(attempt.submission_id, entrypoint, env, {**(extra_metadata or {}), **metadata})
            return
        except urllib.error.HTTPError as error:
            error.close()
            if attempt.submission_id in ray.jobs():
                return  # submitted before (a step or a create that died after it)
            # A head that just started answers 500 "No available agent to submit job" for a while.
            if error.code < 500 or clock() >= give_up:
                raise
            sleep(1.0)


@dataclass
class Decider:
    """One process's steps as the cluster's decider: the supervisor's loop runs them; the tests
    interleave them with the provider's."""

    records: Store
    lease: LeaseLike
    ray: RayJobs
    hands: Hands
    cluster: Callable[[], str]
    policy: Policy | None
    export_ids: Callable[[RunRecord], tuple[str, str] | None] = lambda _r: None
    clock: Callable[[], float] = time.monotonic
    log: Callable[[str], None] = print
    _last: tuple[int, float] | None = None
    """(the Lease acquisition it counts from, the monotonic time of the previous step)."""
    _ended_seen: dict[str, float] = field(default_factory=dict)
    _unanswered_s: float = 0.0

    def step(self) -> bool:
        """One look at every run of the cluster, and what it calls for; False when this process is not
        the decider now."""
        if not self.lease.hold():
            self._last = None
            return False
        now = self.clock()
        held = self._last is not None and self._last[0] == self.lease.acquired
        elapsed = now - self._last[1] if held and self._last else 0.0
        self._last = (self.lease.acquired, now)
        stored = self.records.list()
        cluster = self.cluster()
        over = all(s.record is not None and s.record.outcome and s.record.released for s in stored.values())
        # A suspended (or deleted) cluster has no head: once every run is over there is nothing to ask.
        jobs = {} if over and cluster in ("suspended", "absent") else self._jobs()
        stored = self._repair(stored, jobs)
        records = {run_id: s.record for run_id, s in stored.items() if s.record is not None}
        if jobs is None and not records:
            # Counted on from the Lease's note when this process (re)took it: the bound holds across holders.
            carried = getattr(self.lease, "annotations", {}).get(UNANSWERED_ANNOTATION, "")
            base = self._unanswered_s if held else float(carried or 0.0)
            self._unanswered_s = base + elapsed
        else:
            self._unanswered_s = 0.0
        carry = getattr(self.lease, "carry", None)
        if carry is not None:
            carry[UNANSWERED_ANNOTATION] = f"{self._unanswered_s:g}" if self._unanswered_s else ""
        capacity = self.ray.capacity() if jobs is not None and (not records or any(
            not r.outcome for r in records.values())) else None
        for sid, job in (jobs or {}).items():
            if job.get("status") in TERMINAL:
                self._ended_seen.setdefault(sid, now)
        logs = self._logs(records, jobs)
        view = View(records=records, policy=self.policy, jobs=jobs, capacity=capacity, cluster=cluster,
                    elapsed_s=elapsed, ended_for_s={sid: now - t for sid, t in self._ended_seen.items()},
                    logs=logs, export_ids={r.run_id: e for r in records.values() if (e := self.export_ids(r))},
                    by=self.lease_role, unanswered_s=self._unanswered_s)
        changed, effects = decide(view)
        for run_id, record in changed.items():
            self.lease.check()
            # A record decided into being is created: one made since the list wins (409). One that is
            # not a record (broken JSON, immutable) is replaced.
            target = stored.get(run_id) or Stored(run_id, None, self.records.get(run_id).name)
            if target.broken:
                self.records.delete(target)
                target = Stored(run_id, None, target.name)
            stored[run_id] = self.records.write(target, record)
            known = records[run_id].decisions if run_id in records else ()
            for line in record.decisions[len(known):]:
                self.log(f"run decider: {run_id}: {line.split(' ', 1)[1]}")
        for effect in effects:
            self.lease.check()
            self._act(effect, stored)
        for old in to_prune(stored):
            self.lease.check()
            self.records.delete(old)
        return True

    @property
    def lease_role(self) -> str:
        return getattr(self.lease, "role", "supervisor")

    def _jobs(self) -> dict[str, dict[str, Any]] | None:
        try:
            return self.ray.jobs()
        except (OSError, ValueError, http.client.HTTPException) as error:  # HTTPError, URLError are OSErrors
            self.log(f"run decider: the Ray head did not answer: {error!r}"[:REASON_CHARS])
            return None

    def _logs(self, records: Mapping[str, RunRecord], jobs: Mapping[str, Any] | None) -> dict[str, LogState]:
        if jobs is None or self.policy is None:
            return {}
        out = {}
        for record in records.values():
            newest = record.newest
            job = jobs.get(newest.submission_id) if newest else None
            if job is not None and job.get("status") == "RUNNING" and not record.outcome and (
                    self.policy.stall_s or record.budget_s):
                try:
                    out[newest.submission_id] = log_state(self.ray.log_tail(job))
                except (OSError, ValueError) as error:
                    self.log(f"run decider: the driver log of {newest.submission_id} is not readable: {error}")
        return out

    def _repair(self, stored: dict[str, Stored], jobs: Mapping[str, Any] | None) -> dict[str, Stored]:
        """A broken record (not JSON, or immutable) is replaced; the named run's missing record is
        rebuilt from 0.5.1's record or from the head's job table; a provisional lost record gives way to
        what the head knows of its run."""
        for run_id, found in list(stored.items()):
            if jobs is None or found.record is None or not provisional(found.record):
                continue
            # The head answers again: rebuilt from its attempts of the run (live or ended; a stop asked
            # meanwhile carried), or, when it knows none, dropped: the rules for no record apply again.
            record = rebuilt(run_id, found.record.generation, found.record.budget_s, jobs)
            self.lease.check()
            if record is None:
                self.records.delete(found)
                del stored[run_id]
                self.log(f"run decider: {run_id}: the Ray head answers and knows none of its attempts: the lost "
                         "record is dropped")
                continue
            if found.record.desired == STOPPED:
                record = replace(record, desired=STOPPED).decided("a stop asked while the head did not answer")
            stored[run_id] = self.records.write(found, record)
        for run_id, found in list(stored.items()):
            if not found.broken:
                continue
            record = found.record or (rebuilt(run_id, self.policy.generation if self.policy else 0,
                                              self.policy.budget_s if self.policy else 0.0, jobs) if jobs else None)
            if record is None and jobs is None:
                continue  # nothing to rebuild from yet
            self.lease.check()
            self.records.delete(found)
            self.log(f"run decider: run record {found.name} was {'immutable' if found.immutable else 'not a record'}: "
                     "replaced")
            record = record or RunRecord(run_id=run_id).decided("record lost; the head knows none of its attempts")
            stored[run_id] = self.records.write(Stored(run_id, None, found.name), record)
        # The named run, and any run live on the head, without a record: from 0.5.1's, or from the head.
        policy = self.policy
        live = {meta(j, "run_id"): int(meta(j, "generation") or 0) for j in (jobs or {}).values()
                if j.get("status") in LIVE and meta(j, "run_id") and meta(j, "attempt").isdigit()}
        wanted = dict(live)
        if policy is not None:
            wanted.setdefault(policy.run_id, policy.generation)
        for run_id, generation in wanted.items():
            found = stored[run_id].record if run_id in stored else None
            # A record begun for another generation while this one's attempt runs (its record was lost,
            # then a later `up` began one) gives way to the live generation's, if it ran nothing.
            replaced = found is not None and live.get(run_id) == generation != found.generation \
                and not any(a.submitted for a in found.attempts)
            if run_id in stored and not replaced:
                continue
            budget = policy.budget_s if policy is not None and policy.run_id == run_id else 0.0
            record = None if replaced else self.records.legacy(run_id)
            if record is None and jobs is not None:
                record = rebuilt(run_id, generation, budget, jobs)
            if record is not None:
                self.lease.check()
                stored[run_id] = self.records.write(self.records.get(run_id), record)
        return stored

    def _act(self, effect: Effect, stored: Mapping[str, Stored]) -> None:
        if effect.kind == "suspend":
            self.hands.set_suspended(True)
        elif effect.kind == "resume":
            self.hands.set_suspended(False)
        elif effect.kind == "stop":
            self.ray.stop(effect.submission_id)
        else:
            record = stored[effect.run_id].record
            assert record is not None
            if effect.kind == "submit-export":
                refused = self.hands.submit_export(record)
                if refused:
                    self.lease.check()
                    self.records.write(stored[effect.run_id], _export_ended(
                        record, f"FAILED: the head refused the export ({refused})"))
            else:
                attempt = next(a for a in record.attempts if a.submission_id == effect.submission_id)
                self.hands.submit(record, attempt)
                self.log(f"run decider: submitted {attempt.submission_id} (attempt {attempt.index}, {attempt.cause})")
                now = stored[effect.run_id]
                if now.record is not None and not now.record.attempts[attempt.index].submitted:
                    self.lease.check()
                    self.records.write(now, submitted(now.record, attempt.index))


def write_record(records: Store, run_id: str, change: Callable[[RunRecord | None], RunRecord | None],
                 lease: LeaseLike, tries: int = 8) -> RunRecord | None:
    """The provider's compare-and-swap: applies `change` to the record as read and writes it,
    reading again after a conflict; returns the record as stored. A broken record is replaced; an
    immutable one's content (a stop, its attempts) carries into the replacement."""
    kept: RunRecord | None = None
    for _ in range(tries):
        found = records.get(run_id)
        if found.broken and found.version is not None:
            lease.check()
            records.delete(found)
            kept = found.record or kept
            found = records.get(run_id)
        if found.version is None and kept is not None:
            found = replace(found, record=kept)
            new = change(kept) or kept  # the replacement is written even when `change` has nothing to add
        else:
            new = change(found.record)
            if new is None or new == found.record:
                return found.record
        lease.check()
        try:
            return records.write(found, new).record
        except (Conflict, Gone):
            continue
        except Invalid:
            raise
    raise Conflict(f"run record of {run_id}: still changing after {tries} tries")



# --- `pulumi up`'s create and delete, step by step -----------------------------------------------


@dataclass(frozen=True)
class RunSpec:
    """What `pulumi up` knows of the run it creates or deletes (the GrpoJob's props)."""

    run_id: str
    generation: int
    submission_ids: tuple[str, ...]
    entrypoint: str
    runtime_env: Mapping[str, Any]
    budget_s: float = 0.0
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Created:
    submission_id: str
    job: Mapping[str, Any] | None
    """The job adopted or submitted, as the head listed it (None: just submitted)."""
    done: bool = False
    """The run had already succeeded: nothing submitted."""


class Refused(RuntimeError):
    """The run cannot be created as asked (a newer generation, an ended run, no id or budget left)."""


def _current(record: RunRecord, jobs: Mapping[str, Mapping[str, Any]],
             run: RunSpec) -> tuple[str, Mapping[str, Any] | None]:
    """The attempt to adopt: the record's newest while it is live or succeeded; else the newest of the
    run's ids the head runs (a record that lives only for this call knows none)."""
    newest = record.newest
    if newest is not None and (job := jobs.get(newest.submission_id)) is not None \
            and job.get("status") in (*LIVE, "SUCCEEDED"):
        return newest.submission_id, job
    on_head = [sid for sid in run.submission_ids if sid in jobs]
    if on_head and (newest is None or on_head[-1] != newest.submission_id) \
            and jobs[on_head[-1]].get("status") in (*LIVE, "SUCCEEDED"):
        return on_head[-1], jobs[on_head[-1]]
    return run.submission_ids[0], None


def deploy_failed(records: Store, lease: LeaseLike, run_id: str, started: bool = False) -> RunRecord | None:
    """Ends the run when `create` fails before any attempt of it ran since it was last opened, or,
    `started`, when the one it started is stopped: the run's decider then releases the GPU workers."""
    def change(record: RunRecord | None) -> RunRecord | None:
        if record is None or record.outcome or not (started or not any(a.submitted for a in record.opened)):
            return None
        return ended(record, USER_STOPPED if record.desired == STOPPED else DEPLOY_FAILED)

    return write_record(records, run_id, change, lease)


def create_run(records: Store, lease: LeaseLike, run: RunSpec, reach: Callable[[], RayJobs],
               gates: Callable[[], None], clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> Iterator[str]:
    """`pulumi up`'s create while it holds the Lease, one step per write or action (the provider runs
    them through; a test interleaves them). Begins or reopens the run (desired running), then `reach`
    resumes the cluster and reaches its head, and it adopts the run's attempt or runs the deploy
    `gates` and submits: the claimed and unsubmitted attempt under its own id, else a new claim.
    Returns Created (StopIteration.value). Any failure before an attempt was submitted ends the run
    as a failed deploy."""
    before = records.get(run.run_id).record
    if before is not None and provisional(before):
        # Recorded lost while its head did not answer: reopened only once the head answers (it may answer
        # with the live attempt, and the decider rebuilds the record from it); until then it stays
        # provisional, its outage counting on.
        lease.check()
        reach()
        yield "reached"
    record = write_record(records, run.run_id, lambda r: opened(r, run.run_id, run.generation, run.budget_s,
                                                                 start_of(run.entrypoint)), lease)
    assert record is not None
    yield "opened"
    if record.generation < run.generation:
        raise Refused(f"jobAttempt {record.generation} of run {run.run_id} has not ended: `pulumi up` ends it (the "
                      "job's replace) before it begins a later one; its supervisor ends it when its attempt ends.")
    if record.generation > run.generation:
        raise Refused(f"run {run.run_id} is at jobAttempt {record.generation} in its run record, above this "
                      f"stack's jobAttempt {run.generation}. Set verl-gke:jobAttempt back to {record.generation}, or "
                      "above it to start a new generation.")
    if record.outcome == SUCCEEDED:
        return Created(record.attempts[-1].submission_id if record.attempts else run.submission_ids[0], None, True)
    if record.desired == STOPPED:
        _refuse_stopped(records, lease, run)
    if record.outcome:
        raise Refused(f"run {run.run_id} (jobAttempt {run.generation}) already ended: {record.outcome}. "
                      "Bump verl-gke:jobAttempt to run it again from its last checkpoint.")
    try:
        lease.check()
        ray = reach()
        yield "resumed"
        jobs = ray.jobs()
        if adopted(record, jobs) != record:
            record = write_record(records, run.run_id, lambda r: None if r is None else adopted(r, jobs), lease) or record
            yield "adopted"
        submission_id, job = _current(record, jobs, run)
        if job is None:
            gates()
            yield "gated"
            if others := others_live(ray.jobs(), record, stack_prefix(run.submission_ids), set(records.list())):
                raise Refused(f"another run's job is live on the cluster: {', '.join(others)}. Runs would share the "
                              "GPUs; let it end (its supervisor ends it) or stop it, and run again.")
            submission_id = yield from _submit(records, lease, ray, record, run, clock, sleep)
    except Exception:
        deploy_failed(records, lease, run.run_id)
        raise
    if job is not None and job.get("status") == "SUCCEEDED":
        write_record(records, run.run_id, lambda r: None if r is None else ended(r, SUCCEEDED), lease)
        yield "ended"
    return Created(submission_id, job)


def _submit(records: Store, lease: LeaseLike, ray: RayJobs, record: RunRecord, run: RunSpec,
            clock: Callable[[], float], sleep: Callable[[float], None]) -> Iterator[str]:
    if record.budget_s and record.budget_used_s >= record.budget_s:
        raise Refused(f"run {run.run_id}: its budget of {record.budget_s:g} s is spent; nothing submitted. Bump "
                      "verl-gke:jobAttempt for a new budget.")
    attempt = record.newest
    if attempt is None or attempt.submitted:
        index = len(record.attempts)
        if index >= len(run.submission_ids):
            raise Refused(f"run {run.run_id}: all {index} submission ids of jobAttempt {run.generation} are used; "
                          "bump verl-gke:jobAttempt")
        # The dead-node baseline a later failure of this attempt is judged by.
        new = Attempt(index=index, submission_id=run.submission_ids[index], by="pulumi-up", cause="pulumi-up",
                      dead_nodes=ray.capacity().dead)
        claim = write_record(records, run.run_id, lambda r: None if r is None or len(r.attempts) != index
                             or r.desired == STOPPED or r.outcome else claimed(r, new), lease)
        if claim is not None and claim.desired == STOPPED:
            _refuse_stopped(records, lease, run)
        if claim is None or len(claim.attempts) <= index or claim.attempts[index] != new:
            raise Conflict(f"run record of {run.run_id} changed under the Lease")
        record, attempt = claim, new
        yield "claimed"
    ray.jobs()  # the head's clock, for the budget's deadline
    now = records.get(run.run_id).record
    if now is None or now.desired == STOPPED:  # a stop that landed during the gates: nothing submitted
        _refuse_stopped(records, lease, run)
    lease.check()
    submit_attempt(ray, record, attempt, run.entrypoint, run.runtime_env, run.metadata, check=lease.check,
                   clock=clock, sleep=sleep)
    yield "submitted"
    write_record(records, run.run_id, lambda r: submitted(r, attempt.index)
                 if r is not None and len(r.attempts) > attempt.index else None, lease)
    yield "marked submitted"
    return attempt.submission_id


def _refuse_stopped(records: Store, lease: LeaseLike, run: RunSpec) -> None:
    deploy_failed(records, lease, run.run_id)
    raise Refused(f"run {run.run_id} (jobAttempt {run.generation}) was stopped by `verl-gke stop`: nothing submitted. "
                  "Bump verl-gke:jobAttempt to run it again from its last checkpoint.")


def fail_start(records: Store, lease: LeaseLike, ray: RayJobs, run_id: str, submission_id: str) -> Iterator[str]:
    """The attempt `create` submitted did not start in time: the run ends (a failed deploy, which a
    later `up` reopens) before the attempt is stopped, so nothing submits after it; yields until Ray
    says it ended (the caller bounds the wait)."""
    deploy_failed(records, lease, run_id, started=True)
    yield "ended"
    lease.check()
    ray.stop(submission_id)
    yield "stop sent"
    while (ray.jobs().get(submission_id) or {}).get("status") in LIVE:
        yield "waiting for the stop"


def delete_run(records: Store, lease: LeaseLike, run: RunSpec, reach: Callable[[], RayJobs],
               also: tuple[str, ...] = ()) -> Iterator[str]:
    """`pulumi destroy` or a replace's delete while it holds the Lease: desired stopped (the run ends,
    reopenably), then the head is reached and every attempt the record names (and `also`) is stopped;
    yields until Ray says each ended (the caller bounds the wait). The decider stops any it could not
    reach later."""
    record = write_record(records, run.run_id, lambda r: None if r is None else stopped_by_stack(r), lease)
    yield "stopped by the stack"
    if record is not None and record.released:
        return  # released only with no job live, and suspended since: nothing runs, no head to ask
    ray = reach()
    ids = tuple(dict.fromkeys((*also, *run.submission_ids, *(a.submission_id for a in (record.attempts if record else ())))))
    jobs = ray.jobs()
    newest = record.newest if record is not None else None
    if newest is not None and record is not None and record.outcome == DELETED \
            and (jobs.get(newest.submission_id) or {}).get("status") == "SUCCEEDED":
        # It had succeeded before the delete: a later `up` must not train it again.
        write_record(records, run.run_id, lambda r: None if r is None or r.outcome != DELETED else replace(
            r, outcome=SUCCEEDED).decided(f"{newest.submission_id} had succeeded before the delete"), lease)
        yield "succeeded before"
    for sid in ids:
        if (jobs.get(sid) or {}).get("status") in LIVE:
            lease.check()
            ray.stop(sid)
            yield "stop sent"
    while any((ray.jobs().get(sid) or {}).get("status") in LIVE for sid in ids):
        yield "waiting for the stops"


def suspended_by_stack(record: RunRecord, ray_cluster: str) -> RunRecord:
    """A delete that could not reach the head suspended the RayCluster instead (KubeRay deletes every pod,
    the head's too, so no attempt runs on): the run, stopped by the stack, is released. A create reopens it."""
    return replace(record, released=True).decided(
        f"pulumi-up suspended RayCluster {ray_cluster}: the Ray head did not answer, so every attempt stops with "
        "its pods")


def drive(steps: Iterator[str], sleep: Callable[[], None] = lambda: None, timeout_s: float | None = None,
          clock: Callable[[], float] = time.monotonic) -> Any:
    """Runs a step generator to its end, calling `sleep` after each waiting step (TimeoutError once
    its waits took `timeout_s`); returns its return value."""
    give_up = None if timeout_s is None else clock() + timeout_s
    while True:
        try:
            label = next(steps)
        except StopIteration as done:
            return done.value
        if label.startswith("waiting"):
            if give_up is not None and clock() >= give_up:
                raise TimeoutError(f"still {label.removeprefix('waiting for ')} after {timeout_s:g} s")
            sleep()
