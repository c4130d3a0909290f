"""Run the GPU fabric check (workloads/fabric_check.py) as a Ray job and judge its bus bandwidth.

Used by the GrpoJob provider before it submits the run, and by `verl-gke fabric` on demand. The
check's source goes inline in the job's entrypoint: nothing to upload, nothing on the bucket.
"""

from __future__ import annotations

import json
import re
import shlex
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from domain.grpo_spec import runtime_env as run_runtime_env
from access.log_text import inert
from workloads.fabric_check import RESULT_PREFIX, nccl_transports

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

    from domain.platforms import Platform

CHECK_SOURCE = Path(__file__).resolve().parent.parent / "workloads" / "fabric_check.py"
SUBMISSION_ID_PREFIX = "verl-fabric"
TIMEOUT_S = 900.0
"""Placement (up to 300 s), NCCL set-up and the all-reduces; the check stops its job past this."""
_POLL_S = 1.0
_LOG_TAIL_LINES = 20


class FabricError(RuntimeError):
    """The check could not measure, or measured less than the floor; the message says which."""


@dataclass(frozen=True)
class FabricCheck:
    """One measurement: where, with what, and the floor it must reach (0: report only)."""

    nodes: int
    gpus_per_node: int
    min_busbw_gbps: float = 0.0
    backend: str = "nccl"
    python: str = "python3"
    size_mb: int = 256
    iters: int = 20
    runtime_env: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = TIMEOUT_S
    transports: tuple[str, ...] = ()
    """NCCL transports expected between nodes (Platform.fabric_transports); () checks none."""

    def entrypoint(self) -> str:
        args = ["--nodes", self.nodes, "--gpus-per-node", self.gpus_per_node, "--backend", self.backend,
                "--size-mb", self.size_mb, "--iters", self.iters]
        return " ".join([shlex.quote(self.python), "-c", shlex.quote(CHECK_SOURCE.read_text()),
                         *(shlex.quote(str(a)) for a in args)])


def fabric_runtime_env(platform: Platform) -> dict[str, Any]:
    """The GRPO run's NCCL environment: the job's own (domain.grpo_spec.runtime_env: the platform's
    NCCL variables, NCCL_DEBUG=INFO so the transport lines reach the log) and what verl adds to its
    training processes where the job's env lacks it (verl 0.6.1: NCCL_CUMEM_ENABLE=0)."""
    run = cast("dict[str, str]", run_runtime_env(platform, nnodes=1, worker_cpus=1, verl_dir=None)["env_vars"])
    env = {k: v for k, v in run.items() if k.startswith("NCCL_") or k in ("LD_LIBRARY_PATH", "PYTHONUNBUFFERED",
                                                                        "GLOO_SOCKET_IFNAME")}
    return {"env_vars": {**platform.verl.nccl_env, **env}}


def is_check_of(submission_id: str, stack: str) -> bool:
    """Whether a Ray job is a fabric check of the stack (run_fabric_check's ids)."""
    return re.fullmatch(rf"{SUBMISSION_ID_PREFIX}-{re.escape(stack)}-[0-9a-f]{{8}}", submission_id) is not None


def run_fabric_check(client: JobSubmissionClient, check: FabricCheck, stack: str) -> dict[str, Any]:
    """Submits the check, waits for it (stopping it at its deadline) and returns its result line;
    FabricError when it failed, timed out or printed no result."""
    submission_id = f"{SUBMISSION_ID_PREFIX}-{stack}-{uuid.uuid4().hex[:8]}"
    client.submit_job(entrypoint=check.entrypoint(), submission_id=submission_id, runtime_env=check.runtime_env)
    deadline = time.monotonic() + check.timeout_s
    try:
        while (status := str(client.get_job_status(submission_id).value)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
            if time.monotonic() >= deadline:
                raise FabricError(f"fabric check {submission_id} still {status} after {check.timeout_s:g} s; "
                                  f"{_stopped(client, submission_id)} ({check.nodes} nodes x {check.gpus_per_node} "
                                  "GPUs may not be free)")
            time.sleep(_POLL_S)
    except FabricError:
        raise
    except Exception as error:  # noqa: BLE001 - any failed poll: the check holds every GPU, it must not be left
        raise FabricError(f"fabric check {submission_id}: its status poll failed ({error}); "
                          f"{_stopped(client, submission_id)}") from None
    logs = client.get_job_logs(submission_id)
    found = [line[len(RESULT_PREFIX):] for line in logs.splitlines() if line.startswith(RESULT_PREFIX)]
    if status != "SUCCEEDED" or not found:
        tail = "\n".join(inert(logs).splitlines()[-_LOG_TAIL_LINES:])
        raise FabricError(f"fabric check {submission_id} {status} without a result; last log lines:\n{tail}")
    transports = nccl_transports(logs)
    return {**json.loads(found[-1]), "submission_id": submission_id, "transports": dict(sorted(transports.items()))}


def _stopped(client: JobSubmissionClient, submission_id: str) -> str:
    """Stops the check, best effort (one request, bounded by the client's own timeout), and says
    what came of it."""
    try:
        client.stop_job(submission_id)
    except Exception as error:  # noqa: BLE001 - the head may be what failed
        return (f"it could not be stopped ({error}) and may still hold the GPUs: the next deploy of the stack "
                "stops it before submitting the run")
    return "it was stopped"


def transports_text(found: dict[str, int]) -> str:
    """`NET/gIB x32, P2P/IPC x28`, or "" when NCCL logged no connection."""
    return ", ".join(f"{t} x{n}" for t, n in sorted(found.items()))


def transport_problem(result: dict[str, Any], check: FabricCheck) -> str | None:
    """Why NCCL's choice of transport between the nodes is not the platform's, or None."""
    if not check.transports or check.backend != "nccl" or int(result["nodes"]) < 2:
        return None  # nothing to judge: no NCCL, or no traffic between nodes
    found = dict(result.get("transports") or {})
    fallback = sorted(t for t in found if t.startswith("NET/") and t not in check.transports)
    expected = " or ".join(check.transports)
    where = f"fabric check {result['submission_id']}"
    if fallback:
        return (f"{where}: NCCL connected GPUs via {', '.join(fallback)}, not {expected}"
                f"{' (NET/Socket is TCP)' if 'NET/Socket' in fallback else ''}: the RDMA or NVLink path is "
                "not in use (its NCCL plugin, the NICs or the network attachments). Training would run many "
                "times slower; fix it, or turn verl-gke:fabricCheck off to train anyway.")
    if not any(t in found for t in check.transports):
        seen = transports_text(found) or "no `NCCL INFO Channel ... via` line"
        return (f"{where}: NCCL never connected GPUs via {expected} (seen: {seen}); training would not "
                "use the platform's fabric. Check the NCCL lines of the job's log, or turn "
                "verl-gke:fabricCheck off to train anyway.")
    return None


def verdict(result: dict[str, Any], check: FabricCheck) -> str | None:
    """None when NCCL used the platform's transport and the bus bandwidth reaches the floor, else
    the message that fails the deploy."""
    if problem := transport_problem(result, check):
        return problem
    measured = float(result["busbw_gbps"])
    if not check.min_busbw_gbps or measured >= check.min_busbw_gbps:
        return None
    return (f"fabric check {result['submission_id']}: all-reduce bus bandwidth {measured:g} GB/s over "
            f"{result['nodes']} nodes x {check.gpus_per_node} GPUs ({result['backend']}), below the "
            f"{check.min_busbw_gbps:g} GB/s floor (verl-gke:fabricMinBusBandwidthGbps): "
            "the GPUs likely talk over TCP, not RDMA or NVLink. Check the NCCL lines of the job's log "
            "(NET/Socket means TCP), or lower or turn off the floor to train anyway.")
