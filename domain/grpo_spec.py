"""The GRPO run: verl's overrides as a typed model, its validation, entrypoint and runtime env.

Pure (no Pulumi): the program builds it from stack config, the job provider receives only the
rendered `entrypoint` and `runtime_env`. Defaults are the tutorial's two `ray job submit`
commands (A4/A3 Ultra and A4X); verl's own checks run before anything is
provisioned.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pydantic import BaseModel, ConfigDict, Field

from domain.platforms import Platform
from domain.bucket import HF_CACHE_DIR, MOUNT_PATH, run_checkpoint_dir

VERL_ENTRY_MODULE = "verl.trainer.main_ppo"

PYCACHE_DIR = "/tmp/pycache"
"""Bytecode of a verl tree on the bucket goes to local disk, not back into the bucket from every node."""


def verl_path_env(verl_dir: str) -> dict[str, str]:
    """A verl tree first on the path: verl is pure Python, so this acts as `pip install --no-deps`
    would, the image's dependencies untouched. (The tutorial's init container ran `pip install -e`
    in its own root filesystem, which the Ray containers never see.)"""
    return {"PYTHONPATH": verl_dir, "PYTHONPYCACHEPREFIX": PYCACHE_DIR}


class GrpoSpec(BaseModel):
    """Every override of the tutorial's job commands, plus resume and free extra overrides."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    train_batch_size: int = Field(256, ge=1)
    max_prompt_length: int = Field(512, ge=1)
    max_response_length: int = Field(512, ge=1)
    learning_rate: float = Field(1e-5, gt=0)
    ppo_mini_batch_size: int = Field(ge=1)
    ppo_micro_batch_size_per_gpu: int = Field(ge=1)
    rollout_log_prob_micro_batch_size_per_gpu: int = Field(ge=1)
    ref_log_prob_micro_batch_size_per_gpu: int = Field(ge=1)
    rollout_tensor_parallel_size: int = Field(ge=1)
    gpu_memory_utilization: float = Field(0.6, gt=0, le=1)
    rollout_n: int = Field(8, ge=1)
    kl_coef: float = Field(0.001, ge=0)
    use_kl_loss: bool | None = None
    val_before_train: bool | None = None
    ulysses_sequence_parallel_size: int = Field(1, ge=1)
    use_remove_padding: bool | None = None
    use_dynamic_bsz: bool | None = None
    ppo_max_token_len_per_gpu: int | None = Field(None, ge=1)
    log_prob_max_token_len_per_gpu: int | None = Field(None, ge=1)
    total_epochs: int = Field(2, ge=1)
    save_freq: int = Field(10, ge=-1)
    test_freq: int = Field(10, ge=-1)
    logger: str = "console"
    train_files: str = f"{MOUNT_PATH}/gsm8k/train.parquet"
    val_files: str = f"{MOUNT_PATH}/gsm8k/test.parquet"
    model_path: str
    checkpoint_dir: str
    max_checkpoints: int = Field(2, ge=1)
    extra_overrides: tuple[str, ...] = ()


MATH_KEYS = (
    "algorithm.adv_estimator", "data.train_batch_size", "data.max_prompt_length", "data.max_response_length",
    "actor_rollout_ref.actor.optim.lr", "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.actor.ppo_epochs", "actor_rollout_ref.actor.use_kl_loss",
    "actor_rollout_ref.actor.kl_loss_coef", "actor_rollout_ref.actor.loss_agg_mode",
    "actor_rollout_ref.actor.clip_ratio", "actor_rollout_ref.actor.entropy_coeff",
    "actor_rollout_ref.rollout.n", "actor_rollout_ref.rollout.temperature",
    "algorithm.kl_ctrl.kl_coef", "algorithm.use_kl_in_reward", "trainer.total_epochs",
)
"""verl keys that decide what is trained; the execution profile changes none of them."""


@dataclass(frozen=True)
class PlatformGrpoDefaults:
    """The run's defaults per platform: the tutorial's math (mini batch, KL loss, validation) and an
    execution profile that only changes how fast it runs."""

    ppo_mini_batch_size: int
    ppo_micro_batch_size_per_gpu: int
    rollout_log_prob_micro_batch_size_per_gpu: int
    ref_log_prob_micro_batch_size_per_gpu: int
    use_kl_loss: bool | None
    val_before_train: bool | None
    use_remove_padding: bool = True
    """Pack sequences without pad tokens (verl 0.6.1's default is false; the GSM8K prompts and answers
    fill well under half of the 512 + 512 padded length)."""
    use_dynamic_bsz: bool = True
    """Micro batches by token count instead of sequence count (actor update and log-prob passes)."""
    ppo_max_token_len_per_gpu: int = 16384
    """Tokens per actor-update micro batch (verl's default budget); the memory estimate checks it."""
    log_prob_max_token_len_per_gpu: int = 32768
    """Tokens per log-prob micro batch: forward only, no activations kept, so twice the update's."""


GRPO_DEFAULTS: dict[str, PlatformGrpoDefaults] = {
    # Math: tutorial's A4 / A3 Ultra `ray job submit` (mini batch 256, no KL loss, no validation
    # before training). Micro batches: verl's 32B example (examples/ppo_trainer/run_qwen2.5-32b.sh:
    # 8 for the update, 16 for log-probs), used by verl only where dynamic batch size is off.
    "a4": PlatformGrpoDefaults(256, 8, 16, 16, None, False),
    "a3u": PlatformGrpoDefaults(256, 8, 16, 16, None, False),
    # tutorial: A4X `ray job submit` inside the head pod (its micro batches are verl's example's already)
    "a4x": PlatformGrpoDefaults(64, 8, 16, 16, True, None),
}


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a field of the spec, named by its GrpoSpec field."""

    field: str
    message: str


def verl_problems(spec: GrpoSpec, gpus_per_node: int, nnodes: int) -> list[Problem]:
    """verl's batch rules, before any GPU is paid for.

    Three restate verl's `validate_config` (the program cannot import verl: it needs torch), which
    checks them only without dynamic batch size; the program keeps them either way;
    tests/test_verl_config.py holds their verdicts equal to verl's own. The rest verl checks only
    in its workers, once the GPUs are allocated: verl has no earlier rule for them."""
    n_gpus = gpus_per_node * nnodes
    tp = spec.rollout_tensor_parallel_size
    sp = spec.ulysses_sequence_parallel_size
    out: list[Problem] = []
    # validate_config: real_train_batch_size divisible by the minimal batch (n_gpus).
    if (spec.train_batch_size * spec.rollout_n) % n_gpus:
        out.append(Problem(
            "train_batch_size",
            f"train_batch_size x rollout.n ({spec.train_batch_size * spec.rollout_n}) must be "
            f"divisible by the {n_gpus} GPUs ({nnodes} nodes x {gpus_per_node})."))
    # validate_config (ActorConfig.validate): train_batch_size >= ppo_mini_batch_size.
    if spec.ppo_mini_batch_size > spec.train_batch_size:
        out.append(Problem(
            "ppo_mini_batch_size",
            f"must be <= train_batch_size ({spec.train_batch_size})."))
    # Only after allocation (rollout worker): world size divisible by TP; TP within a node.
    if n_gpus % tp:
        out.append(Problem(
            "rollout_tensor_parallel_size",
            f"must divide the {n_gpus} GPUs of the cluster."))
    elif n_gpus // tp > 1 and gpus_per_node % tp:
        out.append(Problem(
            "rollout_tensor_parallel_size",
            f"must divide the {gpus_per_node} GPUs per node when rollout runs data parallel."))
    # validate_config (ActorConfig.validate): Ulysses needs use_remove_padding.
    if sp > 1 and not spec.use_remove_padding:
        out.append(Problem(
            "ulysses_sequence_parallel_size",
            "Ulysses sequence parallel > 1 needs use_remove_padding = true."))
    # Only after allocation (FSDP worker): the device mesh splits the GPUs by the Ulysses size, and
    # the normalized mini batch must split into data-parallel ranks and micro batches.
    if n_gpus % sp:
        out.append(Problem(
            "ulysses_sequence_parallel_size", f"must divide the {n_gpus} GPUs of the cluster."))
        return out
    dp = n_gpus // sp
    rollouts = spec.ppo_mini_batch_size * spec.rollout_n
    if rollouts % dp:
        out.append(Problem(
            "ppo_mini_batch_size",
            f"ppo_mini_batch_size x rollout.n ({rollouts}) must be divisible by the "
            f"data-parallel size ({dp})."))
    elif (rollouts // dp) % spec.ppo_micro_batch_size_per_gpu:
        out.append(Problem(
            "ppo_micro_batch_size_per_gpu",
            f"must divide the per-GPU mini batch ({rollouts // dp} = "
            f"ppo_mini_batch_size x rollout.n / {dp})."))
    return out


@dataclass(frozen=True)
class Override:
    """One `key=value` of the job's command line and the config that sets it."""

    key: str
    """verl's dotted config key."""
    value: object
    source: str
    """The StackConfig field that sets it (`grpo.<field>`, `gpu_nodes`, `platform`), `managed` for a
    value verl-gke must own, or "" for verl-gke's fixed choice that an extra override may change."""

    @property
    def arg(self) -> str:
        """`key=value` as Hydra reads it on the command line."""
        return f"{self.key}={_render(self.value)}"


def overrides(spec: GrpoSpec, gpus_per_node: int, nnodes: int, *, run_id: str = "",
              legacy_trainer: bool = False) -> list[Override]:
    """The run's overrides in command-line order, unset (None) ones left out. With `run_id`, the
    run's checkpoints go to `<checkpoint_dir>/<run_id>`; `legacy_trainer` runs verl's legacy
    trainer (the one that honours the budget's deadline, domain/run_identity.py)."""
    return [o for o in _all_overrides(spec, gpus_per_node, nnodes, run_id, legacy_trainer) if o.value is not None]


def override_sources(spec: GrpoSpec, gpus_per_node: int, nnodes: int) -> dict[str, str]:
    """verl key -> what sets it, for every key verl-gke owns (set now or not)."""
    return {o.key: o.source for o in _all_overrides(spec, gpus_per_node, nnodes) if o.source}


def _all_overrides(spec: GrpoSpec, gpus_per_node: int, nnodes: int, run_id: str = "",
                   legacy_trainer: bool = False) -> list[Override]:
    def grpo(key: str, field: str) -> Override:
        return Override(key, getattr(spec, field), f"grpo.{field}")

    sp = spec.ulysses_sequence_parallel_size
    return [
        Override("algorithm.adv_estimator", "grpo", ""),
        grpo("data.train_files", "train_files"),
        grpo("data.val_files", "val_files"),
        grpo("data.train_batch_size", "train_batch_size"),
        grpo("data.max_prompt_length", "max_prompt_length"),
        grpo("data.max_response_length", "max_response_length"),
        grpo("actor_rollout_ref.model.path", "model_path"),
        grpo("actor_rollout_ref.model.use_remove_padding", "use_remove_padding"),
        grpo("actor_rollout_ref.actor.optim.lr", "learning_rate"),
        grpo("actor_rollout_ref.actor.ppo_mini_batch_size", "ppo_mini_batch_size"),
        grpo("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "ppo_micro_batch_size_per_gpu"),
        grpo("actor_rollout_ref.actor.use_kl_loss", "use_kl_loss"),
        grpo("actor_rollout_ref.actor.use_dynamic_bsz", "use_dynamic_bsz"),
        grpo("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "ppo_max_token_len_per_gpu"),
        Override("actor_rollout_ref.actor.strategy", "fsdp2", ""),
        Override("actor_rollout_ref.actor.ulysses_sequence_parallel_size", sp if sp > 1 else None,
                 "grpo.ulysses_sequence_parallel_size"),
        Override("actor_rollout_ref.rollout.name", "vllm", ""),
        grpo("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
             "rollout_log_prob_micro_batch_size_per_gpu"),
        grpo("actor_rollout_ref.rollout.tensor_model_parallel_size", "rollout_tensor_parallel_size"),
        grpo("actor_rollout_ref.rollout.gpu_memory_utilization", "gpu_memory_utilization"),
        grpo("actor_rollout_ref.rollout.n", "rollout_n"),
        grpo("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", "use_dynamic_bsz"),
        grpo("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu"),
        grpo("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "ref_log_prob_micro_batch_size_per_gpu"),
        grpo("actor_rollout_ref.ref.log_prob_use_dynamic_bsz", "use_dynamic_bsz"),
        grpo("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu"),
        grpo("algorithm.kl_ctrl.kl_coef", "kl_coef"),
        grpo("trainer.logger", "logger"),
        grpo("trainer.val_before_train", "val_before_train"),
        Override("trainer.n_gpus_per_node", gpus_per_node, "platform"),
        Override("trainer.nnodes", nnodes, "gpu_nodes"),
        grpo("trainer.save_freq", "save_freq"),
        grpo("trainer.test_freq", "test_freq"),
        grpo("trainer.total_epochs", "total_epochs"),
        # Each run its own folder: a checkpoint is valid for one run only.
        Override("trainer.default_local_dir", run_checkpoint_dir(spec.checkpoint_dir, run_id), "grpo.checkpoint_dir"),
        # verl keeps every checkpoint unless told (~390 GB each for a 32B model with optimizer state).
        grpo("trainer.max_actor_ckpt_to_keep", "max_checkpoints"),
        grpo("trainer.max_critic_ckpt_to_keep", "max_checkpoints"),
        # A resubmitted run (after a preemption) resumes from the latest checkpoint.
        Override("trainer.resume_mode", "auto", "managed"),
        Override("trainer.use_v1", False if legacy_trainer else None, ""),
    ]


def _render(value: object) -> str:
    """A value as Hydra reads it on the command line."""
    if isinstance(value, bool):
        return "True" if value else "False"
    return str(value)


# --- checkpoints on local disk (docs/checkpoints-and-a4x.md) ------------------------------------------------
# verl's settings stay the run's (trainer.default_local_dir names the run's folder on the bucket); the
# launcher moves them per attempt: saves to the node's local disk, resume from the bucket's newest complete
# checkpoint (workloads/checkpoints.py, shipped at CHECKPOINT_PROGRAM on every Ray pod).
CHECKPOINT_PROGRAM_DIR = "/opt/verl-gke"
CHECKPOINT_PROGRAM = f"{CHECKPOINT_PROGRAM_DIR}/checkpoints.py"
CHECKPOINT_LAUNCHER = ("python3", CHECKPOINT_PROGRAM, "launch", "--")


def entrypoint(spec: GrpoSpec, gpus_per_node: int, nnodes: int, *, run_id: str = "",
               legacy_trainer: bool = False) -> str:
    """The shell command Ray runs: `python3 -m verl.trainer.main_ppo` with quoted overrides, through the
    checkpoint launcher."""
    args = [o.arg for o in overrides(spec, gpus_per_node, nnodes, run_id=run_id, legacy_trainer=legacy_trainer)]
    args.extend(spec.extra_overrides)
    return " ".join([*CHECKPOINT_LAUNCHER, "python3", "-m", VERL_ENTRY_MODULE, *(shlex.quote(a) for a in args)])


def runtime_env(platform: Platform, *, nnodes: int, worker_cpus: int,
                verl_dir: str | None) -> dict[str, object]:
    """The job's Ray runtime env: the tutorial's variables for the platform, none of its broken
    keys, no pip installs at job start, HF_HOME on the bucket, and `verl_dir` (a verl tree on the
    bucket, None when the image has verl) first on the path of the driver and every worker."""
    env = {
        "PYTHONUNBUFFERED": "1",
        "LD_LIBRARY_PATH": platform.ld_library_path,
        "NCCL_DEBUG": "INFO",
        **platform.nccl_env,
        "HF_HOME": f"{MOUNT_PATH}/{HF_CACHE_DIR}",
        "GLOO_SOCKET_IFNAME": "eth0",
        "NUM_WORKERS": str(nnodes),
        "CPUS_PER_WORKER": str(worker_cpus),
        "GPUS_PER_WORKER": str(platform.gpus_per_node),
    }
    if verl_dir:
        env.update(verl_path_env(verl_dir))
    return {"env_vars": env}
