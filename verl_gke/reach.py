"""What the `verl-gke` commands share to reach a run: the stack outputs and the run's record (target),
the Ray head for the duration of a block (head, through access.head_access), its job API (job_client)
and a Ray call's failure as one line naming the head (ray_call)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from access import head_access
from access.cluster_api import cluster_api
from access.head_access import (
    REQUEST_TIMEOUT_S,
    HeadAccessError,
    HeadAccessSetupError,
    HeadRequestError,
    dashboard,
    shown,
    wait_for_dashboard,
)
from access.log_text import inert
from verl_gke import gke_facts, runs, stack_outputs
from verl_gke.console import CliError, UsageError, first_line, one_line, progress
from verl_gke.stack_outputs import StackOutputs
from workloads.kube import KubernetesApi

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

    from workloads.run_record import RunRecord

TERMINAL_STATUSES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
DEFAULT_POLL_S = 30.0
# A head that answers within this needs no progress message.
_QUICK_PROBE_S = 1.0
_T = TypeVar("_T")


@dataclass(frozen=True)


class Target:
    """Where the job is: the stack outputs (when loaded), the submission id (the first attempt's until the
    record names the current one), and the run (None: one job followed by --submission-id)."""

    outputs: StackOutputs | None
    submission_id: str
    run: runs.Run | None = None


def target(args: argparse.Namespace, *, need_outputs: bool, bucket_dir: str | None = None) -> Target:
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


def head(args: argparse.Namespace, outputs: StackOutputs | None, timeout_s: float | None = None) -> Iterator[str]:
    """The dashboard URL, reachable for the duration of the block; waited for up to `timeout_s`
    (default --head-timeout)."""
    head_timeout = args.head_timeout if timeout_s is None else timeout_s
    if args.dashboard_url:
        context = dashboard(args.dashboard_url, api=None, namespace="", head_service=None)
    else:
        assert outputs is not None, "target() loads the outputs whenever --dashboard-url is absent"
        if outputs.offline:
            raise CliError(f"{outputs.source} holds synth's offline outputs: nothing is deployed to reach. "
                           f"`verl-gke status --outputs {outputs.source}` shows what they name; --dashboard-url URL "
                           "runs this command against a Ray head of your own (e.g. `ray start --head`)")
        # The outputs name the cluster; its endpoint and CA come from GKE, never from the outputs.
        progress(f"reading the endpoint and CA of cluster {outputs.cluster_name} in {outputs.cluster_location} "
                 "from GKE")
        try:
            facts = gke_facts.describe(outputs.cluster_name, outputs.cluster_location)
        except gke_facts.GkeLookupError as error:
            raise CliError(str(error)) from None
        progress(f"opening a port-forward to svc/{outputs.ray_head_service} in namespace "
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
            progress(f"waiting up to {head_timeout:g} s for the Ray dashboard at {shown(url)}")
            wait_for_dashboard(url, head_timeout)
        yield url


def job_client(url: str) -> JobSubmissionClient:
    # Ray's client logs INFO chatter (e.g. each closed log stream) to stderr; keep warnings only.
    logging.getLogger("ray").setLevel(logging.WARNING)
    return ray_call(url, "connecting to the Ray job API", lambda: head_access.job_client(url, shown(url)))


def ray_call(url: str, what: str, call: Callable[[], _T]) -> _T:
    """Runs a Ray client call; any failure becomes one line naming the head's address."""
    try:
        return call()
    except (KeyboardInterrupt, CliError, HeadRequestError):
        raise
    except Exception as error:
        raise CliError(f"{what} at {shown(url)} failed: {one_line(error)}") from None


def job_info(client: JobSubmissionClient, url: str, submission_id: str) -> tuple[str, str]:
    """(status, message) of the job, with a clear error if the head does not know it."""
    info = ray_call(url, f"reading job {submission_id}", lambda: client.get_job_info(submission_id))
    return str(info.status), first_line(inert(info.message or ""))


def attempts(client: JobSubmissionClient, submission_id: str) -> list[Any]:
    """Every attempt of the stack's run on the head (`pulumi up`'s and the run supervisor's), oldest first."""
    from domain.run_identity import SUBMISSION_ID_PREFIX

    if not submission_id.startswith(f"{SUBMISSION_ID_PREFIX}-"):
        return []  # not a verl-gke run's id (--submission-id): no attempts to tell apart
    prefix = submission_id.rsplit("-", 1)[0] + "-"
    jobs = [j for j in client.list_jobs() if (j.submission_id or "").startswith(prefix)]
    return sorted(jobs, key=lambda j: j.start_time or 0)


def readable_record(target: Target) -> RunRecord | None:
    """The run's record through the Kubernetes API; None without one (or following one job), or (said on
    stderr) when it cannot be read: the head may still answer."""
    run = target.run
    try:
        return None if run is None or run.store is None else run.store.get(run.run_id).record
    except Exception as error:  # noqa: BLE001 - one line, and the command goes on without it
        progress(f"the run record was not readable ({one_line(error)}); going on without it")
        return None


def current_id(target: Target) -> str:
    """The current attempt's submission id, as the record names it (else the first attempt's, or --submission-id)."""
    record = readable_record(target)
    newest = record.attempts[-1] if record is not None and record.attempts else None
    return newest.submission_id if newest is not None else target.submission_id
