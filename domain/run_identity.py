"""Which run a Ray submission is: ids derived from the run's spec, so `pulumi up` twice never starts two."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

SUBMISSION_ID_PREFIX = "verl-grpo"


def submission_id(stack: str, entrypoint: str, runtime_env: Mapping[str, Any], attempt: int, retry: int = 0) -> str:
    """`verl-grpo-<stack>-<12 hex>` of the run's spec, its attempt (jobAttempt) and the run
    supervisor's retry of that attempt; a new jobAttempt never meets an earlier attempt's retries."""
    job: dict[str, Any] = {"entrypoint": entrypoint, "runtime_env": whole_numbers(dict(runtime_env))}
    if attempt:
        job["attempt"] = attempt
    if retry:
        job["retry"] = retry
    canonical = json.dumps(job, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return f"{SUBMISSION_ID_PREFIX}-{stack}-{hashlib.sha256(canonical.encode()).hexdigest()[:12]}"


def submission_ids(stack: str, entrypoint: str, runtime_env: Mapping[str, Any], attempt: int,
                   count: int) -> list[str]:
    """The ids of `attempt` and its first count - 1 retries: `pulumi up` submits the first, the run
    supervisor the others."""
    return [submission_id(stack, entrypoint, runtime_env, attempt, retry) for retry in range(count)]


def whole_numbers(value: Any) -> Any:
    """Integral floats become ints, recursively: the engine sends every number as a float."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {key: whole_numbers(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [whole_numbers(item) for item in value]
    return value


RUN_ID_PREFIX = "run"
NOT_IN_RUN_ID = frozenset({
    # Where and how often verl writes, logs and validates: a checkpoint is valid whatever they are.
    "trainer.default_local_dir", "trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep",
    "trainer.resume_mode", "trainer.save_freq", "trainer.test_freq", "trainer.val_before_train",
    "trainer.logger", "data.val_files",
    # Memory per step, not the math: micro batches accumulate to the same mini batch.
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.gpu_memory_utilization", "actor_rollout_ref.rollout.max_num_seqs",
    # Labels.
    "trainer.project_name", "trainer.experiment_name",
})
"""Overrides that do not change what a checkpoint is valid for; every other one does (every verl path a
user sets, whose effect verl-gke cannot judge, included)."""

V1_TRAINER_FROM = (0, 9)
"""verl 0.9.0 runs its V1 trainer by default (`trainer.use_v1: true` in verl/trainer/config/ppo_trainer.yaml);
its fit (verl/trainer/ppo/v1/trainer_base.py) never calls should_save_ckpt_esi, the only reader of the
deadline; the legacy trainer (verl/trainer/ppo/ray_trainer.py, `use_v1=false`) does."""
DELETES_BEFORE_SAVE_BELOW = (0, 9)
"""verl 0.6.1's checkpoint rotation deletes the oldest checkpoint before it saves the next
(verl/utils/checkpoint/checkpoint_manager.py); 0.9.0 saves first."""


def verl_version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def legacy_trainer_for_deadline(verl_version: str, budget: bool) -> bool:
    """Whether the run must use verl's legacy trainer so that a budget's deadline checkpoint happens."""
    return budget and verl_version_tuple(verl_version) >= V1_TRAINER_FROM


def run_id(*, model: str, model_revision: str, dataset: str, dataset_revision: str, verl: str,
           gpus_per_node: int, nnodes: int, overrides: list[tuple[str, object]]) -> str:
    """`run-<12 hex>` of what a checkpoint is valid for: the model and dataset at their revisions,
    the world size (FSDP shards are per world size), the verl that wrote it, and every override that
    changes the math. Every attempt of the run (the supervisor's, a new jobAttempt) shares it, and so
    its checkpoint folder; a different run never resumes another's checkpoint."""
    identity = {
        "model": [model, model_revision], "dataset": [dataset, dataset_revision], "verl": verl,
        "world": [nnodes, gpus_per_node],
        "overrides": sorted([key, whole_numbers(value)] for key, value in overrides if key not in NOT_IN_RUN_ID),
        # verl-gke 0.5's extra overrides, now verl paths like the others: kept so that ids stay as they were.
        "extra": [],
    }
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return f"{RUN_ID_PREFIX}-{hashlib.sha256(canonical.encode()).hexdigest()[:12]}"

