"""`verl-gke`: follow a deployed GRPO run from a terminal or a CI pipeline.

Commands: status, logs, wait, stop, runs, dashboard, metrics, fabric, export, verify, report
(`verl-gke --help`). The stack outputs come from `pulumi stack output --json` or `--outputs FILE`; the
run (`--run`, default the output runId) is read from its record through the Kubernetes API, the head
through access.head_access, and an ended run's logs from the bucket. Results go to stdout, progress
to stderr, an error is one line on stderr; the exit statuses: EPILOG (docs/runs.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO, TypeVar

from access import fabric
from verl_gke import gke_facts, metrics, report, runs, stack_outputs, verify
from verl_gke.console import PROG, CliError, HeadUnreachable, TimedOut, UsageError
from verl_gke.console import fail as _fail
from verl_gke.console import first_line as _first_line
from verl_gke.console import one_line as _one_line
from verl_gke.console import print_rows as _print_rows
from verl_gke.console import progress as _progress
from access.cluster_readiness import ClusterNotReadyError, await_capacity, duration, read_capacity
from access.log_text import InertLines, inert
from access.cluster_api import cluster_api
from access.head_access import (
    OUTAGE_WINDOW_S,
    REQUEST_TIMEOUT_S,
    HeadAccessError,
    HeadAccessSetupError,
    HeadRequestError,
    OutageClock,
    dashboard,
    job_client,
    shown,
    wait_for_dashboard,
)
from verl_gke.stack_outputs import OutputsError, StackOutputs
from workloads.kube import KubernetesApi

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

    from workloads.run_record import RunRecord

TERMINAL_STATUSES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
DEFAULT_HEAD_TIMEOUT_S = 30.0
DEFAULT_POLL_S = 30.0
DASHBOARD_MINUTES = 60.0
"""How long `verl-gke dashboard` keeps its port-forward open unless told otherwise."""
RECONNECT_PAUSE_S = 5.0
FOLLOW_CHECK_S = 30.0
"""`logs --follow`: after this long without a line, check that the head still answers."""
# A head that answers within this needs no progress message.
_QUICK_PROBE_S = 1.0
# `wait` reports every status change, and the unchanged status this often.
_REPORT_EVERY_S = 300.0
_T = TypeVar("_T")


class _Parser(argparse.ArgumentParser):
    """argparse, but a wrong command line is one line (no usage block) and main() returns 2."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix(PROG).strip()
        raise UsageError(f"{command + ': ' if command else ''}{message} (see {self.prog} --help)")


@dataclass(frozen=True)
class Target:
    """Where the job is: the stack outputs (when loaded), the submission id (the first attempt's until the
    record names the current one), and the run (None: one job followed by --submission-id)."""

    outputs: StackOutputs | None
    submission_id: str
    run: runs.Run | None = None


# ---------------------------------------------------------------------------------------------
# Arguments


def _flags(title: str, *flags: tuple[tuple[str, ...], dict[str, Any]]) -> argparse.ArgumentParser:
    """A group of shared flags, composed into the commands that read them (argparse parents)."""
    parent = _Parser(add_help=False)
    group = parent.add_argument_group(title)
    for names, options in flags:
        group.add_argument(*names, **options)
    return parent


def _flag_groups() -> dict[str, argparse.ArgumentParser]:
    return {
        "outputs": _flags(
            "where the stack is",
            (("--outputs",), dict(type=Path, metavar="FILE",
                                  help="stack outputs as JSON (a saved `pulumi stack output --json`, or "
                                       "dist/<stack>/outputs.json); default: ask the pulumi CLI")),
            (("--stack",), dict(metavar="NAME",
                                help="Pulumi stack to read the outputs of (default: the selected one)"))),
        "head": _flags(
            "how the Ray head is reached",
            (("--dashboard-url",), dict(metavar="URL",
                                        help="a directly reachable Ray dashboard, e.g. http://127.0.0.1:8265 "
                                             "(default: port-forward to the head service through the Kubernetes "
                                             "API)")),
            (("--head-timeout",), dict(type=_positive_float, default=DEFAULT_HEAD_TIMEOUT_S, metavar="S",
                                       help="seconds to wait for the Ray dashboard to answer "
                                            f"(default {DEFAULT_HEAD_TIMEOUT_S:g})"))),
        "run": _flags(
            "which run",
            (("--run",), dict(metavar="RUN_ID",
                              help="the run (default: the stack output runId); its record names its attempts"))),
        "job": _flags(
            "or one Ray job",
            (("--submission-id",), dict(metavar="ID", help="one Ray job to follow instead of a run (its submission "
                                                          "id; no record is read)"))),
        "records": _flags(
            "the Kubernetes API",
            (("--kube-api-url",), dict(metavar="URL",
                                       help="a directly reachable Kubernetes API (e.g. `kubectl proxy`'s) to read "
                                            "the cluster (its run records, the Ray head's port-forward) through "
                                            "(default: the cluster's endpoint, with your Google credentials)"))),
        "bucket": _flags(
            "where the run's log copy is read",
            (("--bucket-dir",), dict(metavar="PATH",
                                     help="a local mount or copy of the bucket to read the run's logs from, under "
                                          "PATH/logs/<run>/ (default: `gcloud storage cat "
                                          "gs://<bucketName>/logs/<run>/...`)"))),
    }


# The flag groups each command reads (tests/test_cli.py checks them against the code).
_FOLLOW = ("outputs", "head", "run", "job", "records")
COMMAND_FLAGS: dict[str, tuple[str, ...]] = {
    "status": _FOLLOW, "logs": (*_FOLLOW, "bucket"), "wait": _FOLLOW, "stop": ("outputs", "run", "records"),
    "runs": ("outputs", "records", "bucket"), "dashboard": ("outputs", "head", "records"),
    "metrics": (*_FOLLOW, "bucket"), "fabric": ("outputs", "head", "records"), "export": _FOLLOW,
    "verify": ("outputs", "records"), "report": ("outputs", "run", "records", "bucket"),
}


def build_parser() -> argparse.ArgumentParser:
    groups = _flag_groups()

    def parents(command: str) -> list[argparse.ArgumentParser]:
        return [groups[name] for name in COMMAND_FLAGS[command]]

    parser = _Parser(
        prog=PROG, description="Follow the GRPO run of a verl-gke stack.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    status = commands.add_parser(
        "status", parents=parents("status"),
        help="the run, its attempts, the cluster, head, workers and GPUs, on one screen",
        description="One screen: Run (the run's id, the handle the other commands take with --run), Stack outputs, "
                    "Cluster, Ray head, Workers and GPUs visible (how many joined), Attempt N (each attempt of the run "
                    "on the head: its status and why it was submitted; --verbose adds its Ray submission id), or GRPO "
                    "job (one Ray job that is no run's attempt) with its Job message, Budget, Model export, Spend, "
                    "Fabric, Preflight, Checkpoints, Dashboard. Once the run ended and its GPU workers were released: "
                    "the run from its record, with its Last decision and how to Resume. With synth's outputs: what "
                    "they name, with the Price.")
    status.add_argument("--verbose", "-v", action="store_true", help="also each attempt's Ray submission id")
    status.set_defaults(handler=cmd_status)

    logs = commands.add_parser(
        "logs", parents=parents("logs"), help="print the run's logs (the current attempt, one, or all)",
        description="Print the run's driver logs: the current attempt's, --attempt N's or --all of them, from the "
                    "Ray head, or from the run's copy in the bucket (logs/<run>/) once the head is gone.")
    which = logs.add_mutually_exclusive_group()
    which.add_argument("--attempt", type=int, metavar="N", help="attempt N of the run (0: `pulumi up`'s)")
    which.add_argument("--all", action="store_true", help="every attempt, oldest first, each under a header line")
    logs.add_argument("--follow", "-f", action="store_true", help="keep streaming the current attempt until it ends")
    logs.add_argument("--from-bucket", action="store_true",
                      help="read the bucket copy only (never the head): what outlives the cluster")
    logs.add_argument("--copy-wait", type=_positive_float, metavar="S",
                      help="with --from-bucket: wait up to S seconds for the copy to be final (flushed at the "
                           "release) before reading it")
    logs.set_defaults(handler=cmd_logs)

    wait = commands.add_parser(
        "wait", parents=parents("wait"), help="wait for the run to end; exit 0 only if it succeeded",
        description="Follow the run through its record across attempts until it ends, reporting each new attempt "
                    "and decision on stderr. Exit 0 if it succeeded, 4 failed, 5 stopped, 6 over its budget, 7 "
                    "lost (its head unreachable past runHeadOutageSeconds); 8 --timeout passed (the run goes "
                    "on); 3 the record (or, following one job, the head) unreadable for the outage window.")
    wait.add_argument("--timeout", type=_positive_float, metavar="S", help="give up after S seconds (default: never)")
    wait.add_argument("--poll", type=_positive_float, default=DEFAULT_POLL_S, metavar="S",
                      help=f"seconds between status checks (default {DEFAULT_POLL_S:g})")
    wait.add_argument("--outage-window", type=_positive_float, default=OUTAGE_WINDOW_S, metavar="S",
                      help="keep retrying while the run record (with --submission-id: the Ray head) cannot be "
                           f"read, up to S seconds (default {OUTAGE_WINDOW_S:g})")
    wait.add_argument("--json", action="store_true",
                      help="once the run ended (and its model export, if one was claimed), print its outcome "
                           "(state, reason, message), newest submission id and modelUri as one JSON object on "
                           "stdout (the exit status is the same): the stack outputs say only what the last `pulumi up` or refresh saw")
    wait.set_defaults(handler=cmd_wait)

    stop = commands.add_parser(
        "stop", parents=parents("stop"), help="end the run: stop its job, keep its checkpoints, release the GPUs",
        description="Ask the run's decider (the run supervisor) to end the run, through its record: it stops the "
                    "live attempt, keeps the checkpoints and releases the GPU workers. Idempotent. Waits for the "
                    "release unless --no-wait. A later run of the same spec needs a new verl-gke:jobAttempt "
                    "(it resumes from the checkpoints).")
    stop.add_argument("--no-wait", action="store_true", help="ask and return at once")
    stop.add_argument("--timeout", type=_positive_float, default=runs.STOP_TIMEOUT_S, metavar="S",
                      help=f"give up waiting after S seconds (default {runs.STOP_TIMEOUT_S:g})")
    stop.add_argument("--poll", type=_positive_float, default=5.0, metavar="S",
                      help="seconds between looks at the record (default 5)")
    stop.set_defaults(handler=runs.cmd_stop)

    listing = commands.add_parser(
        "runs", parents=parents("runs"), help="the stack's runs: outcome, attempts, times, GPU-hours, cost, URIs",
        description="List the runs whose records the stack keeps (every open run and the newest 10 ended ones): "
                    "id, outcome, attempts, start and end, GPU-hours and cost (at hourlyCostUsd), checkpoint and "
                    "model URIs; with --step-times the measured step time from the bucket's log copy against "
                    "the modeled one.")
    listing.add_argument("--step-times", action="store_true",
                         help="read each run's logs from the bucket copy for its measured step time")
    listing.add_argument("--json", action="store_true",
                         help="every run as JSON (runId, state, reason, message, outcome, status, attempts, "
                              "submissionId, released, exportOutcome, modelUri, startFrom)")
    listing.set_defaults(handler=runs.cmd_runs)

    dash = commands.add_parser(
        "dashboard", parents=parents("dashboard"), help="open the Ray dashboard locally until Ctrl-C or --minutes",
        description="Open a port-forward to the Ray head behind a local proxy of this command and print its URL "
                    "until Ctrl-C or --minutes. The URL holds a secret of this session: the proxy admits only "
                    "requests that carry it, for its own address, from no other site, so a web page in your "
                    "browser cannot reach the Ray Job API (which has no authentication before Ray 2.52).")
    dash.add_argument("--minutes", type=_positive_float, default=DASHBOARD_MINUTES, metavar="M",
                      help=f"close the port-forward after M minutes (default {DASHBOARD_MINUTES:g})")
    dash.set_defaults(handler=cmd_dashboard)

    met = commands.add_parser(
        "metrics", parents=parents("metrics"), help="per-step metrics table, reward plot and verdict",
        description="Parse verl's console metrics (step:N - key:value ...) from the job's logs or a saved "
                    f"log file. Verdict rule: {metrics.RISING_RULE}. With the stack's outputs (a saved log: "
                    "--outputs or --stack), the measured step time against the modeled one.",
    )
    met.add_argument("--log-file", type=Path, metavar="FILE", help="read this saved log instead of the job's logs")
    met.add_argument("--keys", type=_key_list, default=[], metavar="K1,K2",
                     help=f"more metric keys to show, comma-separated (always shown: {', '.join(metrics.DEFAULT_KEYS)})")
    met.add_argument("--plot", type=Path, metavar="PNG",
                     help=f"write a PNG plot of {metrics.REWARD_KEY} over the steps, the validation score beside it")
    met.set_defaults(handler=cmd_metrics)

    fab = commands.add_parser(
        "fabric", parents=parents("fabric"), help="measure the GPU fabric: all-reduce bus bandwidth across the workers",
        description="Run the fabric check the deploy runs before the GRPO run: an all-reduce across every GPU "
                    "worker as a Ray job, its bus bandwidth printed. Exit 1 below the floor. The GPUs must be "
                    "free: while the run trains, the check waits for them until its timeout.")
    fab.add_argument("--min-busbw", type=float, metavar="GBPS",
                     help="floor in GB/s (default: the platform's; 0 only reports)")
    fab.add_argument("--backend", choices=["nccl", "gloo"], default="nccl",
                     help="nccl on GPUs (default); gloo runs the same check on CPUs")
    fab.add_argument("--python", default="python3", help="Python on the head that runs the check (default python3)")
    fab.add_argument("--size-mb", type=int, default=256, metavar="MB", help="all-reduce size (default 256)")
    fab.add_argument("--timeout", type=_positive_float, default=fabric.TIMEOUT_S, metavar="S",
                     help=f"stop the check after S seconds (default {fabric.TIMEOUT_S:g})")
    fab.set_defaults(handler=cmd_fabric)

    exp = commands.add_parser(
        "export", parents=parents("export"), help="merge a checkpoint into a Hugging Face model in the bucket",
        description="Run verl's model merger on the head as a Ray job: the checkpoint at --step (default: the "
                    "newest) becomes safetensors at gs://<bucket>/models/<run>/model (or model-step-N), which "
                    "transformers and vLLM load. Waits for the job and prints the model's gs:// URI.")
    exp.add_argument("--step", type=int, metavar="N", help="checkpoint step (default: the newest)")
    exp.add_argument("--memory-gb", type=_positive_float, metavar="GB",
                     help="memory the merge needs (about 8 bytes per parameter); Ray then runs it on a node with "
                          "that much free instead of the head")
    exp.add_argument("--timeout", type=_positive_float, default=4 * 3600.0, metavar="S",
                     help="give up waiting after S seconds (default 14400)")
    exp.add_argument("--bucket-mount", default="/data", metavar="PATH",
                     help="where the Ray nodes mount the bucket (default /data)")
    exp.add_argument("--verl-dir", metavar="PATH", help="a verl on the nodes to merge with (default: the head's)")
    exp.add_argument("--python", default="python", help="Python on the node with verl's dependencies (default python)")
    exp.add_argument("--poll", type=_positive_float, default=DEFAULT_POLL_S, metavar="S",
                     help=f"seconds between status checks (default {DEFAULT_POLL_S:g})")
    exp.set_defaults(handler=cmd_export)
    verify.add_parser(commands, parents("verify"))
    report.add_parser(commands, parents("report"))
    return parser


EPILOG = ("Errors are one line on stderr. Exit status: 0 done, 1 the command failed, 2 a wrong command line, 3 "
          "`wait` could not read the run for its outage window, 4 `wait`: the run failed, 5 stopped, 6 over its "
          "budget, 7 lost, 8 `wait`, `stop` or `export`: its --timeout passed (what it waits for goes on), 9 "
          "`report`: the run never started, 130 interrupted.")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(PROG)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed: `pip install -e .`)"


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


def _key_list(text: str) -> list[str]:
    keys = [key.strip() for key in text.split(",") if key.strip()]
    if not keys:
        raise argparse.ArgumentTypeError(f"{text!r} names no metric key")
    return keys


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except UsageError as error:
        _fail(str(error))
        return error.exit_code
    if threading.current_thread() is threading.main_thread():
        # SIGTERM (a CI runner's cancel, `kill`) ends a command as Ctrl-C does: port-forwards and
        # temporary kubeconfigs are closed on the way out.
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        return int(args.handler(args))
    except (CliError, UsageError, OutputsError, HeadAccessError, HeadRequestError) as error:
        _fail(str(error))
        return getattr(error, "exit_code", 1)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except Exception as error:  # a bug or an unforeseen failure: still one line, no traceback
        _fail(f"unexpected {type(error).__name__}: {_one_line(error)}")
    return 1





# ---------------------------------------------------------------------------------------------
# Reaching the job


def _target(args: argparse.Namespace, *, need_outputs: bool, bucket_dir: str | None = None) -> Target:
    """Loads the stack outputs unless the flags alone say where the job is."""
    outputs = None
    if need_outputs or not (args.dashboard_url and args.submission_id):
        outputs = stack_outputs.load(args.outputs, args.stack)
    submission_id = args.submission_id or (outputs.grpo_submission_id if outputs else "")
    if args.submission_id and args.run:
        raise UsageError("--run and --submission-id name two things to follow: give one")
    run = None
    if outputs is not None and not args.submission_id:
        found = outputs
        run = runs.run_of(args.run, outputs, lambda: runs.record_store(found, args.kube_api_url,
                                                                       bool(args.dashboard_url)), bucket_dir)
    return Target(outputs=outputs, submission_id=submission_id, run=run)


@contextmanager
def _head(args: argparse.Namespace, outputs: StackOutputs | None, timeout_s: float | None = None) -> Iterator[str]:
    """The dashboard URL, reachable for the duration of the block; waited for up to `timeout_s`
    (default --head-timeout)."""
    head_timeout = args.head_timeout if timeout_s is None else timeout_s
    if args.dashboard_url:
        context = dashboard(args.dashboard_url, api=None, namespace="", head_service=None)
    else:
        assert outputs is not None, "_target loads the outputs whenever --dashboard-url is absent"
        if outputs.offline:
            raise CliError(f"{outputs.source} holds synth's offline outputs: nothing is deployed to reach. "
                           f"`verl-gke status --outputs {outputs.source}` shows what they name; --dashboard-url URL "
                           "runs this command against a Ray head of your own (e.g. `ray start --head`)")
        # The outputs name the cluster; its endpoint and CA come from GKE, never from the outputs.
        _progress(f"reading the endpoint and CA of cluster {outputs.cluster_name} in {outputs.cluster_location} "
                  "from GKE")
        try:
            facts = gke_facts.describe(outputs.cluster_name, outputs.cluster_location)
        except gke_facts.GkeLookupError as error:
            raise CliError(str(error)) from None
        _progress(f"opening a port-forward to svc/{outputs.ray_head_service} in namespace "
                  f"{outputs.namespace} of cluster {outputs.cluster_name}")
        api_timeout = min(REQUEST_TIMEOUT_S, head_timeout)
        api = (KubernetesApi(args.kube_api_url, timeout_s=api_timeout) if args.kube_api_url
               else cluster_api(facts.endpoint, facts.ca_certificate, api_timeout))
        context = dashboard(None, api=api, namespace=outputs.namespace, head_service=outputs.ray_head_service)
    with context as url:
        try:
            wait_for_dashboard(url, min(_QUICK_PROBE_S, head_timeout))
        except HeadAccessSetupError:
            raise
        except HeadAccessError:
            if head_timeout <= _QUICK_PROBE_S:
                raise
            _progress(f"waiting up to {head_timeout:g} s for the Ray dashboard at {shown(url)}")
            wait_for_dashboard(url, head_timeout)
        yield url


def _job_client(url: str) -> JobSubmissionClient:
    # Ray's client logs INFO chatter (e.g. each closed log stream) to stderr; keep warnings only.
    logging.getLogger("ray").setLevel(logging.WARNING)
    return _ray_call(url, "connecting to the Ray job API", lambda: job_client(url, shown(url)))


def _ray_call(url: str, what: str, call: Callable[[], _T]) -> _T:
    """Runs a Ray client call; any failure becomes one line naming the head's address."""
    try:
        return call()
    except (KeyboardInterrupt, CliError, HeadRequestError):
        raise
    except Exception as error:
        raise CliError(f"{what} at {shown(url)} failed: {_one_line(error)}") from None


def _job_info(client: JobSubmissionClient, url: str, submission_id: str) -> tuple[str, str]:
    """(status, message) of the job, with a clear error if the head does not know it."""
    info = _ray_call(url, f"reading job {submission_id}", lambda: client.get_job_info(submission_id))
    return str(info.status), _first_line(inert(info.message or ""))



# ---------------------------------------------------------------------------------------------
# Commands


def cmd_status(args: argparse.Namespace) -> int:
    target = _target(args, need_outputs=True)
    outputs = target.outputs
    assert outputs is not None
    if outputs.offline and not args.dashboard_url:
        return _print_rows(_offline_rows(outputs, args.verbose))
    try:
        return _live_status(args, replace(target, submission_id=_current_id(target)), outputs)
    except HeadAccessError as unreachable:
        # A run that ended had its RayCluster suspended by the run supervisor: no head, but a record.
        record = _released_run(target, unreachable)
        if record is None:
            raise
        return _print_rows(_ended_rows(outputs, record, args.verbose))


def _released_run(target: Target, unreachable: HeadAccessError) -> RunRecord | None:
    """The run from its record when it ended and its GPU workers were released; else None."""
    run = target.run
    if run is None:
        return None
    _progress(f"the Ray head did not answer; reading the run record {run.record_name}")
    try:
        record = run.store.get(run.run_id).record if run.store is not None else None
    except Exception as error:  # noqa: BLE001 - the head's error is the one to report, with this one
        raise CliError(f"{unreachable}; the run record was not readable either: {_one_line(error)}") from None
    return record if record is not None and record.released else None


def _api_record(target: Target) -> RunRecord | None:
    """The run's record through the Kubernetes API; None without one (or following one job)."""
    run = target.run
    return None if run is None or run.store is None else run.store.get(run.run_id).record


def _readable_record(target: Target) -> RunRecord | None:
    """_api_record, or None (said on stderr) when it cannot be read: the head may still answer."""
    try:
        return _api_record(target)
    except Exception as error:  # noqa: BLE001 - one line, and the command goes on without it
        _progress(f"the run record was not readable ({_one_line(error)}); going on without it")
        return None


def _current_id(target: Target) -> str:
    """The current attempt's submission id, as the record names it (else the first attempt's, or --submission-id)."""
    record = _readable_record(target)
    newest = record.attempts[-1] if record is not None and record.attempts else None
    return newest.submission_id if newest is not None else target.submission_id


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


def _live_status(args: argparse.Namespace, target: Target, outputs: StackOutputs) -> int:
    expected_gpus = outputs.gpu_nodes * outputs.gpus_per_node
    with _head(args, outputs) as url:
        version = _ray_call(url, "reading the Ray version", lambda: _ray_version(url))
        capacity = _ray_call(url, "listing Ray nodes", lambda: read_capacity(url, args.head_timeout))
        client = _job_client(url)
        try:
            status, message = _job_info(client, url, target.submission_id)
        except CliError as error:  # e.g. a restarted head forgot the job: still show the rest
            status, message = "UNREADABLE", str(error)
        attempts = _ray_call(url, "listing the run's attempts", lambda: _attempts(client, target.submission_id))
        timed = attempts or _own_times(client, url, target.submission_id)
        exports = _ray_call(url, "listing the model export", lambda: _exports(client, attempts))
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
    _print_rows(rows)
    return 1 if status == "UNREADABLE" else 0


def _attempts(client: JobSubmissionClient, submission_id: str) -> list[Any]:
    """Every attempt of the stack's run on the head (`pulumi up`'s and the run supervisor's), oldest first."""
    from domain.run_identity import SUBMISSION_ID_PREFIX

    if not submission_id.startswith(f"{SUBMISSION_ID_PREFIX}-"):
        return []  # not a verl-gke run's id (--submission-id): no attempts to tell apart
    prefix = submission_id.rsplit("-", 1)[0] + "-"
    jobs = [j for j in client.list_jobs() if (j.submission_id or "").startswith(prefix)]
    return sorted(jobs, key=lambda j: j.start_time or 0)


EXPORT_META = "verl_gke_export"
"""The export job's metadata key naming the model's folder (workloads/export_model.submission)."""


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
        return [_ray_call(url, f"reading job {submission_id}", lambda: client.get_job_info(submission_id))]
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


def cmd_logs(args: argparse.Namespace) -> int:
    target = _target(args, need_outputs=False, bucket_dir=args.bucket_dir)
    if not args.follow:
        for header, text in _run_logs(args, target, every=args.all, index=args.attempt):
            if header:
                print(header, flush=True)
            sys.stdout.write(inert(text))
        return 0
    if args.all or args.attempt is not None or args.from_bucket:
        raise UsageError("logs: --follow streams the current attempt from the head: not with --all, --attempt or "
                         "--from-bucket (see verl-gke logs --help)")
    submission_id = _current_id(target)
    with _head(args, target.outputs) as url:
        client = _job_client(url)
        _job_info(client, url, submission_id)  # a clear error for an unknown job
        _ray_call(url, f"following the logs of job {submission_id}",
                  lambda: asyncio.run(_tail(client, submission_id, sys.stdout)))
        status, message = _job_info(client, url, submission_id)
    if status not in TERMINAL_STATUSES:  # e.g. the port-forward dropped
        raise CliError(f"the log stream of job {submission_id} ended while the job is {status}; "
                       "run `verl-gke logs --follow` again")
    _progress(f"job {submission_id} is {status}" + (f": {message}" if message else ""))
    return 0


def _run_logs(args: argparse.Namespace, target: Target, every: bool, index: int | None) -> list[tuple[str, str]]:
    """(header, text) of each chosen attempt's driver log: from the head, or, once the head is gone (or
    --from-bucket), from the run's copy in the bucket. A header only when several are shown."""
    record = _readable_record(target)
    if getattr(args, "from_bucket", False):
        return runs.bucket_logs(target.run, record, every, index, getattr(args, "copy_wait", None))
    try:
        with _head(args, target.outputs) as url:
            client = _job_client(url)
            if record is not None:
                ids = [(runs.attempt_line(a), a.submission_id) for a in runs.chosen(record, every, index)]
            elif index is not None:
                raise CliError("--attempt needs the run's record: give --kube-api-url, or leave out --dashboard-url")
            elif every:  # no record: the run's attempts the head knows, by their ids
                ids = [(f"attempt {j.submission_id}", j.submission_id) for j in _ray_call(
                    url, "listing the run's attempts", lambda: _attempts(client, target.submission_id))] \
                    or [("", target.submission_id)]
            else:
                ids = [("", target.submission_id)]
            return [(f"==> {line} <==" if every and line else "", _ray_call(
                url, f"reading the logs of job {sid}", lambda sid=sid: client.get_job_logs(sid))) for line, sid in ids]
    except HeadAccessError as gone:
        if target.run is None:
            raise
        _progress(f"{_one_line(gone)}; reading the run's log copy in {target.run.bucket.folder}")
        return runs.bucket_logs(target.run, record, every, index, getattr(args, "copy_wait", None))


async def _tail(client: JobSubmissionClient, submission_id: str, out: TextIO) -> None:
    """Stream the job's log. A run may print nothing for minutes, so a quiet stream is not an
    error; but every FOLLOW_CHECK_S of quiet the head is asked (with a deadline) for the job's
    status, so a head that stopped answering ends the command instead of hanging it."""
    stream = client.tail_job_logs(submission_id).__aiter__()
    pending: asyncio.Future[str] | None = None
    lines = InertLines()
    try:
        while True:
            pending = pending or asyncio.ensure_future(stream.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=FOLLOW_CHECK_S)
            if not done:
                await asyncio.to_thread(client.get_job_status, submission_id)
                continue
            try:
                chunk = pending.result()
            except StopAsyncIteration:
                out.write(lines.flush())
                return
            pending = None
            out.write(lines.feed(chunk))
            out.flush()
    finally:
        if pending is not None:
            pending.cancel()


def cmd_wait(args: argparse.Namespace) -> int:
    target = _target(args, need_outputs=False)
    if target.run is not None and target.run.store is not None:
        return runs.follow(target.run, args.timeout, args.poll, args.outage_window, as_json=args.json)
    if args.json:
        raise CliError("--json follows a run through its record: it needs the run's Kubernetes API, not one job")
    return _wait_job(args, target)


def _wait_job(args: argparse.Namespace, target: Target) -> int:
    """One job (--submission-id, or a head reached by --dashboard-url without a Kubernetes API): to its end."""
    started = time.monotonic()
    reported: tuple[str, float] | None = None
    outage = OutageClock(args.outage_window)
    while True:
        # The head is waited for no longer than the outage window or the --timeout leaves.
        bounds = [args.head_timeout, *([] if (left := outage.left()) is None else [max(1.0, left)])]
        if args.timeout is not None:
            bounds.append(max(1.0, args.timeout - (time.monotonic() - started)))
        try:
            with _head(args, target.outputs, min(bounds)) as url:
                client = _job_client(url)
                while True:
                    status, message = _job_info(client, url, target.submission_id)
                    outage.reached()
                    elapsed = time.monotonic() - started
                    if reported is None or reported[0] != status or elapsed - reported[1] >= _REPORT_EVERY_S:
                        _progress(f"job {target.submission_id}: {status} after {duration(elapsed)}")
                        reported = (status, elapsed)
                    if status in TERMINAL_STATUSES:
                        break
                    if args.timeout is not None and elapsed + args.poll > args.timeout:
                        raise TimedOut(f"job {target.submission_id} is still {status} after {duration(elapsed)} "
                                       f"(--timeout {args.timeout:g} s)")
                    time.sleep(args.poll)
            break
        except HeadAccessSetupError:
            raise  # nothing a retry mends
        except (HeadAccessError, HeadRequestError) as error:
            # A head restart or a dropped port-forward must not fail a wait that may last a day.
            if (lost := outage.lost()) >= args.outage_window:
                raise HeadUnreachable(f"lost the Ray head for {duration(lost)} "
                                      f"(--outage-window {args.outage_window:g} s): {_one_line(error)}") from None
            pause = min(args.poll, RECONNECT_PAUSE_S)
            if args.timeout is not None and time.monotonic() - started + pause > args.timeout:
                raise TimedOut(f"job {target.submission_id}: the Ray head did not answer for {duration(lost)}, and "
                               f"--timeout {args.timeout:g} s has passed (the job may go on): "
                               f"{_one_line(error)}") from None
            _progress(f"head unreachable ({_one_line(error)}); reconnecting for up to "
                      f"{duration(args.outage_window - lost)}")
            time.sleep(pause)
    if status != "SUCCEEDED":
        raise runs.RunEnded(f"job {target.submission_id} ended {status}" + (f": {message}" if message else ""),
                            runs.EXIT_STOPPED if status == "STOPPED" else runs.EXIT_FAILED)
    print(f"job {target.submission_id} SUCCEEDED")
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    outputs = None if args.dashboard_url else stack_outputs.load(args.outputs, args.stack)
    with _head(args, outputs) as url:
        if args.dashboard_url:
            print(f"Ray dashboard: {url}")
            return 0  # directly reachable: there is no tunnel to hold open
        try:  # Ctrl-C, or the time limit, ends it
            print(f"Ray dashboard: {url}/", flush=True)
            _progress("the link holds this session's secret: it works in your browser until this command ends, and "
                      "nothing without it (another site, a page that guesses the port) gets through")
            _progress(f"port-forward open for {args.minutes:g} min; press Ctrl-C to close it sooner")
            end = time.monotonic() + args.minutes * 60
            while (left := end - time.monotonic()) > 0:
                time.sleep(min(left, 60.0))
            _progress(f"closing the port-forward after {args.minutes:g} min")
        except KeyboardInterrupt:
            _progress("closing the port-forward")
    return 0


def cmd_metrics(args: argparse.Namespace) -> int:
    if args.log_file is not None:
        source = str(args.log_file)
        try:
            text = args.log_file.read_text(encoding="utf-8", errors="replace")
        except OSError as error:
            raise CliError(f"cannot read log file {args.log_file}: {error.strerror or error}") from None
        # A saved log names no stack: its model only when the outputs are asked for (its run: --run, if given).
        outputs = stack_outputs.load(args.outputs, args.stack) if args.outputs or args.stack else None
        run_id = args.run or ""
    else:
        target = _target(args, need_outputs=False, bucket_dir=args.bucket_dir)
        outputs, run_id = target.outputs, target.run.run_id if target.run else ""
        source = f"the logs of run {target.run.run_id}" if target.run else f"the logs of job {target.submission_id}"
        # Every attempt of the run: a resumed attempt repeats steps, and the latest value of a step wins.
        text = "".join(text for _header, text in _run_logs(args, target, every=target.run is not None, index=None))
    parsed = metrics.parse_log(text)
    if not parsed.steps:
        raise CliError(f"no verl metric lines (step:N - key:value ...) in {source}; "
                       "is trainer.logger set to console?")
    keys = list(dict.fromkeys([*metrics.DEFAULT_KEYS, *args.keys]))
    seen = set(parsed.keys())
    for key in keys:
        if key not in seen:
            _progress(f"metric {key} appears in no step")
    print(metrics.table(parsed, keys))
    if parsed.partial_tail is not None:
        _progress("the last log line is incomplete (still being written) and was left out")
    print(metrics.trend(parsed.series(metrics.REWARD_KEY)).verdict())
    print(f"rule: {metrics.RISING_RULE}")
    if outputs is not None:
        print(f"Step time: {runs.step_time(parsed, outputs, source, run_id)}")
    if args.plot is not None:
        try:
            metrics.plot_reward(parsed, args.plot)
        except ValueError as error:
            raise CliError(f"cannot plot: {error}") from None
        except OSError as error:
            raise CliError(f"cannot write plot {args.plot}: {error.strerror or error}") from None
        print(f"plot: {args.plot}")
    return 0


def cmd_fabric(args: argparse.Namespace) -> int:
    from domain.platforms import PLATFORMS

    outputs = stack_outputs.load(args.outputs, args.stack)
    platform = PLATFORMS.get(outputs.gpu_platform)
    if platform is None:
        raise CliError(f"{outputs.source}: gpuPlatform {outputs.gpu_platform!r} is not one of {', '.join(PLATFORMS)}")
    floor = platform.fabric_min_busbw_gbps if args.min_busbw is None else args.min_busbw
    check = fabric.FabricCheck(nodes=outputs.gpu_nodes, gpus_per_node=outputs.gpus_per_node, min_busbw_gbps=floor,
                               backend=args.backend, python=args.python, size_mb=args.size_mb,
                               runtime_env=fabric.fabric_runtime_env(platform), timeout_s=args.timeout,
                               transports=platform.fabric_transports)
    with _head(args, outputs) as url:
        try:
            await_capacity(url, workers=check.nodes, gpus=check.nodes * check.gpus_per_node,
                           deadline=time.monotonic() + args.head_timeout, address=url, what="fabric check")
        except ClusterNotReadyError as error:
            raise CliError(str(error)) from None
        client = _job_client(url)
        _progress(f"all-reduce of {check.size_mb} MB across {check.nodes} nodes x {check.gpus_per_node} GPUs "
                  f"({check.backend})")
        result = _ray_call(url, "running the fabric check",
                           lambda: fabric.run_fabric_check(client, check, outputs.gpu_platform))
    print(f"bus bandwidth {result['busbw_gbps']:g} GB/s (algorithm bandwidth {result['algbw_gbps']:g} GB/s) over "
          f"{result['nodes']} nodes x {check.gpus_per_node} GPUs, {result['backend']}, job {result['submission_id']}")
    print(f"NCCL transports: {fabric.transports_text(result['transports']) or 'none logged'}")
    if message := fabric.verdict(result, check):
        raise CliError(message)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from workloads import export_model

    target = _target(args, need_outputs=True)
    outputs = target.outputs
    assert outputs is not None
    # The run's folder and model, named by the run (as the supervisor's export does), never by a Ray job.
    run_id = target.run.run_id if target.run is not None else outputs.run_id or target.submission_id
    checkpoints = outputs.run_checkpoint_uri(run_id)
    bucket, _, folder = checkpoints.removeprefix("gs://").partition("/")
    if not checkpoints.startswith("gs://") or not folder:
        raise CliError(f"{outputs.source}: checkpointUri {outputs.checkpoint_uri!r} is not gs://<bucket>/<path>")

    def job(id_suffix: str = "") -> dict:
        return export_model.submission(
            run_id=run_id, checkpoint_dir=f"{args.bucket_mount}/{folder}", step=args.step,
            working_dir=str(Path(export_model.__file__).parent),
            memory_bytes=int(args.memory_gb * 1e9) if args.memory_gb else None, mount=args.bucket_mount,
            verl_dir=args.verl_dir, python=args.python, bucket=bucket, id_suffix=id_suffix)

    kwargs = job()
    uri = f"gs://{bucket}/{export_model.model_path(run_id, args.step)}"
    with _head(args, outputs) as url:
        client = _job_client(url)
        known = _ray_call(url, "listing jobs", lambda: {str(j.submission_id): str(j.status) for j in client.list_jobs()})
        # An ended export of this id is an earlier command's, not this one's outcome: a new id (Ray refuses an id
        # twice); a live one is followed. The export's claim refuses it while another export of the run is live.
        again = 1
        while known.get(kwargs["submission_id"]) in TERMINAL_STATUSES:
            again += 1
            kwargs = job(f"-re{again}")
        if kwargs["submission_id"] not in known:
            _ray_call(url, "submitting the export", lambda: client.submit_job(**kwargs))
        _progress(f"export {kwargs['submission_id']}: verl's merger into {uri}")
        deadline = time.monotonic() + args.timeout
        while (status := str(_ray_call(url, "reading the export",
                                       lambda: client.get_job_status(kwargs["submission_id"])))) \
                not in TERMINAL_STATUSES:
            if time.monotonic() > deadline:
                raise TimedOut(f"export {kwargs['submission_id']} still {status} after {args.timeout:g} s")
            time.sleep(args.poll)
        if status != "SUCCEEDED":
            logs = _ray_call(url, "reading the export's logs", lambda: client.get_job_logs(kwargs["submission_id"]))
            tail = " | ".join(inert(logs).strip().splitlines()[-3:])
            raise CliError(f"export {kwargs['submission_id']} {status}: {tail}")
    print(uri)
    return 0


if __name__ == "__main__":  # `python -m verl_gke.cli`, as `python -m verl_gke`
    sys.exit(main())
