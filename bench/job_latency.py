"""Submit-to-RUNNING latency: the GrpoJob provider vs a bare JobSubmissionClient, same head.

Starts its own local Ray head (the test fixture's helpers), then alternates the two ways of
submitting a tiny sleeping job, timing each from the call until Ray reports RUNNING; each job is
stopped before the next one starts, so every run begins on an idle head. The provider's time
includes everything `pulumi up` pays: waiting for the dashboard, building its client, looking
for a job to adopt. The bare client is built beforehand. Median of 5 each; target ratio <= 1.3.

Run: python -m bench.job_latency
"""

from __future__ import annotations

import shlex
import statistics
import sys
import time
import uuid
from collections.abc import Callable

from ray.job_submission import JobStatus, JobSubmissionClient

from components.grpo_job import GrpoJobProvider
from tests.ray_head import start_head, stop_head

RUNS = 5
TARGET_RATIO = 1.3
POLL_S = 0.02
TIMEOUT_S = 60.0


def _entrypoint() -> str:
    # A fresh token makes each provider submission a new job instead of an adoption.
    code = f"import time; time.sleep(30)  # {uuid.uuid4().hex}"
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"


def _until(client: JobSubmissionClient, submission_id: str, done: Callable[[JobStatus], bool]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not done(client.get_job_status(submission_id)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {submission_id} did not change state within {TIMEOUT_S:g} s")
        time.sleep(POLL_S)


def _timed(submit: Callable[[], str], watcher: JobSubmissionClient) -> float:
    """Seconds from calling `submit` until its job is RUNNING; the job is then stopped."""
    start = time.perf_counter()
    submission_id = submit()
    _until(watcher, submission_id, lambda status: status == JobStatus.RUNNING)
    elapsed = time.perf_counter() - start
    watcher.stop_job(submission_id)
    _until(watcher, submission_id, lambda status: status.is_terminal())
    return elapsed


def main() -> int:
    head = start_head()
    try:
        url = head.dashboard_url
        watcher = JobSubmissionClient(url)
        bare_client = JobSubmissionClient(url)
        provider = GrpoJobProvider()

        def via_provider() -> str:
            # No start-up grace: it is a deliberate wait for a failing run, not the provider's overhead.
            return provider.create({"dashboard_url": url, "entrypoint": _entrypoint(), "runtime_env": {},
                                    "startup_grace_s": 0.0}).id

        def via_bare_client() -> str:
            return bare_client.submit_job(entrypoint=_entrypoint(), runtime_env={})

        # Warm-up: the first job on a fresh head also starts Ray's job machinery.
        _timed(via_provider, watcher)
        _timed(via_bare_client, watcher)
        provider_s: list[float] = []
        bare_s: list[float] = []
        for _ in range(RUNS):
            provider_s.append(_timed(via_provider, watcher))
            bare_s.append(_timed(via_bare_client, watcher))
    finally:
        stop_head(head)
    provider_median, bare_median = statistics.median(provider_s), statistics.median(bare_s)
    ratio = provider_median / bare_median
    print(f"submit-to-RUNNING, median of {RUNS}:")
    print(f"  GrpoJobProvider.create  {provider_median:6.3f} s  ({', '.join(f'{s:.3f}' for s in provider_s)})")
    print(f"  JobSubmissionClient     {bare_median:6.3f} s  ({', '.join(f'{s:.3f}' for s in bare_s)})")
    print(f"ratio {ratio:.2f}: {'within' if ratio <= TARGET_RATIO else 'ABOVE'} target {TARGET_RATIO}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
