"""What `create` checks on the head before it submits the run, and before it adopts one: no other run,
model export or fabric check of the stack live; the whole cluster up; the fabric measured."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pulumi

from access import fabric
from access.cluster_readiness import await_capacity
from components import job_head
from components.job_spec import JobSpec
from domain.run_identity import SUBMISSION_ID_PREFIX, whole_numbers
from workloads import export_model
from workloads.run_lifecycle import DEADLINE_ENV, LIVE

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobSubmissionClient


def run_gates(client: JobSubmissionClient, spec: JobSpec, started: float) -> float | None:
    """The deploy gates, in order; the fabric check's bus bandwidth when it ran. Raises on the first
    that fails (nothing submitted)."""
    end_fabric_checks(client, spec)
    refuse_a_second_run(client.list_jobs(), spec)
    if spec.expected_workers:
        # A head that answers is not a whole cluster: a missing worker fails the run at start.
        await_capacity(client.get_address(), workers=spec.expected_workers, gpus=spec.expected_gpus,
                       deadline=started + spec.ready_timeout_s, address=spec.address,
                       what=f"GrpoJob {spec.submission_id} not submitted within ready_timeout_s="
                            f"{spec.ready_timeout_s:g} s")
    return check_fabric(client, spec) if spec.fabric_check else None


def check_fabric(client: JobSubmissionClient, spec: JobSpec) -> float:
    """The fabric check's bus bandwidth; raises (nothing submitted) below the floor."""
    check = spec.fabric
    pulumi.log.info(f"fabric check: all-reduce across {check.nodes} nodes x {check.gpus_per_node} GPUs, "
                    f"up to {check.timeout_s:g} s")
    result = fabric.run_fabric_check(client, check, spec.stack)
    seen = fabric.transports_text(result["transports"]) or "none logged"
    pulumi.log.info(f"fabric check: all-reduce bus bandwidth {result['busbw_gbps']:g} GB/s over "
                    f"{result['nodes']} nodes x {check.gpus_per_node} GPUs ({result['backend']}); "
                    f"NCCL transports: {seen}")
    if message := fabric.verdict(result, check):
        raise fabric.FabricError(message)
    return float(result["busbw_gbps"])


def end_fabric_checks(client: JobSubmissionClient, spec: JobSpec) -> None:
    """Stops the stack's fabric checks still live (one whose deploy failed while polling it, or a
    `verl-gke fabric` under way): a check holds every GPU the run needs, and its figure is of no use
    to this deploy. Waits up to STOP_TIMEOUT_S for Ray to report them ended."""
    live = sorted(j.submission_id for j in client.list_jobs() if j.submission_id
                  and fabric.is_check_of(j.submission_id, spec.stack) and job_head.value(j.status) in LIVE)
    if live:
        pulumi.log.warn(f"GrpoJob {spec.submission_id}: stopping fabric check(s) {', '.join(live)} of stack "
                        f"{spec.stack}: they hold the GPUs the run needs")
        job_head.stop(client, *live)


def refuse_a_second_run(jobs: list[JobDetails], spec: JobSpec) -> None:
    """One stack, one live run: another run of this stack (one an interrupted update left behind,
    say) holds the GPUs and writes the same checkpoints; so does a fabric check of the stack, and a
    model export on this head (its merge holds a GPU node's memory; the head is the stack's own)."""
    prefix = f"{SUBMISSION_ID_PREFIX}-{spec.stack}-"
    live = sorted(j.submission_id for j in jobs if j.submission_id and job_head.value(j.status) in LIVE and (
        j.submission_id.startswith(prefix) and j.submission_id not in spec.attempt_ids
        or fabric.is_check_of(j.submission_id, spec.stack)
        or j.submission_id.startswith(export_model.SUBMISSION_PREFIX)))
    if live:
        raise RuntimeError(
            f"GrpoJob {spec.submission_id}: another run or a model export of stack {spec.stack} is live on "
            f"{spec.address}: {', '.join(live)}. They would share the GPUs (and a run the checkpoint folder); "
            f"let it end or stop it (`ray job stop {live[0]}` through `verl-gke dashboard`) and run again."
        )


def check_adoptable(job: Mapping[str, Any], spec: JobSpec) -> None:
    """A job under our id is ours only if it runs our spec: Ray ids say nothing about the job."""
    theirs = {"entrypoint": job.get("entrypoint"), "runtime_env": whole_numbers(job.get("runtime_env") or {})}
    # The budget's deadline is set at submission, not part of the spec.
    theirs["runtime_env"].get("env_vars", {}).pop(DEADLINE_ENV, None)
    if not theirs["runtime_env"].get("env_vars") and "env_vars" not in spec.runtime_env:
        theirs["runtime_env"].pop("env_vars", None)
    ours = {"entrypoint": spec.entrypoint, "runtime_env": spec.runtime_env}
    # Ray stores runtime_env.config with its own defaults filled in (eager_install, log_files).
    their_config = theirs["runtime_env"].get("config") or {}
    same_config = all(their_config.get(key) == value for key, value in (ours["runtime_env"].get("config") or {}).items())

    def without_config(env: dict[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in env.items() if key != "config"}

    if not (theirs["entrypoint"] == ours["entrypoint"] and same_config
            and without_config(theirs["runtime_env"]) == without_config(ours["runtime_env"])):
        raise RuntimeError(
            f"GrpoJob {job.get('submission_id')}: the head already has a job under this id that runs something "
            f"else, so it is not adopted. Its spec: {json.dumps(theirs, sort_keys=True)}; this stack's: "
            f"{json.dumps(ours, sort_keys=True)}. Stop it, or bump verl-gke:jobAttempt for a new id."
        )
