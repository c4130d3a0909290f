"""Whether the Ray cluster is whole: every GPU worker joined and every GPU visible to Ray.

A head that answers is not a cluster that can train: a worker still pulling its image, or one on a
node that never came up, leaves the run to fail at start or to wait for GPUs forever. The GrpoJob
provider submits only once the cluster is whole, `verl-gke status` shows the same count, and the
fabric check and the run supervisor wait for it too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

NODE_LIST_TIMEOUT_S = 30
"""Deadline of one node listing (the head's state API); Ray passes it to the HTTP request."""
POLL_S = 2.0


class ClusterNotReadyError(TimeoutError):
    """The cluster did not become whole in time; the message says what was missing."""


@dataclass(frozen=True)
class Capacity:
    """What the head sees: GPU workers alive, GPUs among them, and nodes it lost."""

    workers: int
    gpus: float
    dead: int

    def short_of(self, workers: int, gpus: float) -> str:
        """'' when whole, else what is missing, e.g. '1 of 2 GPU workers, 8 of 16 GPUs'."""
        if self.workers >= workers and self.gpus >= gpus:
            return ""
        return f"{self.workers} of {workers} GPU workers, {self.gpus:g} of {gpus:g} GPUs"


def read_capacity(url: str, timeout_s: float = NODE_LIST_TIMEOUT_S) -> Capacity:
    """The head's view of its nodes; raises whatever the state API raises (it may not answer yet)."""
    from ray.util.state import list_nodes

    nodes = list_nodes(address=url, limit=10_000, timeout=max(1, int(timeout_s)), raise_on_missing_output=False)
    alive = [n for n in nodes if n.state == "ALIVE"]
    gpus = [n.resources_total.get("GPU", 0.0) for n in alive if not n.is_head_node]
    return Capacity(workers=sum(1 for g in gpus if g > 0), gpus=float(sum(gpus)),
                    dead=len(nodes) - len(alive))


def await_capacity(url: str, *, workers: int, gpus: float, deadline: float, address: str,
                   what: str) -> Capacity:
    """Polls until `workers` GPU workers with `gpus` GPUs in all are alive, or raises
    ClusterNotReadyError at `deadline` (time.monotonic) naming `what` waited and what is missing."""
    last: Capacity | None = None
    error = ""
    while True:
        try:
            last = read_capacity(url, min(NODE_LIST_TIMEOUT_S, max(1.0, deadline - time.monotonic())))
            error = ""
            if not last.short_of(workers, gpus):
                return last
        except Exception as e:  # noqa: BLE001 a head still starting, or a stalled state API: retried
            error = f" (last node listing failed: {str(e).splitlines()[0] if str(e) else type(e).__name__})"
        if time.monotonic() >= deadline:
            seen = last.short_of(workers, gpus) if last else "no node listing"
            raise ClusterNotReadyError(f"{what}: the Ray cluster at {address} has {seen}{error}; "
                                       "a worker may still be pulling its image, or its node never came up")
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
