"""The GRPO run: its verl settings per platform, verl's batch rules, the entrypoint and runtime env.

Pure (no Pulumi): the program builds it from stack config, the job provider receives only the
rendered `entrypoint` and `runtime_env`. Defaults are the tutorial's two `ray job submit`
commands (A4/A3 Ultra and A4X); the user's `verl-gke:verl` values go over them
(domain/verl_settings.py), and verl's own checks run before anything is provisioned.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from domain import algorithms, run_memory, verl_settings
from domain.algorithms import FSDP_ONLY
from domain.bucket import HF_CACHE_DIR, MOUNT_PATH, run_checkpoint_dir
from domain.platforms import IMAGE_ROLLOUTS, Platform
from domain.verl_settings import Problem, VerlSettings
from domain.staged import model_dir_for

VERL_ENTRY_MODULE = "verl.trainer.main_ppo"

PYCACHE_DIR = "/tmp/pycache"
"""Bytecode of a verl tree on the bucket goes to local disk, not back into the bucket from every node."""


def verl_path_env(verl_dir: str) -> dict[str, str]:
    """A verl tree first on the path: verl is pure Python, so this acts as `pip install --no-deps`
    would, the image's dependencies untouched. (The tutorial's init container ran `pip install -e`
    in its own root filesystem, which the Ray containers never see.)"""
    return {"PYTHONPATH": verl_dir, "PYTHONPYCACHEPREFIX": PYCACHE_DIR}


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

CHECKPOINT_DIR = "trainer.default_local_dir"
"""Where the run's checkpoints go; verl-gke appends the run id (each run its own folder)."""
DEFAULT_CHECKPOINT_DIR = f"{MOUNT_PATH}/verl/checkpoints"
USE_V1 = "trainer.use_v1"
BUCKET_PATHS = ("data.train_files", "data.val_files", "actor_rollout_ref.model.path", CHECKPOINT_DIR)
"""Paths every node must read (or write) alike: under the bucket mount."""

# The run's settings in command-line order: the tutorial's `ray job submit` for A4 / A3 Ultra (mini batch
# 256, no KL loss, no validation before training) with an execution profile that changes only how fast it
# runs (verl's 32B example examples/ppo_trainer/run_qwen2.5-32b.sh: micro batches 8 and 16, used by verl
# only where dynamic batch size is off; remove-padding and token-budget micro batches, which the GSM8K
# prompts and answers fill well under half of 512 + 512). None: not set (verl's default) unless a
# platform or verl-gke sets it.
_SETTINGS: dict[str, Any] = {
    "algorithm.adv_estimator": "grpo",
    "data.train_files": f"{MOUNT_PATH}/gsm8k/train.parquet",
    "data.val_files": f"{MOUNT_PATH}/gsm8k/test.parquet",
    "data.train_batch_size": 256,
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    "actor_rollout_ref.model.path": None,  # where staging puts the model
    "actor_rollout_ref.model.use_remove_padding": True,
    "actor_rollout_ref.actor.optim.lr": 1e-5,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 256,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8,
    "actor_rollout_ref.actor.use_kl_loss": None,
    "actor_rollout_ref.actor.use_dynamic_bsz": True,
    # Tokens per actor-update micro batch (verl's default budget).
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 16384,
    "actor_rollout_ref.actor.strategy": "fsdp2",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": None,
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 16,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": None,  # chosen for the GPU's memory
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.6,
    "actor_rollout_ref.rollout.n": 8,
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": True,
    # Log-prob passes are forward only, no activations kept: twice the update's budget.
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": 32768,
    "actor_rollout_ref.rollout.max_num_seqs": None,  # sized to the requests each replica gets
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 16,
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": True,
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": 32768,
    "algorithm.kl_ctrl.kl_coef": 0.001,
    "trainer.logger": ["console"],
    "trainer.val_before_train": None,
    "trainer.n_gpus_per_node": None,  # the platform's
    "trainer.nnodes": None,  # gpuNodes
    "trainer.save_freq": 10,
    "trainer.test_freq": 10,
    "trainer.total_epochs": 2,
    CHECKPOINT_DIR: DEFAULT_CHECKPOINT_DIR,
    # verl keeps every checkpoint unless told (~390 GB each for a 32B model with optimizer state).
    "trainer.max_actor_ckpt_to_keep": 2,
    "trainer.max_critic_ckpt_to_keep": 2,
    # A resubmitted run (after a preemption) resumes from the latest checkpoint.
    "trainer.resume_mode": "auto",
    USE_V1: None,  # false where the budget's deadline needs verl's legacy trainer
}
PLATFORM_SETTINGS: dict[str, dict[str, Any]] = {
    "a4": {"trainer.val_before_train": False},
    "a3u": {"trainer.val_before_train": False},
    "g2": {"trainer.val_before_train": False},
    # The tutorial's A4X `ray job submit` inside the head pod: mini batch 64 with the KL loss. The update's
    # token budget holds a whole mini-batch share of a GPU (64 x 8 / 16 GPUs x (512 + 512) = 32,768 tokens),
    # so a mini-batch is one micro-batch: verl 0.9.0 keeps an unsharded fp32 gradient across micro-batches
    # (VerlRelease.defers_gradient_sync), ~122 GiB of a 185 GiB GB200.
    "a4x": {"actor_rollout_ref.actor.ppo_mini_batch_size": 64, "actor_rollout_ref.actor.use_kl_loss": True,
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 32768},
}
OWNED: dict[str, str] = {
    "trainer.nnodes": "verl-gke sets it from verl-gke:gpuNodes; set that key instead.",
    "trainer.n_gpus_per_node": "verl-gke sets it from verl-gke:platform (the GPUs of its machine type).",
    "trainer.resume_mode": "verl-gke owns it: a resubmitted run (after a preemption) must resume from its "
                           "latest checkpoint; to start from another run's, set verl-gke:startFrom.",
    "trainer.resume_from_path": "verl-gke sets it from verl-gke:startFrom ({\"run\": <run id>, \"step\": N}); set "
                                "that key instead.",
}
"""Paths verl-gke sets itself, and why a user may not."""

_A, _R, _F = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "actor_rollout_ref.ref."
_SIZES = ("data.train_batch_size", "data.max_prompt_length", "data.max_response_length", _A + "ppo_mini_batch_size",
          _A + "ppo_max_token_len_per_gpu", _A + "ulysses_sequence_parallel_size", _R + "tensor_model_parallel_size",
          _R + "n", _R + "max_num_seqs", _R + "log_prob_max_token_len_per_gpu", _F + "log_prob_max_token_len_per_gpu",
          "trainer.total_epochs")
_MICRO_SIZES = (_A + "ppo_micro_batch_size_per_gpu", _R + "log_prob_micro_batch_size_per_gpu",
                _F + "log_prob_micro_batch_size_per_gpu")
BOUNDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    **{path: (lambda v: v >= 1, "at least 1") for path in _SIZES},
    **{path: (lambda v: v is None or v >= 1, "at least 1, or null") for path in _MICRO_SIZES},
    _R + "gpu_memory_utilization": (lambda v: 0 < v <= 1, "greater than 0 and at most 1 (a share of the GPU's memory)"),
}
"""The sizes and shares the run's rules divide by or take a share of: what verl-gke:verl may set them to."""
RENAMED: dict[str, tuple[str, ...]] = {
    "grpoTrainBatchSize": ("data.train_batch_size",),
    "grpoMaxPromptLength": ("data.max_prompt_length",),
    "grpoMaxResponseLength": ("data.max_response_length",),
    "grpoLearningRate": (_A + "optim.lr",),
    "grpoPpoMiniBatchSize": (_A + "ppo_mini_batch_size",),
    "grpoPpoMicroBatchSizePerGpu": (_A + "ppo_micro_batch_size_per_gpu",),
    "grpoRolloutLogProbMicroBatchSizePerGpu": (_R + "log_prob_micro_batch_size_per_gpu",),
    "grpoRefLogProbMicroBatchSizePerGpu": (_F + "log_prob_micro_batch_size_per_gpu",),
    "grpoRolloutTensorParallelSize": (_R + "tensor_model_parallel_size",),
    "grpoGpuMemoryUtilization": (_R + "gpu_memory_utilization",),
    "grpoRolloutN": (_R + "n",),
    "grpoKlCoef": ("algorithm.kl_ctrl.kl_coef",),
    "grpoUseKlLoss": (_A + "use_kl_loss",),
    "grpoValBeforeTrain": ("trainer.val_before_train",),
    "grpoUlyssesSequenceParallelSize": (_A + "ulysses_sequence_parallel_size",),
    "grpoUseRemovePadding": ("actor_rollout_ref.model.use_remove_padding",),
    "grpoUseDynamicBsz": (_A + "use_dynamic_bsz", _R + "log_prob_use_dynamic_bsz", _F + "log_prob_use_dynamic_bsz"),
    "grpoPpoMaxTokenLenPerGpu": (_A + "ppo_max_token_len_per_gpu",),
    "grpoLogProbMaxTokenLenPerGpu": (_R + "log_prob_max_token_len_per_gpu", _F + "log_prob_max_token_len_per_gpu"),
    "grpoTotalEpochs": ("trainer.total_epochs",),
    "grpoSaveFreq": ("trainer.save_freq",),
    "grpoTestFreq": ("trainer.test_freq",),
    "grpoLogger": ("trainer.logger",),
    "grpoTrainFiles": ("data.train_files",),
    "grpoValFiles": ("data.val_files",),
    "grpoModelPath": ("actor_rollout_ref.model.path",),
    "grpoCheckpointDir": (CHECKPOINT_DIR,),
    "grpoMaxCheckpoints": ("trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep"),
    "grpoExtraOverrides": (),  # each `key=value` item becomes verl-gke:verl.<key>
}
"""verl-gke 0.5's grpo* keys (verl-gke:<key>) and the verl paths that replace them."""


def defaults(platform: Platform, model: str) -> dict[str, Any]:
    """The platform's settings before the derived ones (rollout TP, max_num_seqs), unset ones left out."""
    given = {**_SETTINGS, **PLATFORM_SETTINGS[platform.name],
             "actor_rollout_ref.model.path": f"{MOUNT_PATH}/{model_dir_for(model)}",
             "trainer.n_gpus_per_node": platform.gpus_per_node}
    return {path: value for path, value in given.items() if value is not None}


def run_settings(platform: Platform, model: str, nnodes: int, given: Mapping[str, Any]) -> VerlSettings:
    """The run's verl settings: the platform's defaults under the user's `given` values (checked already,
    domain/verl_settings.check), the rollout tensor parallel size and vLLM's max_num_seqs derived from
    them where the user did not set them, in command-line order (the user's new paths last)."""
    values = {**defaults(platform, model), "trainer.nnodes": nnodes, **given}
    get = values.get
    batch, n = get("data.train_batch_size"), get("actor_rollout_ref.rollout.n")
    tp_path, seqs_path = "actor_rollout_ref.rollout.tensor_model_parallel_size", "actor_rollout_ref.rollout.max_num_seqs"
    if tp_path not in values:
        values[tp_path] = run_memory.rollout_tp(
            platform, model, util=get("actor_rollout_ref.rollout.gpu_memory_utilization"), batch=batch, n=n,
            seq=get("data.max_prompt_length") + get("data.max_response_length"), nnodes=nnodes)
    if seqs_path not in values:
        values[seqs_path] = requests_per_replica(batch, n, platform.gpus_per_node * nnodes, values[tp_path])
    values.update(algorithms.critic_defaults(values))
    order = {path: i for i, path in enumerate(_SETTINGS)}
    ordered = sorted(values.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))
    return verl_settings.settings(platform.verl, ordered, given=given)


def requests_per_replica(batch: int, n: int, n_gpus: int, tp: int) -> int:
    """The rollout requests each vLLM replica gets in one step: the batch's prompts x n responses shared by
    the n_gpus / tp replicas (verl 0.9.0 defaults `rollout.max_num_seqs` to 256, below the 512 each of the
    4 replicas gets at batch 256 x 8 on 16 GPUs, so half would wait for a slot)."""
    return max(1, math.ceil(batch * n / max(n_gpus // max(tp, 1), 1)))


def verl_problems(run: VerlSettings, gpus_per_node: int, nnodes: int) -> list[Problem]:
    """verl's batch rules, before any GPU is paid for, read from the composed config.

    Three restate verl's `validate_config` (the program cannot import verl: it needs torch), which
    checks them only without dynamic batch size; the program keeps them either way;
    tests/test_verl_config.py holds their verdicts equal to verl's own. The rest verl checks only
    in its workers, once the GPUs are allocated: verl has no earlier rule for them."""
    n_gpus = gpus_per_node * nnodes
    actor = "actor_rollout_ref.actor."
    batch, n = run.get("data.train_batch_size"), run.get("actor_rollout_ref.rollout.n")
    mini, micro = run.get(actor + "ppo_mini_batch_size"), run.get(actor + "ppo_micro_batch_size_per_gpu")
    tp = run.get("actor_rollout_ref.rollout.tensor_model_parallel_size")
    sp = run.get(actor + "ulysses_sequence_parallel_size") or 1
    out: list[Problem] = []

    def add(path: str, message: str) -> None:
        out.append(Problem(path, run.get(path), message))

    # validate_config: real_train_batch_size divisible by the minimal batch (n_gpus).
    if (batch * n) % n_gpus:
        add("data.train_batch_size", f"data.train_batch_size x actor_rollout_ref.rollout.n ({batch * n}) must be "
            f"divisible by the {n_gpus} GPUs ({nnodes} nodes x {gpus_per_node}).")
    # validate_config (ActorConfig.validate): train_batch_size >= ppo_mini_batch_size.
    if mini > batch:
        add(actor + "ppo_mini_batch_size", f"must be <= data.train_batch_size ({batch}).")
    # Only after allocation (rollout worker): world size divisible by TP; TP within a node.
    if tp > gpus_per_node:
        add("actor_rollout_ref.rollout.tensor_model_parallel_size",
            f"a vLLM replica runs within one node: at most the {gpus_per_node} GPUs per node.")
    elif n_gpus % tp:
        add("actor_rollout_ref.rollout.tensor_model_parallel_size", f"must divide the {n_gpus} GPUs of the cluster.")
    elif n_gpus // tp > 1 and gpus_per_node % tp:
        add("actor_rollout_ref.rollout.tensor_model_parallel_size",
            f"must divide the {gpus_per_node} GPUs per node when rollout runs data parallel.")
    # validate_config (ActorConfig.validate): Ulysses needs use_remove_padding.
    if sp > 1 and not run.get("actor_rollout_ref.model.use_remove_padding"):
        add(actor + "ulysses_sequence_parallel_size",
            "Ulysses sequence parallel > 1 needs actor_rollout_ref.model.use_remove_padding = true.")
    # Only after allocation (FSDP worker): the device mesh splits the GPUs by the Ulysses size, and
    # the normalized mini batch must split into data-parallel ranks and micro batches.
    if n_gpus % sp:
        add(actor + "ulysses_sequence_parallel_size", f"must divide the {n_gpus} GPUs of the cluster.")
        return out
    dp = n_gpus // sp
    rollouts = mini * n
    if rollouts % dp:
        add(actor + "ppo_mini_batch_size",
            f"ppo_mini_batch_size x rollout.n ({rollouts}) must be divisible by the data-parallel size ({dp}).")
    elif micro and (rollouts // dp) % micro:
        add(actor + "ppo_micro_batch_size_per_gpu",
            f"must divide the per-GPU mini batch ({rollouts // dp} = ppo_mini_batch_size x rollout.n / {dp}).")
    return out




def token_budget_problems(run: VerlSettings) -> list[Problem]:
    """With dynamic batch size verl's rearrange_micro_batches (verl/utils/seqlen_balancing.py, 0.6.1 and 0.9.0)
    asserts budget x Ulysses size >= the longest sequence (0.6.1: the padded prompt + response; 0.9.0: the
    longest one in the batch, up to the same), in the workers, once the GPUs are up."""
    a, r, f = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "actor_rollout_ref.ref."
    # (dynamic batch flag, budget, Ulysses size) of each pass that splits by tokens.
    passes = [(a + "use_dynamic_bsz", a + "ppo_max_token_len_per_gpu", a + "ulysses_sequence_parallel_size"),
              (r + "log_prob_use_dynamic_bsz", r + "log_prob_max_token_len_per_gpu", a + "ulysses_sequence_parallel_size")]
    if run_memory.has_reference(run) and not algorithms.lora_rank(run):  # with LoRA the actor is the reference
        passes.append((f + "log_prob_use_dynamic_bsz", f + "log_prob_max_token_len_per_gpu",
                       f + "ulysses_sequence_parallel_size"))
    if algorithms.has_critic(run):
        passes += [("critic.use_dynamic_bsz", f"critic.{k}_max_token_len_per_gpu", "critic.ulysses_sequence_parallel_size")
                   for k in ("ppo", "forward")]
    longest = run.get("data.max_prompt_length") + run.get("data.max_response_length")
    out = []
    for dynamic, budget, ulysses in passes:
        sp = run.get(ulysses) or 1
        if run.get(dynamic) and run.get(budget) * sp < longest:
            out.append(Problem(budget, run.get(budget), "with dynamic batch size verl needs it to hold one whole "
                               f"sequence (data.max_prompt_length + data.max_response_length = {longest} tokens, over "
                               f"Ulysses size {sp}): raise it to at least {math.ceil(longest / sp)}."))
    return out


def stack_problems(run: VerlSettings, platform: Platform, model: str, image: str) -> list[Problem]:
    """Settings verl's config takes that cannot run on this stack, refused before anything is created
    (verl itself fails on them only once the GPUs are allocated, or the stack's image lacks what they need)."""
    out: list[Problem] = []

    def add(path: str, message: str) -> None:
        out.append(Problem(path, run.get(path), message))

    engines = IMAGE_ROLLOUTS.get(image)
    engine = run.get("actor_rollout_ref.rollout.name")
    if engines and engine not in engines:
        names = {"vllm": "vLLM", "sglang": "SGLang"}
        add("actor_rollout_ref.rollout.name", f"{image} holds {' and '.join(names.get(e, e) for e in engines)} "
            f"only; use {' or '.join(json.dumps(e) for e in engines)}.")
    # The Ray pods start verl's FSDP workers; Megatron needs Megatron-LM and its own checkpoint layout.
    # The reference's strategy follows the actor's (verl's `${actor_rollout_ref.actor.strategy}`) unless set.
    for path in ("actor_rollout_ref.actor.strategy", "actor_rollout_ref.ref.strategy"):
        if run.get(path) == "megatron" and (path.endswith("actor.strategy") or path in run.given):
            add(path, FSDP_ONLY)
    shape = run_memory.MODELS.get(model)
    tp = run.get("actor_rollout_ref.rollout.tensor_model_parallel_size")
    if shape and platform.gpus_per_node % tp == 0:  # else verl_problems names the TP already
        # vLLM's ModelConfig.verify_with_parallel_config: the attention heads must split evenly over TP.
        heads = shape.hidden // shape.head_dim
        if heads % tp:
            fits = [str(t) for t in range(1, platform.gpus_per_node + 1)
                    if heads % t == 0 and platform.gpus_per_node % t == 0]
            allowed = ", ".join(fits[:-1]) + f" or {fits[-1]}" if len(fits) > 1 else fits[0]
            add("actor_rollout_ref.rollout.tensor_model_parallel_size",
                f"must divide {model}'s {heads} attention heads (vLLM splits them across a replica's GPUs): "
                f"{allowed} on {platform.gpus_per_node} GPUs a node.")
    return out


@dataclass(frozen=True)
class Override:
    """One `key=value` of the job's command line."""

    key: str
    """verl's dotted config path."""
    value: object
    added: bool = False
    """A key new to verl's config (inside a map it leaves open): Hydra wants `+key=value`."""

    @property
    def arg(self) -> str:
        """`key=value` as Hydra reads it on the command line."""
        return f"{'+' if self.added else ''}{self.key}={render(self.value)}"


def overrides(run: VerlSettings, *, run_id: str = "", legacy_trainer: bool = False) -> list[Override]:
    """The run's overrides in command-line order. With `run_id`, the run's checkpoints go to
    `<trainer.default_local_dir>/<run_id>`; `legacy_trainer` runs verl's legacy trainer (the one that
    honours the budget's deadline, domain/run_identity.py) unless the user chose trainer.use_v1."""
    out = []
    for key, value in run.values:
        if key == CHECKPOINT_DIR:
            value = run_checkpoint_dir(str(value), run_id)
        out.append(Override(key, value, key in run.added))
    if legacy_trainer and USE_V1 not in run.given:
        out.append(Override(USE_V1, False))
    return out


@lru_cache(maxsize=1)
def _parser() -> OverridesParser:
    return OverridesParser.create()


def render(value: object) -> str:
    """A value as Hydra reads it back on the command line: True/False, null, [a,b]; a string bare where
    Hydra reads it back as that same string, else quoted."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(render(v) for v in value) + "]"
    text = str(value)
    if not isinstance(value, str):
        return text
    try:
        [parsed] = _parser().parse_overrides([f"k={text}"])
        if parsed.value() == value and not parsed.is_sweep_override():
            return text
    except HydraException:
        pass
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


# --- checkpoints on local disk (docs/checkpoints-and-a4x.md) ------------------------------------------------
# verl's settings stay the run's (trainer.default_local_dir names the run's folder on the bucket); the
# launcher moves them per attempt: saves to the node's local disk, resume from the bucket's newest complete
# checkpoint (workloads/checkpoints.py, shipped at CHECKPOINT_PROGRAM on every Ray pod).
CHECKPOINT_PROGRAM_DIR = "/opt/verl-gke"
CHECKPOINT_PROGRAM = f"{CHECKPOINT_PROGRAM_DIR}/checkpoints.py"
CHECKPOINT_LAUNCHER = ("python3", CHECKPOINT_PROGRAM, "launch", "--")


def entrypoint(run: VerlSettings, *, run_id: str = "", legacy_trainer: bool = False) -> str:
    """The shell command Ray runs: `python3 -m verl.trainer.main_ppo` with quoted overrides, through the
    checkpoint launcher."""
    args = [o.arg for o in overrides(run, run_id=run_id, legacy_trainer=legacy_trainer)]
    return " ".join([*CHECKPOINT_LAUNCHER, "python3", "-m", VERL_ENTRY_MODULE, *(shlex.quote(a) for a in args)])


TRACKERS = ("console", "tensorboard", "mlflow", "wandb")
"""verl's loggers (trainer.logger) the job gets what they need for."""


def loggers(run: VerlSettings) -> list[str]:
    """trainer.logger as a list (verl's Tracking takes one name or a list)."""
    value = run.get("trainer.logger")
    return [value] if isinstance(value, str) else list(value or [])


def tensorboard_dir(run_checkpoint_dir: str) -> str:
    """Where TensorBoard's event files go: beside the run's checkpoints (a folder the Ray pods may write, which
    outlives the cluster; the copiers and rotation touch only its global_step_* folders). Not logs/: the run
    supervisor alone writes there."""
    return f"{run_checkpoint_dir}/tensorboard"


def tracking_env(run: VerlSettings, *, run_checkpoint_dir: str, mlflow_tracking_uri: str) -> dict[str, str]:
    """What verl's Tracking (verl/utils/tracking.py, 0.6.1 and 0.9.0) reads from the environment for the run's
    loggers: `_TensorboardAdapter` writes to $TENSORBOARD_DIR, else to tensorboard_log/<project>/<experiment> in
    the working directory (the pod's disk); mlflow logs to $MLFLOW_TRACKING_URI, else sqlite:////tmp/mlruns.db."""
    names = loggers(run)
    env = {}
    if "tensorboard" in names:
        env["TENSORBOARD_DIR"] = tensorboard_dir(run_checkpoint_dir)
    if "mlflow" in names:
        env["MLFLOW_TRACKING_URI"] = mlflow_tracking_uri
    return env


def runtime_env(platform: Platform, *, nnodes: int, worker_cpus: int,
                verl_dir: str | None, tracking: Mapping[str, str] | None = None) -> dict[str, object]:
    """The job's Ray runtime env: the tutorial's variables for the platform, none of its broken
    keys, no pip installs at job start, HF_HOME on the bucket, `verl_dir` (a verl tree on the
    bucket, None when the image has verl) first on the path of the driver and every worker, and the
    loggers' `tracking` variables (tracking_env)."""
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
    env.update(tracking or {})
    return {"env_vars": env}
