"""The run as verl will read it: the job's command line composed by Hydra with the pinned verl's own
config (`ppo_trainer.yaml` from its wheel), checked before anything is created, and the run's plan.

Hydra and omegaconf only. Importing any verl module pulls in torch, so verl's Python validator
(`verl.utils.config.validate_config`) runs in the tests against every stack's synth, and the
program's batch rules live in grpo_spec.verl_problems.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hydra.errors import HydraException
from omegaconf import DictConfig

from domain import algorithms, run_memory, run_time, start_from, user_data
from domain.checkpoint_time import CHECKPOINT_BYTES_PER_PARAM, MODEL_BYTES_PER_PARAM, CheckpointTime, checkpoint_time
from domain.config import StackConfig, config_key, problem_line
from domain.grpo_spec import Override, overrides
from domain.measured import Measured
from domain.run_time import RunTime
from domain.stack_run import stack_run
from domain.verl_settings import compose_run
from domain.verl_wheel import VerlUnavailable, config_dir
_BILLIONS = re.compile(r"(?<![0-9.])([0-9]+(?:\.[0-9]+)?)B(?![a-zA-Z])")
_QUOTED = re.compile(r"'([^']+)'")
SETTINGS_HEADER = "verl settings (the platform's defaults; * = set in verl-gke:verl):"
"""Heads the plan's list of the job's verl settings, one `  * path=value` (the user's) or `    path=value` a line."""


@dataclass(frozen=True)
class RunPlan:
    """What the run will do and write, from the composed config."""

    verl_version: str
    steps: int | None
    """None when the dataset's size is unknown here (not a recipe's pinned revision, domain/staged.py)."""
    save_freq: int
    checkpoints_saved: int | None
    checkpoints_kept: int | None
    checkpoint_bytes: int | None
    """Estimated size of one checkpoint; None when the model's size is not in its name."""
    warnings: list[str] = field(default_factory=list)
    run_id: str = ""
    checkpoint_folder: str = ""
    """Where the run's checkpoints go: verl's trainer.default_local_dir, `<verl.trainer.default_local_dir>/<run id>`."""
    checkpoint_time: CheckpointTime | None = None
    """The GPU time the saves cost (domain/checkpoint_time.py); None when their size or count is unknown."""
    time: RunTime | None = None
    """The modeled step and run time; None for a model not in the model table."""
    hourly_usd: float | None = None
    """The stack's price per hour, for the run's cost; None when unknown."""
    settings: tuple[str, ...] = ()
    """The job's verl settings, `path=value`, the user's marked."""
    start: str = ""
    """The warm start (domain/start_from.lineage), "" for none."""
    algorithm: str = "GRPO"
    """domain/algorithms.name."""
    steps_at_most: bool = False
    """`steps` is an upper bound: data.filter_overlong_prompts drops prompts verl reads only at the run's start."""

    def lines(self) -> list[str]:
        """The plan as a few lines for synth's summary and `pulumi up`'s log."""
        steps = ("steps unknown (the data is not a staged dataset's pinned revision)" if self.steps is None else
                 f"at most {self.steps} steps (an upper bound: data.filter_overlong_prompts drops the prompts longer "
                 "than data.max_prompt_length before the run)" if self.steps_at_most else f"{self.steps} steps")
        out = [f"{self.algorithm} run with verl {self.verl_version}: {steps}"]
        if self.run_id:
            out.append(f"  run id {self.run_id}, checkpoints in {self.checkpoint_folder}")
        if self.start:
            carried = "its model and optimizer state" if self.start.startswith("run ") else "its weights"
            out.append(f"  warm start from {self.start} ({carried})")
        if self.save_freq <= 0:
            out.append("  checkpoints: none (trainer.save_freq <= 0): a preempted run starts over")
        elif self.checkpoints_saved is not None:
            size = ""
            if self.checkpoint_bytes is not None and self.checkpoints_kept is not None:
                size = (f", ~{_gb(self.checkpoint_bytes)} each, "
                        f"~{_gb(self.checkpoint_bytes * self.checkpoints_kept)} in the bucket")
            # Kept across attempts too: the bucket's rotation is workloads/checkpoints.py's, not verl's.
            out.append(f"  checkpoints: every {self.save_freq} steps and at the end: "
                       f"{self.checkpoints_saved} saved, {self.checkpoints_kept} kept{size}")
            if self.checkpoint_time is not None:
                out.append(f"  {self.checkpoint_time.line()}")
        out += self.time.lines(self.hourly_usd) if self.time else ["Modeled run: not made (the model is not in the "
                                                                   "model table)"]
        if self.settings:
            out.append(SETTINGS_HEADER)
            out += [f"  {line}" for line in self.settings]
        return out


def _gb(n: int) -> str:
    return f"{n / 1e12:.1f} TB" if n >= 1e12 else f"{n / 1e9:.0f} GB"


def check_run(cfg: StackConfig, config_dir: Path, measured: Measured | None = None) -> tuple[list[str], RunPlan | None]:
    """The job's own command line composed by Hydra with the pinned verl's config: its problems (each naming
    the config key behind it), or the run's plan (at a run's `measured` rates where it measured them)."""
    run_id, legacy = stack_run(cfg)
    program = overrides(cfg.verl, run_id=run_id, legacy_trainer=legacy)
    try:
        composed = compose_run(config_dir, [o.arg for o in program])
    except HydraException as e:
        return [_program_problem(e, cfg, program)], None
    return [], _plan(cfg, composed, _warnings(composed, cfg.verl.given), run_id, measured)


def _program_problem(error: HydraException, cfg: StackConfig, program: list[Override]) -> str:
    """Hydra's reason for one of the command line's overrides, named by the config key behind it."""
    # Hydra quotes the key ('trainer.x') or the whole override ('trainer.x=v').
    quoted = {q.split("=", 1)[0].lstrip("+") for q in _QUOTED.findall(str(error))}
    reason = f"verl {cfg.verl.version} rejects it: {_one_line(error)}"
    for o in program:
        if o.key in quoted and o.key in cfg.verl.given:
            return problem_line(config_key(f"verl.{o.key}"), o.value, reason)
    return f"verl {cfg.verl.version} rejects verl-gke's own overrides: {_one_line(error)}"


def _warnings(composed: DictConfig, given: Iterable[str]) -> list[str]:
    """Paths the user set that the composed run never reads (verl 0.6.1-0.9.x semantics)."""
    in_reward = bool(composed.algorithm.use_kl_in_reward)
    kl_loss = bool(composed.actor_rollout_ref.actor.use_kl_loss)
    unread = []
    if not in_reward:
        unread.append(("algorithm.kl_ctrl.", "verl reads algorithm.kl_ctrl only with algorithm.use_kl_in_reward=True "
                       "(the KL loss weight is actor_rollout_ref.actor.kl_loss_coef)"))
    if not kl_loss:
        unread.append(("actor_rollout_ref.actor.kl_loss_", "actor_rollout_ref.actor.use_kl_loss is false"))
    if not (in_reward or kl_loss):
        unread.append(("actor_rollout_ref.ref.", "verl builds no reference policy unless the KL loss or in-reward "
                       "KL is on"))
    return [f"{config_key('verl.' + path)} has no effect: {why}"
            for path in sorted(given) for prefix, why in unread if path.startswith(prefix)]


def _plan(cfg: StackConfig, composed: DictConfig, warnings: list[str], run_id: str,
          measured: Measured | None = None) -> RunPlan:
    trainer = composed.trainer
    steps = trainer.total_training_steps
    recipe = cfg.recipe
    at_most = False
    # A local dataDir's rows from its parquet footers, else the staged recipe's (gs:// data: unknown offline).
    rows = user_data.row_counts(cfg.data_dir) or (
        {"data.train_files": recipe.train_rows, "data.val_files": recipe.test_rows}
        if not cfg.data_dir and (cfg.dataset, cfg.dataset_revision) == (recipe.repo, recipe.revision) else None)
    if steps is None and rows:
        # verl's train loader drops the last partial batch.
        steps = rows["data.train_files"] // composed.data.train_batch_size * trainer.total_epochs
        at_most = bool(composed.data.filter_overlong_prompts)
    save_freq = int(trainer.save_freq)
    saved = kept = None
    if steps is not None and save_freq > 0:
        # verl saves every save_freq steps and after the last one.
        saved = len(set(range(save_freq, steps + 1, save_freq)) | {steps})
        keep = trainer.max_actor_ckpt_to_keep
        kept = saved if keep is None else min(saved, int(keep))
    shape = run_memory.MODELS.get(cfg.model)
    billions = _BILLIONS.search(cfg.model.rsplit("/", 1)[-1])
    params = shape.params if shape else int(float(billions.group(1)) * 1e9) if billions else None
    # A critic saves a checkpoint as large as the actor's; LoRA's optimizer state is the adapters' alone.
    per_param = MODEL_BYTES_PER_PARAM if algorithms.lora_rank(cfg.verl) else CHECKPOINT_BYTES_PER_PARAM
    size = (params * per_param + (params * CHECKPOINT_BYTES_PER_PARAM if algorithms.has_critic(cfg.verl) else 0)
            if params else None)
    timing = (checkpoint_time(cfg.facts, checkpoint_bytes=size, nodes=cfg.gpu_nodes, saves=saved, measured=measured)
              if size is not None and saved else None)
    time = None
    if shape and cfg.facts.peak_bf16_flops:
        reference = run_memory.has_reference(cfg.verl)
        time = run_time.model(run_time.RunShape(
            params=shape.params, sequences=int(composed.data.train_batch_size * composed.actor_rollout_ref.rollout.n),
            n_gpus=cfg.facts.gpus_per_node * cfg.gpu_nodes, peak_flops=cfg.facts.peak_bf16_flops,
            reference=reference,
            recompute=bool(composed.actor_rollout_ref.model.enable_gradient_checkpointing),
            steps=steps, checkpoint_s=timing.total_s if timing else 0.0,
            max_response_tokens=int(composed.data.max_response_length),
            validation_prompts=rows["data.val_files"] if rows else recipe.test_rows,
            steps_at_most=at_most,
            validations=run_time.validation_passes(steps, int(trainer.test_freq)),
            validate_first=bool(trainer.val_before_train),
            model_loads=1 + int(reference and not algorithms.lora_rank(cfg.verl)) + int(algorithms.has_critic(cfg.verl)),
            critic=algorithms.has_critic(cfg.verl), lora=algorithms.lora_rank(cfg.verl) > 0),
            run_time.Assumptions.for_platform(cfg.platform, recipe, measured, own_data=bool(cfg.data_dir)))
    shown = [f"{'*' if o.key in cfg.verl.given else ' '} {o.arg}" for o in overrides(cfg.verl)]
    return RunPlan(cfg.verl.version, steps, save_freq, saved, kept, size, warnings, run_id=run_id,
                   checkpoint_folder=str(trainer.default_local_dir), checkpoint_time=timing, time=time,
                   hourly_usd=cfg.hourly_usd, settings=tuple(shown), start=start_from.lineage(cfg.start_from),
                   algorithm=algorithms.name(cfg.verl), steps_at_most=at_most)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def verl_run_check(cfg: StackConfig, measured: Measured | None = None) -> tuple[list[str], RunPlan | None]:
    """The run composed with its pinned verl's own config: (problems, RunPlan or None)."""
    try:
        folder = config_dir(cfg.verl.release)
    except VerlUnavailable as e:
        return [f"cannot check the GRPO run against verl's own config: {e}"], None
    return check_run(cfg, folder, measured)
