"""Run the GPU fabric check (workloads/fabric_check.py) as a Ray job and judge its bus bandwidth.

Used by the GrpoJob provider before it submits the run, and by `verl-gke fabric` on demand. The
check's source goes inline in the job's entrypoint: nothing to upload, nothing on the bucket.
"""

from __future__ import annotations

import json
import shlex
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workloads.fabric_check import RESULT_PREFIX

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

    def entrypoint(self) -> str:
        args = ["--nodes", self.nodes, "--gpus-per-node", self.gpus_per_node, "--backend", self.backend,
                "--size-mb", self.size_mb, "--iters", self.iters]
        return " ".join([shlex.quote(self.python), "-c", shlex.quote(CHECK_SOURCE.read_text()),
                         *(shlex.quote(str(a)) for a in args)])


def fabric_runtime_env(platform: Platform) -> dict[str, Any]:
    """The run's NCCL settings for the platform, with NCCL's transport choice in the job log."""
    return {"env_vars": {"PYTHONUNBUFFERED": "1", "LD_LIBRARY_PATH": platform.ld_library_path,
                         "NCCL_DEBUG": "INFO", **platform.nccl_env}}


def run_fabric_check(client: JobSubmissionClient, check: FabricCheck, stack: str) -> dict[str, Any]:
    """Submits the check, waits for it (stopping it at its deadline) and returns its result line;
    FabricError when it failed, timed out or printed no result."""
    submission_id = f"{SUBMISSION_ID_PREFIX}-{stack}-{uuid.uuid4().hex[:8]}"
    client.submit_job(entrypoint=check.entrypoint(), submission_id=submission_id, runtime_env=check.runtime_env)
    deadline = time.monotonic() + check.timeout_s
    while (status := str(client.get_job_status(submission_id).value)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        if time.monotonic() >= deadline:
            client.stop_job(submission_id)
            raise FabricError(f"fabric check {submission_id} still {status} after {check.timeout_s:g} s; it was "
                              f"stopped ({check.nodes} nodes x {check.gpus_per_node} GPUs may not be free)")
        time.sleep(_POLL_S)
    logs = client.get_job_logs(submission_id)
    found = [line[len(RESULT_PREFIX):] for line in logs.splitlines() if line.startswith(RESULT_PREFIX)]
    if status != "SUCCEEDED" or not found:
        tail = "\n".join(logs.splitlines()[-_LOG_TAIL_LINES:])
        raise FabricError(f"fabric check {submission_id} {status} without a result; last log lines:\n{tail}")
    return {**json.loads(found[-1]), "submission_id": submission_id}


def verdict(result: dict[str, Any], check: FabricCheck) -> str | None:
    """None when the bus bandwidth reaches the floor, else the message that fails the deploy."""
    measured = float(result["busbw_gbps"])
    if not check.min_busbw_gbps or measured >= check.min_busbw_gbps:
        return None
    return (f"fabric check {result['submission_id']}: all-reduce bus bandwidth {measured:g} GB/s over "
            f"{result['nodes']} nodes x {check.gpus_per_node} GPUs ({result['backend']}), below the "
            f"{check.min_busbw_gbps:g} GB/s floor (verl-gke:fabricMinBusBandwidthGbps): "
            "the GPUs likely talk over TCP, not RDMA or NVLink. Check the NCCL lines of the job's log "
            "(NET/Socket means TCP), or lower or turn off the floor to train anyway.")
