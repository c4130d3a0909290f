"""The run as the user's handle: its record, its attempts, its logs in the bucket, and the commands
that follow it (`wait`), end it (`stop`) and list them (`runs`).

A run (`runId`) is durable; its Ray submission ids are not (a new one per attempt, gone with the
head). So the commands read the run's record, the ConfigMap `<rayClusterName>-run-<12 hex>` its one
decider keeps (workloads/run_record.py), through the Kubernetes API with the user's credentials (or
`--kube-api-url`), and, once the head is gone, its copy in the bucket (`logs/<run id>/record.json`,
workloads/run_logs.py). Exit statuses of `wait` by the run's outcome: EXIT_CODES.
"""

from __future__ import annotations

import argparse
import calendar
import json
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from domain import run_time
from verl_gke import gke_facts, metrics, stack_outputs
from access.cluster_api import cluster_api
from access.cluster_readiness import duration
from verl_gke.commands import run_tool
from verl_gke.console import CliError, HeadUnreachable, TimedOut, one_line, positive_float, print_rows, progress
from access.head_access import HeadAccessSetupError, OutageClock
from verl_gke.stack_outputs import StackOutputs
from workloads.kube import KubernetesApi
from workloads.run_lifecycle import SUCCEEDED, provisional, stop_asked, write_record
from workloads.run_logs import RECORD_FILE, attempt_file, run_folder
from workloads.run_record import Attempt, Ended, RecordStore, RunRecord, record_name

EXIT_FAILED, EXIT_STOPPED, EXIT_OVER_BUDGET, EXIT_LOST = 4, 5, 6, 7
EXIT_CODES = {Ended.SUCCEEDED: 0, Ended.FAILED: EXIT_FAILED, Ended.STOPPED: EXIT_STOPPED,
              Ended.OVER_BUDGET: EXIT_OVER_BUDGET, Ended.LOST: EXIT_LOST}
"""`wait`'s exit status by the state the run ended in (1, 2, 3, 8 and 130 are the CLI's own)."""
STOP_TIMEOUT_S = 900.0
"""How long `stop` waits for the decider to stop the attempt and release the GPU workers."""
KUBE_API_TIMEOUT_S = 30.0
"""The deadline of one Kubernetes API call for the run records."""
GCLOUD_TIMEOUT_S = 120.0
"""The deadline of one `gcloud storage cat` (a log copy is at most LOG_COPY_LINES lines)."""


class RunEnded(CliError):
    """`wait`: the run ended other than by success; its exit status says how."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class BucketCopy:
    """A run's folder `logs/<run id>/` in the bucket: under a local directory (`--bucket-dir`: a mount
    or a copy of the bucket), else read with `gcloud storage cat` and the user's credentials."""

    run_id: str
    bucket: str
    local: Path | None = None

    @property
    def folder(self) -> str:
        root = str(self.local) if self.local is not None else f"gs://{self.bucket}"
        return f"{root}/{run_folder(self.run_id)}/"

    def where(self, name: str) -> str:
        path = f"{run_folder(self.run_id)}/{name}"
        return str(self.local / path) if self.local is not None else f"gs://{self.bucket}/{path}"

    def read(self, name: str) -> str | None:
        """The object's text; None when there is none."""
        if self.local is not None:
            try:
                return Path(self.where(name)).read_text(encoding="utf-8", errors="replace")
            except FileNotFoundError:
                return None
            except OSError as error:
                raise CliError(f"cannot read {self.where(name)}: {error.strerror or error}") from None
        if not self.bucket:
            raise CliError("the stack outputs name no bucketName to read the run's logs from; pass --bucket-dir")
        try:
            return run_tool(["gcloud", "storage", "cat", self.where(name)], f"gcloud storage cat {self.where(name)}",
                            GCLOUD_TIMEOUT_S, CliError)
        except CliError as error:
            if "matched no objects" in str(error) or "No URLs matched" in str(error):
                return None
            raise
        except FileNotFoundError:
            raise CliError("gcloud not found on PATH: it reads the run's logs from the bucket (or pass "
                           "--bucket-dir)") from None

    def record(self) -> RunRecord | None:
        text = self.read(RECORD_FILE)
        try:
            return RunRecord.from_json(text) if text else None
        except (ValueError, KeyError, TypeError):
            raise CliError(f"{self.where(RECORD_FILE)} is not a run record") from None

    def attempt_log(self, attempt: Attempt) -> str | None:
        return self.read(attempt_file(attempt.index))


@dataclass
class Run:
    """Which run, and where its record and logs are read."""

    run_id: str
    outputs: StackOutputs
    bucket: BucketCopy
    open_store: Callable[[], RecordStore | None]

    @cached_property
    def store(self) -> RecordStore | None:
        """None: no Kubernetes API to read records through (`--dashboard-url` without `--kube-api-url`)."""
        return self.open_store()

    @property
    def record_name(self) -> str:
        return record_name(self.outputs.ray_cluster, self.run_id)

    def record(self) -> RunRecord | None:
        """The record as its decider keeps it."""
        if self.store is None:
            raise CliError(no_records(self.outputs, "this command"))
        return self.store.get(self.run_id).record


def run_of(run_id: str, outputs: StackOutputs, open_store: Callable[[], RecordStore | None],
           bucket_dir: str | None = None) -> Run:
    run_id = run_id or outputs.run_id
    return Run(run_id, outputs, BucketCopy(run_id, outputs.bucket_name, Path(bucket_dir) if bucket_dir else None),
               open_store)


class ApiUnreachable(CliError):
    """The Kubernetes API did not answer: `wait` rides it out for its outage window."""


class _UsersApi(KubernetesApi):
    """The Kubernetes API as the CLI reads the run records: what it cannot read is one line naming the API,
    what was read and what to do; a refused credential is said at once (no retry mends it)."""

    def __init__(self, api: KubernetesApi, named: str, outputs: StackOutputs) -> None:
        super().__init__(api.url, api.token, api.ca_file, api.ca_data, api.timeout_s)
        self.named, self.outputs = named, outputs

    def send(self, method: str, path: str, data: bytes | None, headers: dict[str, str]) -> tuple[int, Any]:
        run = path.rsplit("/configmaps/", 1)[1] if "/configmaps/" in path else ""
        what = (f"run record {run}" if run else f"the run records of RayCluster {self.outputs.ray_cluster}") \
            + f" in namespace {self.outputs.namespace}"
        where = f"the Kubernetes API at {self.url} ({self.named})"
        try:
            return super().send(method, path, data, headers)
        except urllib.error.HTTPError as error:
            error.close()
            if error.code not in (401, 403):  # e.g. a 503 while the control plane upgrades
                raise ApiUnreachable(f"{where} answered {error.code} {error.reason} reading {what}; try again") \
                    from None
            fix = (CREDENTIALS_FIX if self.named == "--kube-api-url" else
                   "run `gcloud auth login` (your Google credentials expired or were refused), then try again") \
                if error.code == 401 else (f"your account may not {method} ConfigMaps in namespace "
                                           f"{self.outputs.namespace}: ask for roles/container.developer")
            raise CliError(f"{where} answered {error.code} {error.reason} reading {what}: {fix}") from None
        except OSError as error:  # refused, reset, timed out, no such host
            reason = getattr(error, "reason", error)
            fix = ("is `kubectl proxy` (or the API you named) running there?" if self.named == "--kube-api-url" else
                   "check that this machine may reach it (verl-gke:masterAuthorizedCidrs) and try again")
            raise ApiUnreachable(f"could not reach {where} reading {what}: "
                                 f"{getattr(reason, 'strerror', None) or reason}; {fix}") from None


CREDENTIALS_FIX = ("it wants credentials; give --kube-api-url the address of `kubectl proxy` (which adds yours), or "
                   "leave it out to use your Google credentials")


def record_store(outputs: StackOutputs, kube_api_url: str | None, head_direct: bool = False) -> RecordStore | None:
    """The stack's run records through `--kube-api-url`, or the cluster's API with the user's Google
    credentials; None for a head reached directly (`--dashboard-url`, no cluster API) or synth's outputs."""
    if kube_api_url:
        api = _UsersApi(KubernetesApi(kube_api_url, timeout_s=KUBE_API_TIMEOUT_S), "--kube-api-url", outputs)
    elif head_direct or outputs.offline:
        return None  # `stop` and `runs` say why; `wait` and `logs` follow a job, or say there is no head
    else:
        try:
            facts = gke_facts.describe(outputs.cluster_name, outputs.cluster_location)
        except gke_facts.GkeLookupError as error:
            raise CliError(str(error)) from None
        api = _UsersApi(cluster_api(facts.endpoint, facts.ca_certificate, KUBE_API_TIMEOUT_S),
                        f"cluster {outputs.cluster_name}'s endpoint", outputs)
    return RecordStore(api, outputs.namespace, outputs.ray_cluster)


def no_records(outputs: StackOutputs, command: str) -> str:
    """Why `command` has no run record to read."""
    if outputs.offline:
        return (f"{outputs.source} holds synth's offline outputs: no run was started. `verl-gke status --outputs "
                f"{outputs.source}` shows what they name; {command} reads the run records of a deployed stack")
    return (f"{command} reads the run records through the Kubernetes API: drop --dashboard-url, or add "
            "--kube-api-url")


def attempt_line(attempt: Attempt) -> str:
    """An attempt by its number (its Ray submission id: `status --verbose`)."""
    return f"attempt {attempt.index} ({attempt.by}, {attempt.cause}" + (f": {attempt.reason}" if attempt.reason else "") \
        + ")"


# --- logs --------------------------------------------------------------------------------------


def chosen(record: RunRecord, every: bool, index: int | None) -> list[Attempt]:
    """The run's attempts `logs` shows: all, attempt `index`, or the current (newest) one."""
    if not record.attempts:
        raise CliError(f"run {record.run_id} has no attempt yet")
    if every:
        return list(record.attempts)
    if index is not None:
        if not 0 <= index < len(record.attempts):
            raise CliError(f"run {record.run_id} has attempts 0 to {len(record.attempts) - 1}, not {index}")
        return [record.attempts[index]]
    return [record.attempts[-1]]


def bucket_logs(run: Run | None, record: RunRecord | None, every: bool, index: int | None,
                copy_wait_s: float | None) -> list[tuple[str, str]]:
    """(header, text) of the chosen attempts from the run's copy in the bucket (a header only for --all)."""
    if run is None:
        raise CliError("the bucket keeps logs by run: give --run (or the stack's outputs), not --submission-id")
    if copy_wait_s:
        _await_final_copy(run, copy_wait_s)
    copied = run.bucket.record() or record
    if copied is None:
        raise CliError(f"no copy of run {run.run_id} in {run.bucket.folder} (the run supervisor copies it "
                       "while the run goes on)")
    out = []
    for attempt in chosen(copied, every, index):
        text = run.bucket.attempt_log(attempt)
        if text is None:
            raise CliError(f"{run.bucket.where(attempt_file(attempt.index))} does not exist: attempt "
                           f"{attempt.index} was never copied")
        out.append((f"==> {attempt_line(attempt)} <==" if every else "", text))
    return out


def _await_final_copy(run: Run, wait_s: float) -> None:
    """Until the bucket's copy of the record says the run was released (its copy flushed before it)."""
    deadline = time.monotonic() + wait_s
    progress(f"waiting up to {wait_s:g} s for the final copy of run {run.run_id} in {run.bucket.folder} "
             "(flushed when its GPU workers are released)")
    while not ((copied := run.bucket.record()) is not None and copied.released):
        if time.monotonic() >= deadline:
            raise CliError(f"the copy of run {run.run_id} in {run.bucket.folder} is not final after {wait_s:g} s "
                           "(the run has not been released yet)")
        time.sleep(min(10.0, max(0.1, deadline - time.monotonic())))


# --- wait --------------------------------------------------------------------------------------


NO_RECORD_WHY = ("it was never started on this stack (`pulumi up` starts it), or its record was deleted or is "
                 "unreadable: if its GPU workers are up, the run supervisor records it again within "
                 "verl-gke:runReplaceWindowSeconds; run this again then")


def summary(run_id: str, record: RunRecord, outputs: StackOutputs) -> dict[str, object]:
    """A run as `wait --json` and `runs --json` give it to CI: what the stack outputs grpoJobStatus,
    grpoSubmissionId and modelUri said at the last `up` or refresh, current (they go stale after it)."""
    from workloads.export_model import model_path

    outcome = record.outcome
    model = (f"gs://{outputs.bucket_name}/{model_path(run_id)}" if record.export_outcome == "SUCCEEDED" else "")
    return {"runId": run_id, "outcome": str(outcome or ""), "state": outcome.state.name if outcome else "RUNNING",
            "reason": outcome.reason if outcome else "", "message": outcome.message if outcome else "",
            "status": record.job_status, "attempts": len(record.attempts),
            "submissionId": record.newest.submission_id if record.newest else "", "released": record.released,
            "exportOutcome": record.export_outcome, "modelUri": model, "startFrom": record.start_from}


def settled(record: RunRecord) -> bool:
    """Ended for good: not provisional, and a model export its decider claimed is over."""
    exporting = record.outcome == SUCCEEDED and bool(record.export_id) and not record.export_outcome
    return bool(record.outcome) and not provisional(record) and not exporting


def follow(run: Run, timeout_s: float | None, poll_s: float, outage_window_s: float,
           report_every_s: float = 300.0, sleep: Callable[[float], None] = time.sleep, as_json: bool = False) -> int:
    """`wait`: reads the run's record every `poll_s` until the run ends, reporting each new attempt and
    each new decision; 0 only when it succeeded, else RunEnded with EXIT_CODES' status. A record that
    cannot be read for `outage_window_s` is HeadUnreachable (3): the run may still go on. `as_json`:
    also waits for a claimed model export to end, and prints the run's `summary` on stdout."""
    started = time.monotonic()
    outage = OutageClock(outage_window_s)
    shown_attempts, shown_decisions, said = 0, None, 0.0
    while True:
        try:
            record = run.record()
            outage.reached()
        except (CliError, HeadAccessSetupError) as error:
            if not isinstance(error, ApiUnreachable):
                raise  # nothing a retry mends (refused credentials, no gke-gcloud-auth-plugin, an unknown cluster)
            failure: Exception | None = error
        except Exception as error:  # noqa: BLE001 - an API outage (a 5xx, a broken reply): ridden out for the window
            failure = error
        else:
            failure = None
        if failure is not None:
            error = failure
            if (lost := outage.lost()) >= outage_window_s:
                raise HeadUnreachable(f"could not read run record {run.record_name} for {duration(lost)} "
                                      f"(--outage-window {outage_window_s:g} s): {one_line(error)}") from None
            pause = min(poll_s, 5.0)
            if timeout_s is not None and time.monotonic() - started + pause > timeout_s:
                raise TimedOut(f"run {run.run_id}: its record was not readable for {duration(lost)}, and --timeout "
                               f"{timeout_s:g} s has passed (the run may go on): {one_line(error)}") from None
            progress(f"run record unreadable ({one_line(error)}); retrying for up to "
                     f"{duration(outage_window_s - lost)}")
            sleep(pause)
            continue
        if record is None:
            raise CliError(f"run {run.run_id} has no record ({run.record_name} in namespace "
                           f"{run.outputs.namespace}): {NO_RECORD_WHY}")
        for attempt in record.attempts[shown_attempts:]:
            progress(f"run {run.run_id}: {attempt_line(attempt)}")
        shown_attempts = len(record.attempts)
        new = record.decisions[-1] if record.decisions else None
        elapsed = time.monotonic() - started
        if new != shown_decisions or elapsed - said >= report_every_s:
            if new is not None:
                progress(f"run {run.run_id} after {duration(elapsed)}: {new}")
            shown_decisions, said = new, elapsed
        if settled(record) or (record.outcome and not provisional(record) and not as_json):
            if as_json:
                print(json.dumps(summary(run.run_id, record, run.outputs), sort_keys=True), flush=True)
            return ended(run, record, quiet=as_json)
        if timeout_s is not None and elapsed + poll_s > timeout_s:
            newest = record.newest
            raise TimedOut(f"run {run.run_id} has not ended after {duration(elapsed)} (--timeout {timeout_s:g} s)"
                           + (f"; {attempt_line(newest)} goes on" if newest else ""))
        sleep(poll_s)


def ended(run: Run, record: RunRecord, quiet: bool = False) -> int:
    assert record.outcome is not None
    if record.outcome.state is Ended.SUCCEEDED:
        (progress if quiet else print)(f"run {run.run_id} SUCCEEDED after {len(record.attempts)} attempt(s)")
        return 0
    raise RunEnded(f"run {run.run_id} ended {record.outcome.shown}", EXIT_CODES[record.outcome.state])


# --- stop --------------------------------------------------------------------------------------


class _NoLease:
    """`stop` writes desired state only, as the stack does: a compare-and-swap on the record, no Lease
    (it decides nothing; the run's decider acts on it)."""

    acquired = 0

    def hold(self) -> bool:
        return True

    def check(self) -> None:
        pass


def stop(run: Run, wait: bool, timeout_s: float, poll_s: float, sleep: Callable[[float], None] = time.sleep) -> int:
    """`stop`: desired stopped in the record; then (unless not `wait`) waits until its decider has ended
    the run and released the GPU workers. Idempotent."""
    if run.store is None:
        raise CliError(no_records(run.outputs, "stop"))
    found = run.store.get(run.run_id).record
    if found is None:
        raise CliError(f"run {run.run_id} has no record ({run.record_name}): {NO_RECORD_WHY}")
    if found.outcome and not provisional(found):
        print(f"run {run.run_id} already ended: {found.outcome}" + ("" if found.released else
                                                                   " (GPU workers not released yet)"))
        return 0
    if found.desired != "stopped":
        write_record(run.store, run.run_id, lambda r: None if r is None else stop_asked(r), _NoLease())
        progress(f"run {run.run_id}: stop asked in its record {run.record_name}")
    if not wait:
        print(f"run {run.run_id}: stop asked; its decider (the run supervisor) stops it at its next step")
        return 0
    live = found.newest
    progress(f"waiting up to {duration(timeout_s)} for the run's decider (the run supervisor) to stop "
             + (f"attempt {live.index}, " if live else "") + "keep the checkpoints and release the GPU workers")
    deadline = time.monotonic() + timeout_s
    while True:
        record = run.store.get(run.run_id).record
        if record is not None and record.outcome and record.released:
            print(f"run {run.run_id} ended: {record.outcome}; GPU workers released")
            return 0
        if time.monotonic() >= deadline:
            if record is not None and provisional(record):
                raise TimedOut(f"run {run.run_id}: its Ray head has not answered; the stop is recorded and is carried "
                               "out if it answers, and the GPU workers go once it has been silent for "
                               "verl-gke:runHeadOutageSeconds (default 1800 s): run `verl-gke stop` again, or pass a "
                               "longer --timeout, to wait for that")
            state = "not ended" if record is None or not record.outcome else f"ended ({record.outcome}), GPU " \
                    "workers not released"
            raise TimedOut(f"run {run.run_id} is {state} after {duration(timeout_s)}: is the run supervisor "
                           "running (verl-gke:runSupervisor) and releasing (verl-gke:releaseWorkersWhenDone)?")
        sleep(poll_s)


def add_stop_parser(subparsers: Any, parents: list[argparse.ArgumentParser]) -> None:
    stop = subparsers.add_parser(
        "stop", parents=parents, help="end the run: stop its job, keep its checkpoints, release the GPUs",
        description="Ask the run's decider (the run supervisor) to end the run, through its record: it stops the "
                    "live attempt, keeps the checkpoints and releases the GPU workers. Idempotent. Waits for the "
                    "release unless --no-wait. A later run of the same spec needs a new verl-gke:jobAttempt "
                    "(it resumes from the checkpoints).")
    stop.add_argument("--no-wait", action="store_true", help="ask and return at once")
    stop.add_argument("--timeout", type=positive_float, default=STOP_TIMEOUT_S, metavar="S",
                      help=f"give up waiting after S seconds (default {STOP_TIMEOUT_S:g})")
    stop.add_argument("--poll", type=positive_float, default=5.0, metavar="S",
                      help="seconds between looks at the record (default 5)")
    stop.set_defaults(handler=cmd_stop)


def cmd_stop(args: argparse.Namespace) -> int:
    outputs = stack_outputs.load(args.outputs, args.stack)
    run = run_of(args.run, outputs, lambda: record_store(outputs, args.kube_api_url))
    return stop(run, not args.no_wait, args.timeout, args.poll)


# --- runs --------------------------------------------------------------------------------------


def _stamp(decision: str) -> float | None:
    """A decision's stamp (the writer's clock, for people), as epoch seconds."""
    try:
        return float(calendar.timegm(time.strptime(decision.split(" ", 1)[0], "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def _created(created: str) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(created, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


@dataclass(frozen=True)
class RunRow:
    run_id: str
    record: RunRecord
    start: float | None
    end: float | None


def run_rows(store: RecordStore) -> list[RunRow]:
    """The stack's runs, oldest first: start is the record's creation (the API server's clock), end the
    stamp of its 'run ended' decision (its decider's clock), both for people."""
    rows = []
    for run_id, stored in store.list().items():
        record = stored.record
        if record is None:
            continue
        end = next((_stamp(d) for d in reversed(record.decisions) if " run ended: " in d), None)
        rows.append(RunRow(run_id, record, _created(stored.created), end))
    return sorted(rows, key=lambda r: (r.start or 0.0, r.run_id))


def _when(epoch: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(epoch)) if epoch is not None else "-"


def describe(row: RunRow, outputs: StackOutputs, now: float, step: str | None) -> list[tuple[str, str]]:
    """One run's rows for `verl-gke runs`."""
    from workloads.export_model import model_path

    record = row.record
    gpus = outputs.gpu_nodes * outputs.gpus_per_node
    until = row.end if record.outcome else now
    hours = (until - row.start) / 3600 if row.start is not None and until is not None else None
    bucket = outputs.checkpoint_uri.removeprefix("gs://").split("/", 1)[0]
    checkpoints = outputs.run_checkpoint_uri(row.run_id)
    if hours is None:
        usage = "unknown (no start or end in the record)"
    else:
        usage = f"{hours * gpus:.1f} GPU-hours ({hours:.2f} h x {gpus} GPUs)" + (
            f", ${hours * outputs.hourly_cost_usd:,.2f} at ${outputs.hourly_cost_usd:,.2f}/h"
            if outputs.hourly_cost_usd is not None else ", cost unknown (no hourlyCostUsd: set "
                                                         "verl-gke:gpuNodeHourlyUsd)")
    shown = record.outcome.shown if record.outcome else "RUNNING"
    if provisional(record):
        shown += " (provisional: the Ray head may still answer with the run's attempts; released at runHeadOutageSeconds)"
    rows = [("Run", f"{row.run_id}  {shown}"),
            ("Attempts", "; ".join(f"{a.index} ({a.cause})" for a in record.attempts) or "none"),
            ("Started", _when(row.start)), ("Ended", _when(row.end) if record.outcome else "-"),
            *([("Started from", record.start_from)] if record.start_from else []),
            ("Usage", usage), ("Checkpoints", checkpoints),
            ("Model", f"gs://{bucket}/{model_path(row.run_id)}" if record.export_outcome == "SUCCEEDED"
             else f"none ({record.export_outcome or 'not exported'})")]
    if step is not None:
        rows.append(("Step time", step))
    return rows


def step_time(parsed: metrics.ParsedLog, outputs: StackOutputs, where: str, run_id: str = "") -> str:
    """The measured step (the mean of verl's perf/time_per_step in `where`) against the stack's modeled one, and
    what their ratio means for the run: `runs --step-times` and `metrics` show it. The outputs model the stack's
    own run: another `run_id` (an earlier run, maybe of other settings) is not held against it."""
    steps = [value for _step, value in parsed.series(metrics.STEP_TIME_KEY)]
    measured = sum(steps) / len(steps) if steps else None
    shown = (f"measured {measured:.0f} s (mean of {len(steps)} step{'s' * (len(steps) != 1)})" if measured is not None
             else f"no {metrics.STEP_TIME_KEY} in {where} yet")
    step_s, run_s = outputs.modeled_step_s, outputs.modeled_run_s
    if run_id and run_id != outputs.run_id:
        return f"{shown}, not compared: the stack outputs model its run {outputs.run_id}, not {run_id}"
    if step_s is None:
        return (f"{shown}, not modeled: the stack outputs have no modeledStepSeconds (a stack last updated by an "
                "older verl-gke, or a model or GPU platform the step model does not cover)")
    mfu = run_time.MFU.get(outputs.gpu_platform)
    assumes = f"; the model assumes {mfu:.0%} MFU in training (docs/verl-settings.md)" if mfu is not None else ""
    if measured is None:
        run = f" (the run ~{run_s / 60:.0f} min)" if run_s is not None else ""
        return f"{shown}, modeled {step_s:.0f} s{run}{assumes}"
    ratio = run_time.measured_ratio(measured, step_s)
    pace = (f", so the run takes ~{ratio * run_s / 60:.0f} min at this pace, not the modeled ~{run_s / 60:.0f}"
            if run_s is not None else " (run time unknown: steps unknown)")
    return f"{shown}, modeled {step_s:.0f} s: {ratio:.2f}x the model{pace}{assumes}"


def add_runs_parser(subparsers: Any, parents: list[argparse.ArgumentParser]) -> None:
    listing = subparsers.add_parser(
        "runs", parents=parents, help="the stack's runs: outcome, attempts, times, GPU-hours, cost, URIs",
        description="List the runs whose records the stack keeps (every open run and the newest 10 ended ones): "
                    "id, outcome, attempts, start and end, GPU-hours and cost (at hourlyCostUsd), checkpoint and "
                    "model URIs; with --step-times the measured step time from the bucket's log copy against "
                    "the modeled one.")
    listing.add_argument("--step-times", action="store_true",
                         help="read each run's logs from the bucket copy for its measured step time")
    listing.add_argument("--json", action="store_true",
                         help="every run as JSON (runId, state, reason, message, outcome, status, attempts, "
                              "submissionId, released, exportOutcome, modelUri, startFrom)")
    listing.set_defaults(handler=cmd_runs)


def cmd_runs(args: argparse.Namespace) -> int:
    outputs = stack_outputs.load(args.outputs, args.stack)
    store = record_store(outputs, args.kube_api_url)
    if store is None:
        raise CliError(no_records(outputs, "runs"))
    rows = run_rows(store)
    if args.json:
        print(json.dumps([summary(row.run_id, row.record, outputs) for row in rows], indent=2, sort_keys=True))
        return 0
    if not rows:
        print(f"no run recorded on RayCluster {outputs.ray_cluster} in namespace {outputs.namespace}")
        return 0
    now = time.time()
    for number, row in enumerate(rows):
        step = (step_time(_copied_log(args, outputs, row), outputs, "the copied logs", row.run_id)
                if args.step_times else None)
        if number:
            print()
        print_rows(describe(row, outputs, now, step))
    return 0


def _copied_log(args: argparse.Namespace, outputs: StackOutputs, row: RunRow) -> metrics.ParsedLog:
    """verl's metrics in every attempt's log the bucket holds of the run (an attempt not copied adds none)."""
    copy = BucketCopy(row.run_id, outputs.bucket_name, Path(args.bucket_dir) if args.bucket_dir else None)
    return metrics.parse_log("".join(copy.attempt_log(a) or "" for a in row.record.attempts))
