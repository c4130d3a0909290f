"""The Ray head as the GrpoJob provider reaches it: a bounded client, the job list, stops, log tails.

The provider imports Ray inside its methods only (the provider host loads it for every resource)."""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.parse
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

from access import head_access
from access.head_access import (
    HeadAccessError,
    HeadAccessSetupError,
    HeadRequestError,
    dashboard,
    job_client,
    wait_for_dashboard,
)
from access.log_text import inert
from components import job_lease
from components.job_spec import JobSpec
from workloads.run_lifecycle import RayJobs, driver_log_path, without_rays_echo

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobSubmissionClient

STOP_TIMEOUT_S = 60.0
"""How long `delete` waits for a stopped job to reach a terminal state."""
LOG_TAIL_LINES = 20
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


@contextmanager
def client(spec: JobSpec, timeout_s: float) -> Iterator[JobSubmissionClient]:
    """A JobSubmissionClient on the head, reached within `timeout_s`, or HeadAccessError naming it.

    The port-forward is retried until the deadline: there is no head pod to forward to while it is pending.
    The last error's kind is kept, so a head the API says is gone stays HeadGoneError.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        stack = ExitStack()
        try:
            url = stack.enter_context(dashboard(
                spec.dashboard_url, api=None if spec.dashboard_url else job_lease.kube_api(spec),
                namespace=spec.namespace, head_service=spec.head_service))
            wait_for_dashboard(url, max(0.1, deadline - time.monotonic()))
            break
        except HeadAccessSetupError:
            stack.close()
            raise
        except HeadAccessError as error:
            stack.close()
            if time.monotonic() >= deadline:
                raise type(error)(
                    f"Ray head at {spec.address} not reachable within {timeout_s:g} s: {error}"
                ) from None
            time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
    with stack:
        yield job_client(url, spec.address)


def head_jobs(client: JobSubmissionClient, spec: JobSpec) -> RayJobs:
    """The run lifecycle's REST client on the head `client` reached, each request bounded; a stall or
    a broken connection raises HeadRequestError naming the head and the request, as the SDK's does."""

    class Named(RayJobs):
        def send(self, method: str, path: str, data: bytes | None, content_type: str) -> tuple[bytes, str | None]:
            try:
                return super().send(method, path, data, content_type)
            except urllib.error.HTTPError as error:
                if method != "GET":
                    raise  # a submission's refusal is read by the lifecycle (an id used once, a head starting)
                error.close()
                raise RuntimeError(f"Ray head at {spec.address}: {method} {path.split('?')[0]} answered "
                                   f"{error.code} {error.reason}") from None
            except (OSError, http.client.HTTPException) as error:
                raise HeadRequestError(f"Ray head at {spec.address}: {method} {path.split('?')[0]} got no answer "
                                       f"within {self.timeout_s:g} s ({type(error).__name__})") from None

    return Named(client.get_address(), head_access.REQUEST_TIMEOUT_S)


def find_job(jobs: list[JobDetails], submission_id: str) -> JobDetails | None:
    # From list_jobs, not get_job_info: the latter does not tell "no such job" from other failures.
    return next((job for job in jobs if job.submission_id == submission_id), None)


def value(status: Any) -> str:
    """JobStatus is a str enum; outputs hold its plain value."""
    return str(getattr(status, "value", status))


def stop(client: JobSubmissionClient, *submission_ids: str) -> None:
    """Stops those of the jobs that have not ended (one listing for all), and waits until Ray
    reports each ended."""
    jobs = client.list_jobs()
    live = [sid for sid in dict.fromkeys(submission_ids)
            if (job := find_job(jobs, sid)) is not None and value(job.status) not in TERMINAL]
    for sid in live:
        client.stop_job(sid)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for sid in live:
        while (status := value(client.get_job_status(sid))) not in TERMINAL:
            if time.monotonic() >= deadline:
                raise RuntimeError(f"GrpoJob {sid} still {status} {STOP_TIMEOUT_S:g} s after stop_job")
            time.sleep(0.5)


def ended_message(client: JobSubmissionClient, submission_id: str, status: str, when: str) -> str:
    job = client.get_job_info(submission_id)
    # Ray's message embeds up to 20,000 chars of logs after its first line: keep that line.
    message = inert(job.message or "no message").splitlines()[0]
    tail = log_tail(client, job, LOG_TAIL_LINES)
    return (f"GRPO job {submission_id} {status} {when}: {message}\n"
            f"last {len(tail)} log lines:\n" + "\n".join(tail))


def log_tail(client: JobSubmissionClient, job: JobDetails, lines: int) -> list[str]:
    """The last `lines` lines of the job's driver log, cut by the head (the log may be GBs), without Ray's
    echo of the entrypoint."""
    if not job.driver_node_id:
        return ["(no log tail: the job's driver never started)"]
    fields = {"submission_id": job.submission_id, "driver_node_id": job.driver_node_id, "entrypoint": job.entrypoint}
    try:
        response = client._do_request("GET", driver_log_path(fields, lines, head_access.REQUEST_TIMEOUT_S))
    except HeadRequestError as e:
        return [f"(no log tail: {e})"]
    if response.status_code != 200:
        return [f"(no log tail: the head answered HTTP {response.status_code})"]
    # Shown by `pulumi up` in a terminal or a CI log: written by the job, so made inert.
    return inert(without_rays_echo(response.text, fields)).splitlines()[-lines:]
