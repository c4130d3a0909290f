"""Whether the Ray cluster is whole: every GPU worker joined and every GPU visible to Ray.

A head that answers is not a cluster that can train: a worker still pulling its image, or one on a
node that never came up, leaves the run to fail at start or to wait for GPUs forever. The GrpoJob
provider submits only once the cluster is whole, `verl-gke status` shows the same count, and the
fabric check and the run supervisor wait for it too. The count itself is the run supervisor's
(workloads/run_lifecycle.Capacity: it runs in the cluster with the standard library only).
"""

from __future__ import annotations

import sys
import time

from workloads.run_lifecycle import Capacity, RayJobs

NODE_LIST_TIMEOUT_S = 30
"""Deadline of one node listing (the head's state API), for the HTTP request and the head's own."""
POLL_S = 2.0
PROGRESS_EVERY_S = 60.0
"""A wait of up to half an hour (`pulumi up`'s) says what it waits for and what is missing this often."""


class ClusterNotReadyError(TimeoutError):
    """The cluster did not become whole in time; the message says what was missing."""


def read_capacity(url: str, timeout_s: float = NODE_LIST_TIMEOUT_S) -> Capacity:
    """The head's view of its nodes; raises whatever the state API raises (it may not answer yet)."""
    return RayJobs(url, timeout_s).capacity()


def await_capacity(url: str, *, workers: int, gpus: float, deadline: float, address: str,
                   what: str) -> Capacity:
    """Polls until `workers` GPU workers with `gpus` GPUs in all are alive, or raises
    ClusterNotReadyError at `deadline` (time.monotonic) naming `what` waited and what is missing."""
    last: Capacity | None = None
    error = ""
    started, reported = time.monotonic(), -PROGRESS_EVERY_S
    while True:
        try:
            last = read_capacity(url, min(NODE_LIST_TIMEOUT_S, max(1.0, deadline - time.monotonic())))
            error = ""
            if not last.short_of(workers, gpus):
                return last
        except Exception as e:  # noqa: BLE001 a head still starting, or a stalled state API: retried
            error = f" (last node listing failed: {str(e).splitlines()[0] if str(e) else type(e).__name__})"
        seen = last.short_of(workers, gpus) if last else "no node listing"
        now = time.monotonic()
        if now >= deadline:
            raise ClusterNotReadyError(f"{what}: the Ray cluster at {address} has {seen}{error}; "
                                       "a worker may still be pulling its image, or its node never came up")
        if now - reported >= PROGRESS_EVERY_S:
            # stderr: the CLI's progress, and what the dynamic provider host shows under `pulumi up`.
            plural = "s" if workers != 1 else ""
            print(f"{what}: waiting for {workers} GPU worker{plural} with {gpus:g} GPUs to join the Ray cluster at "
                  f"{address}: {seen}{error} after {duration(now - started)} ({duration(deadline - now)} left)",
                  file=sys.stderr, flush=True)
            reported = now
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))


def duration(seconds: float) -> str:
    """`1h02m03s`, or `2m03s` under an hour: how waits say how long."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"
