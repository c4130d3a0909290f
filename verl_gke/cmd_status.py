"""`verl-gke status`: the run, its attempts, the cluster, head, workers and GPUs on one screen; the run
from its record once its head is gone; what synth's offline outputs name."""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from access.cluster_readiness import duration, read_capacity
from access.head_access import HeadAccessError, shown
from verl_gke import reach
from verl_gke.console import CliError, one_line, print_rows, progress
from verl_gke.stack_outputs import StackOutputs

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

    from workloads.run_record import RunRecord

EXPORT_META = "verl_gke_export"
"""The export job's metadata key naming the model's folder (workloads/export_model.submission)."""


def add_parser(subparsers: Any, parents: list[argparse.ArgumentParser]) -> None:
    status = subparsers.add_parser(
        "status", parents=parents,
        help="the run, its attempts, the cluster, head, workers and GPUs, on one screen",
        description="One screen: Run (the run's id, the handle the other commands take with --run), Stack outputs, "
                    "Cluster, Ray head, Workers and GPUs visible (how many joined), Attempt N (each attempt of the run "
                    "on the head: its status and why it was submitted; --verbose adds its Ray submission id), or GRPO "
                    "job (one Ray job that is no run's attempt) with its Job message, Budget, Model export, Spend, "
                    "Fabric, Preflight, Checkpoints, Dashboard. Once the run ended and its GPU workers were released: "
                    "the run from its record (what it Started from, a Model export), with its Last decision and how "
                    "to Resume. With synth's outputs: what they name, with the Price.")
    status.add_argument("--verbose", "-v", action="store_true", help="also each attempt's Ray submission id")
    status.set_defaults(handler=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    target = reach.target(args, need_outputs=True)
    outputs = target.outputs
    assert outputs is not None
    if outputs.offline and not args.dashboard_url:
        return print_rows(_offline_rows(outputs, args.verbose))
    try:
        return _live_status(args, replace(target, submission_id=reach.current_id(target)), outputs)
    except HeadAccessError as unreachable:
        # A run that ended had its RayCluster suspended by the run supervisor: no head, but a record.
        record = _released_run(target, unreachable)
        if record is None:
            raise
        return print_rows(_ended_rows(outputs, record, args.verbose))


def _released_run(target: reach.Target, unreachable: HeadAccessError) -> RunRecord | None:
    """The run from its record when it ended and its GPU workers were released; else None."""
    run = target.run
    if run is None:
        return None
    progress(f"the Ray head did not answer; reading the run record {run.record_name}")
    try:
        record = run.store.get(run.run_id).record if run.store is not None else None
    except Exception as error:  # noqa: BLE001 - the head's error is the one to report, with this one
        raise CliError(f"{unreachable}; the run record was not readable either: {one_line(error)}") from None
    return record if record is not None and record.released else None


def _submission(submission_id: str, verbose: bool) -> str:
    """An attempt's Ray submission id, shown only when asked for (--verbose): the run id is the handle."""
    return f"; Ray submission id {submission_id}" if verbose else ""


def _ended_rows(outputs: StackOutputs, record: RunRecord, verbose: bool) -> list[tuple[str, str]]:
    rows = [
        ("Run", f"{record.run_id}  ended {record.outcome.shown if record.outcome else ''}"),
        *([("Started from", record.start_from)] if record.start_from else []),
        ("Stack outputs", outputs.source),
        ("Cluster", _cluster_line(outputs)),
        ("Ray head", "none: the run ended and the run supervisor released the GPU workers by suspending the "
                     "RayCluster (the head and its logs went with them)"),
    ]
    rows += [(f"Attempt {a.index}", f"{a.by}, {a.cause}{': ' + a.reason if a.reason else ''}"
                                    + _submission(a.submission_id, verbose)) for a in record.attempts]
    if record.export_id:
        rows.append(("Model export", f"{record.export_id}  {record.export_outcome or 'not finished'}  "
                                     f"-> {record.export_target}"))
    if record.decisions:
        rows.append(("Last decision", record.decisions[-1]))
    rows += [("Checkpoints", outputs.checkpoint_uri),
             ("Resume", "a new run, or `pulumi config set verl-gke:jobAttempt <n+1>` and `pulumi up`, resumes the "
                        "RayCluster")]
    return rows


def _offline_rows(outputs: StackOutputs, verbose: bool) -> list[tuple[str, str]]:
    """What synth's outputs name (`dist/<stack>/outputs.json`): the stack as `pulumi up` would make it."""
    return [
        ("Run", f"{outputs.run_id}  not started: `pulumi up` submits its attempt 0"
                + _submission(outputs.grpo_submission_id, verbose)),
        ("Stack outputs", f"{outputs.source}: synth's offline outputs, nothing deployed"),
        ("Cluster", _cluster_line(outputs)),
        ("Ray head", f"none: `pulumi up` creates svc/{outputs.ray_head_service} in namespace {outputs.namespace}"),
        ("Price", f"${outputs.hourly_cost_usd:.2f}/h" if outputs.hourly_cost_usd is not None
         else _spend([], None, 0.0)),
        ("Preflight", "not checked offline (`pulumi preview` checks the live project)"),
        ("Checkpoints", outputs.checkpoint_uri),
        ("Dashboard", outputs.dashboard_command),
    ]


def _cluster_line(outputs: StackOutputs) -> str:
    return (f"{outputs.cluster_name} in {outputs.cluster_location}, platform {outputs.gpu_platform}, "
            f"{outputs.gpu_nodes} GPU nodes x {outputs.gpus_per_node} GPUs")


def _live_status(args: argparse.Namespace, target: reach.Target, outputs: StackOutputs) -> int:
    expected_gpus = outputs.gpu_nodes * outputs.gpus_per_node
    with reach.head(args, outputs) as url:
        version = reach.ray_call(url, "reading the Ray version", lambda: _ray_version(url))
        capacity = reach.ray_call(url, "listing Ray nodes", lambda: read_capacity(url, args.head_timeout))
        client = reach.job_client(url)
        try:
            status, message = reach.job_info(client, url, target.submission_id)
        except CliError as error:  # e.g. a restarted head forgot the job: still show the rest
            status, message = "UNREADABLE", str(error)
        attempts = reach.ray_call(url, "listing the run's attempts",
                                  lambda: reach.attempts(client, target.submission_id))
        timed = attempts or _own_times(client, url, target.submission_id)
        exports = reach.ray_call(url, "listing the model export", lambda: _exports(client, attempts))
    gpus, dead = capacity.gpus, capacity.dead
    shortfall = "" if gpus >= expected_gpus else f"  <- {expected_gpus - gpus:g} GPUs not joined yet"
    rows = [("Run", target.run.run_id)] if target.run is not None else []
    rows += [
        ("Stack outputs", outputs.source),
        ("Cluster", _cluster_line(outputs)),
        ("Ray head", f"{shown(url)}  Ray {version}, svc/{outputs.ray_head_service} in namespace {outputs.namespace}"),
        ("Workers", f"{capacity.workers} of {outputs.gpu_nodes} joined"
                    + (f" ({dead} dead node{'s' if dead != 1 else ''})" if dead else "")),
        ("GPUs visible", f"{gpus:g} of {expected_gpus}{shortfall}"),
    ]
    pulumi_saw = "" if outputs.grpo_job_status in (None, status) else f" (Pulumi last saw {outputs.grpo_job_status})"
    if not attempts:  # one Ray job that is no run's attempt (--submission-id, or an id of another tool)
        rows.append(("GRPO job", f"{target.submission_id}  {status}{pulumi_saw}"))
    if message:
        rows.append(("Job message", message))
    rows += _attempt_rows(attempts, args.verbose)
    rows += [("Model export", f"{j.submission_id}  {j.status}  -> {(j.metadata or {}).get(EXPORT_META, '')}")
             for j in exports]
    rows.append(("Spend", _spend(timed, outputs.hourly_cost_usd, time.time())))
    rows.append(("Fabric", f"{outputs.fabric_busbw_gbps:g} GB/s all-reduce bus bandwidth when the job was created"
                 if outputs.fabric_busbw_gbps is not None else "not measured (fabricCheck off, or not deployed)"))
    rows += [("Preflight", line) for line in outputs.preflight_checks]
    rows += [("Checkpoints", outputs.checkpoint_uri), ("Dashboard", outputs.dashboard_command)]
    print_rows(rows)
    return 1 if status == "UNREADABLE" else 0


def _exports(client: JobSubmissionClient, attempts: list[Any]) -> list[Any]:
    """The run supervisor's model export of the attempts' run (workloads/run_supervisor.py tags it with
    the run id, as it tags the attempts), oldest first."""
    from workloads.run_lifecycle import meta

    runs = {meta({"metadata": j.metadata or {}}, "run_id") for j in attempts} - {""}
    if not runs:
        return []
    jobs = [j for j in client.list_jobs()
            if (j.metadata or {}).get(EXPORT_META) and meta({"metadata": j.metadata}, "run_id") in runs]
    return sorted(jobs, key=lambda j: j.start_time or 0)


def _attempt_rows(attempts: list[Any], verbose: bool) -> list[tuple[str, str]]:
    """What the run supervisor decided, as it recorded it in each attempt's metadata."""
    from workloads.run_lifecycle import meta

    rows = []
    for job in attempts:
        info = {"metadata": job.metadata or {}}
        cause, reason = meta(info, "cause") or "submitted", meta(info, "reason")
        rows.append((f"Attempt {meta(info, 'attempt') or '?'}",
                     f"{job.status}  ({cause}{': ' + reason if reason else ''})"
                     + _submission(job.submission_id, verbose)))
    deadline = next((meta({"metadata": j.metadata or {}}, "budget_deadline") for j in attempts), "")
    if deadline:
        left = float(deadline) - time.time()
        rows.append(("Budget", f"{duration(left)} left" if left > 0 else "spent"))
    return rows


def _own_times(client: JobSubmissionClient, url: str, submission_id: str) -> list[Any]:
    """The job alone (an id that is not a verl-gke run's), for its times; none when the head forgot it."""
    try:
        return [reach.ray_call(url, f"reading job {submission_id}", lambda: client.get_job_info(submission_id))]
    except CliError:
        return []


def _spend(attempts: list[Any], usd_per_hour: float | None, now_s: float) -> str:
    """The run's cost so far: from its first attempt's start (Ray's job info) to its last attempt's end, or
    now, at the stack's hourly price (hourlyCostUsd)."""
    from domain.pricing import SET_PRICE, spend_so_far

    if usd_per_hour is None:
        return f"unknown: the stack outputs have no hourlyCostUsd; {SET_PRICE} and run `pulumi up`"
    started = [j.start_time for j in attempts if j.start_time]
    if not started:
        return f"nothing yet (${usd_per_hour:.2f}/h once the run starts)"
    ends = [j.end_time for j in attempts if j.end_time]
    live = any(not j.end_time for j in attempts if j.start_time)
    until = now_s if live or not ends else max(ends) / 1000
    usd = spend_so_far(min(started) / 1000, until, usd_per_hour)
    return f"${usd:.2f} since the first attempt started, at ${usd_per_hour:.2f}/h" + ("" if live else " (run ended)")


def _ray_version(url: str) -> str:
    with urllib.request.urlopen(f"{url}/api/version", timeout=10) as response:
        return str(json.load(response)["ray_version"])
