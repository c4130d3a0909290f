"""`verl-gke`: follow a deployed GRPO run from a terminal or a CI pipeline.

This module holds the parser (the shared flag groups and the ones each command reads: COMMAND_FLAGS)
and main(); each command lives beside its code: cmd_status, cmd_logs, cmd_wait, cmd_dashboard,
cmd_metrics, cmd_fabric, cmd_export, runs (runs, stop), verify, report; reach holds what they share
to reach a run. The stack outputs come from `pulumi stack output --json` or `--outputs FILE`. Results
go to stdout, progress to stderr, an error is one line on stderr; the exit statuses: EPILOG (docs/runs.md).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from access.head_access import HeadAccessError, HeadRequestError
from verl_gke import (
    cmd_dashboard,
    cmd_export,
    cmd_fabric,
    cmd_logs,
    cmd_metrics,
    cmd_status,
    cmd_wait,
    report,
    runs,
    verify,
)
from verl_gke.console import PROG, CliError, UsageError, fail, one_line, positive_float
from verl_gke.stack_outputs import OutputsError

DEFAULT_HEAD_TIMEOUT_S = 30.0


class _Parser(argparse.ArgumentParser):
    """argparse, but a wrong command line is one line (no usage block) and main() returns 2."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix(PROG).strip()
        raise UsageError(f"{command + ': ' if command else ''}{message} (see {self.prog} --help)")


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
            (("--head-timeout",), dict(type=positive_float, default=DEFAULT_HEAD_TIMEOUT_S, metavar="S",
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


# Each command's parser, in the order `verl-gke --help` lists them; its handler is set by its add_parser.
COMMANDS = {
    "status": cmd_status.add_parser, "logs": cmd_logs.add_parser, "wait": cmd_wait.add_parser,
    "stop": runs.add_stop_parser, "runs": runs.add_runs_parser, "dashboard": cmd_dashboard.add_parser,
    "metrics": cmd_metrics.add_parser, "fabric": cmd_fabric.add_parser, "export": cmd_export.add_parser,
    "verify": verify.add_parser, "report": report.add_parser,
}


def build_parser() -> argparse.ArgumentParser:
    groups = _flag_groups()
    parser = _Parser(prog=PROG, description="Follow the GRPO run of a verl-gke stack.", epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command, add_parser in COMMANDS.items():
        add_parser(commands, [groups[name] for name in COMMAND_FLAGS[command]])
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


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except UsageError as error:
        fail(str(error))
        return error.exit_code
    if threading.current_thread() is threading.main_thread():
        # SIGTERM (a CI runner's cancel, `kill`) ends a command as Ctrl-C does: port-forwards and
        # temporary kubeconfigs are closed on the way out.
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        return int(args.handler(args))
    except (CliError, UsageError, OutputsError, HeadAccessError, HeadRequestError) as error:
        fail(str(error))
        return getattr(error, "exit_code", 1)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except Exception as error:  # a bug or an unforeseen failure: still one line, no traceback
        fail(f"unexpected {type(error).__name__}: {one_line(error)}")
    return 1


if __name__ == "__main__":  # `python -m verl_gke.cli`, as `python -m verl_gke`
    sys.exit(main())
