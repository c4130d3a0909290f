"""`verl-gke logs`: a run's driver logs, from the Ray head, or from the run's copy in the bucket once
the head is gone; `--follow` streams the current attempt."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING, Any, TextIO

from access.head_access import HeadAccessError
from access.log_text import InertLines, inert
from verl_gke import reach, runs
from verl_gke.console import CliError, UsageError, one_line, positive_float, progress

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

FOLLOW_CHECK_S = 30.0
"""`logs --follow`: after this long without a line, check that the head still answers."""


def add_parser(subparsers: Any, parents: list[argparse.ArgumentParser]) -> None:
    logs = subparsers.add_parser(
        "logs", parents=parents, help="print the run's logs (the current attempt, one, or all)",
        description="Print the run's driver logs: the current attempt's, --attempt N's or --all of them, from the "
                    "Ray head, or from the run's copy in the bucket (logs/<run>/) once the head is gone.")
    which = logs.add_mutually_exclusive_group()
    which.add_argument("--attempt", type=int, metavar="N", help="attempt N of the run (0: `pulumi up`'s)")
    which.add_argument("--all", action="store_true", help="every attempt, oldest first, each under a header line")
    logs.add_argument("--follow", "-f", action="store_true", help="keep streaming the current attempt until it ends")
    logs.add_argument("--from-bucket", action="store_true",
                      help="read the bucket copy only (never the head): what outlives the cluster")
    logs.add_argument("--copy-wait", type=positive_float, metavar="S",
                      help="when reading the bucket copy (--from-bucket, or the head gone): wait up to S seconds "
                           "for it to be final (flushed at the release) first")
    logs.set_defaults(handler=cmd_logs)


def cmd_logs(args: argparse.Namespace) -> int:
    target = reach.target(args, need_outputs=False, bucket_dir=args.bucket_dir)
    if not args.follow:
        for header, text in run_logs(args, target, every=args.all, index=args.attempt):
            if header:
                print(header, flush=True)
            sys.stdout.write(inert(text))
        return 0
    if args.all or args.attempt is not None or args.from_bucket:
        raise UsageError("logs: --follow streams the current attempt from the head: not with --all, --attempt or "
                         "--from-bucket (see verl-gke logs --help)")
    submission_id = reach.current_id(target)
    with reach.head(args, target.outputs) as url:
        client = reach.job_client(url)
        reach.job_info(client, url, submission_id)  # a clear error for an unknown job
        reach.ray_call(url, f"following the logs of job {submission_id}",
                       lambda: asyncio.run(_tail(client, submission_id, sys.stdout)))
        status, message = reach.job_info(client, url, submission_id)
    if status not in reach.TERMINAL_STATUSES:  # e.g. the port-forward dropped
        raise CliError(f"the log stream of job {submission_id} ended while the job is {status}; "
                       "run `verl-gke logs --follow` again")
    progress(f"job {submission_id} is {status}" + (f": {message}" if message else ""))
    return 0


def run_logs(args: argparse.Namespace, target: reach.Target, every: bool, index: int | None) -> list[tuple[str, str]]:
    """(header, text) of each chosen attempt's driver log: from the head, or, once the head is gone (or
    --from-bucket), from the run's copy in the bucket. A header only when several are shown."""
    record = reach.readable_record(target)
    if getattr(args, "from_bucket", False):
        return runs.bucket_logs(target.run, record, every, index, getattr(args, "copy_wait", None))
    try:
        with reach.head(args, target.outputs) as url:
            client = reach.job_client(url)
            if record is not None:
                ids = [(runs.attempt_line(a), a.submission_id) for a in runs.chosen(record, every, index)]
            elif index is not None:
                raise CliError("--attempt needs the run's record: give --kube-api-url, or leave out --dashboard-url")
            elif every:  # no record: the run's attempts the head knows, by their ids
                ids = [(f"attempt {j.submission_id}", j.submission_id) for j in reach.ray_call(
                    url, "listing the run's attempts", lambda: reach.attempts(client, target.submission_id))] \
                    or [("", target.submission_id)]
            else:
                ids = [("", target.submission_id)]
            return [(f"==> {line} <==" if every and line else "", reach.ray_call(
                url, f"reading the logs of job {sid}", lambda sid=sid: client.get_job_logs(sid))) for line, sid in ids]
    except HeadAccessError as gone:
        if target.run is None:
            raise
        progress(f"{one_line(gone)}; reading the run's log copy in {target.run.bucket.folder}")
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
