"""How `create` watches the run it submitted: through its start-up grace, and with wait_for_completion
to its end across the supervisor's attempts and head outages."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pulumi

from access.head_access import HeadAccessError, HeadGoneError, HeadRequestError, OutageClock
from components.job_head import TERMINAL, client, ended_message, value
from components.job_spec import JobSpec
from workloads.run_lifecycle import SUCCEEDED
from workloads.run_record import MemoryRecords, RecordStore

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

START_POLL_S = 0.25
"""Status polls while a job starts: a cheap GET, and `pulumi up` returns that much sooner."""


def await_start(head: JobSubmissionClient, spec: JobSpec, submission_id: str, deadline: float) -> str:
    """Waits for the job to be RUNNING (by `deadline`) and to stay so for its start-up grace;
    a job that ends badly first raises with the end of its log."""
    running_since: float | None = None
    while True:
        status = value(head.get_job_status(submission_id))
        now = time.monotonic()
        if status in ("FAILED", "STOPPED"):
            raise RuntimeError(ended_message(head, submission_id, status, "while starting"))
        if status == "SUCCEEDED":
            return status
        if status == "RUNNING":
            running_since = running_since or now
            if now - running_since >= spec.startup_grace_s:
                return status
        elif now >= deadline:
            raise TimeoutError(f"GrpoJob {submission_id} still {status} after ready_timeout_s="
                               f"{spec.ready_timeout_s:g} s on {spec.address}; it was stopped")
        time.sleep(START_POLL_S)


def await_completion(spec: JobSpec, records: RecordStore | MemoryRecords, submission_id: str) -> tuple[str, str]:
    """Polls until the run ends, following it across attempts through its record (the supervisor's
    resubmissions); returns (the last attempt, SUCCEEDED) or raises with the log tail. An attempt that
    ended badly while the record stays open is waited past for `outage_window_s` (the decider's next
    attempt, or its outcome), then reported.

    Each poll opens its own connection: one port-forward held for hours would break.
    """
    deadline = time.monotonic() + spec.completion_timeout_s
    outage, undecided = OutageClock(spec.outage_window_s), OutageClock(spec.outage_window_s)
    status = "RUNNING"
    while True:
        try:
            record = records.get(spec.run_key).record
        except Exception as error:  # noqa: BLE001 - the head may still tell; the next poll reads again
            pulumi.log.warn(f"GrpoJob {spec.run_key}: run record not readable: {error}")
            record = None
        if record is not None and record.attempts:
            submission_id = record.attempts[-1].submission_id
        if record is not None and record.outcome == SUCCEEDED:
            return submission_id, "SUCCEEDED"
        try:
            with client(spec, spec.reach_timeout_s) as head:
                status = value(head.get_job_info(submission_id).status)
                outage.reached()
                if status == "SUCCEEDED":
                    return submission_id, status
                if status in TERMINAL and (record is None or record.outcome or undecided.lost() >= spec.outage_window_s):
                    ended = f" (the run ended: {record.outcome})" if record is not None and record.outcome else ""
                    raise RuntimeError(ended_message(head, submission_id, status, "after it started") + ended)
                if status not in TERMINAL:
                    undecided.reached()
        except HeadGoneError:
            raise
        except (HeadAccessError, HeadRequestError) as error:
            # A head pod restart or a dropped port-forward must not fail a wait of many hours.
            if (lost := outage.lost()) >= spec.outage_window_s:
                raise RuntimeError(f"GRPO job {submission_id}: lost the Ray head for {lost:.0f} s "
                                   f"(outage_window_s={spec.outage_window_s:g}): {error}") from None
            pulumi.log.warn(f"GRPO job {submission_id}: head unreachable, retrying: {error}")
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"GRPO job {submission_id} still {status} after completion_timeout_s="
                f"{spec.completion_timeout_s:g} s; it keeps running on {spec.address}"
            )
        time.sleep(min(spec.poll_interval_s, max(0.0, deadline - time.monotonic())))
