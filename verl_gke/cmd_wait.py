"""`verl-gke wait`: follow the run through its record (runs.follow), or one Ray job on the head, until
it ends; the exit status says how it ended."""

from __future__ import annotations

import argparse
import time
from typing import Any

from access.cluster_readiness import duration
from access.head_access import OUTAGE_WINDOW_S, HeadAccessError, HeadAccessSetupError, HeadRequestError, OutageClock
from verl_gke import reach, runs
from verl_gke.console import CliError, HeadUnreachable, TimedOut, one_line, positive_float, progress

RECONNECT_PAUSE_S = 5.0
# `wait` reports every status change, and the unchanged status this often.
_REPORT_EVERY_S = 300.0


def add_parser(subparsers: Any, parents: list[argparse.ArgumentParser]) -> None:
    wait = subparsers.add_parser(
        "wait", parents=parents, help="wait for the run to end; exit 0 only if it succeeded",
        description="Follow the run through its record across attempts until it ends, reporting each new attempt "
                    "and decision on stderr. Exit 0 if it succeeded, 4 failed, 5 stopped, 6 over its budget, 7 "
                    "lost (its head unreachable past runHeadOutageSeconds); 8 --timeout passed (the run goes "
                    "on); 3 the record (or, following one job, the head) unreadable for the outage window. Without the "
                    "run's record (--submission-id, or --dashboard-url without --kube-api-url) it follows one Ray "
                    "job on the head: exit 0, 4 failed or 5 stopped.")
    wait.add_argument("--timeout", type=positive_float, metavar="S", help="give up after S seconds (default: never)")
    wait.add_argument("--poll", type=positive_float, default=reach.DEFAULT_POLL_S, metavar="S",
                      help=f"seconds between status checks (default {reach.DEFAULT_POLL_S:g})")
    wait.add_argument("--outage-window", type=positive_float, default=OUTAGE_WINDOW_S, metavar="S",
                      help="keep retrying while the run record (with --submission-id: the Ray head) cannot be "
                           f"read, up to S seconds (default {OUTAGE_WINDOW_S:g})")
    wait.add_argument("--json", action="store_true",
                      help="once the run ended (and its model export, if one was claimed), print it as `runs "
                           "--json` does (state, reason, message, newest submissionId, modelUri, ...) on stdout "
                           "(the exit status is the same): the stack outputs say only what the last `pulumi up` or "
                           "refresh saw; a run only, not one Ray job")
    wait.set_defaults(handler=cmd_wait)


def cmd_wait(args: argparse.Namespace) -> int:
    target = reach.target(args, need_outputs=False)
    if target.run is not None and target.run.store is not None:
        return runs.follow(target.run, args.timeout, args.poll, args.outage_window, as_json=args.json)
    if args.json:
        raise CliError("--json follows a run through its record: it needs the run's Kubernetes API, not one job")
    return _wait_job(args, target)


def _wait_job(args: argparse.Namespace, target: reach.Target) -> int:
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
            with reach.head(args, target.outputs, min(bounds)) as url:
                client = reach.job_client(url)
                while True:
                    status, message = reach.job_info(client, url, target.submission_id)
                    outage.reached()
                    elapsed = time.monotonic() - started
                    if reported is None or reported[0] != status or elapsed - reported[1] >= _REPORT_EVERY_S:
                        progress(f"job {target.submission_id}: {status} after {duration(elapsed)}")
                        reported = (status, elapsed)
                    if status in reach.TERMINAL_STATUSES:
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
                                      f"(--outage-window {args.outage_window:g} s): {one_line(error)}") from None
            pause = min(args.poll, RECONNECT_PAUSE_S)
            if args.timeout is not None and time.monotonic() - started + pause > args.timeout:
                raise TimedOut(f"job {target.submission_id}: the Ray head did not answer for {duration(lost)}, and "
                               f"--timeout {args.timeout:g} s has passed (the job may go on): "
                               f"{one_line(error)}") from None
            progress(f"head unreachable ({one_line(error)}); reconnecting for up to "
                     f"{duration(args.outage_window - lost)}")
            time.sleep(pause)
    if status != "SUCCEEDED":
        raise runs.RunEnded(f"job {target.submission_id} ended {status}" + (f": {message}" if message else ""),
                            runs.EXIT_STOPPED if status == "STOPPED" else runs.EXIT_FAILED)
    print(f"job {target.submission_id} SUCCEEDED")
    return 0
