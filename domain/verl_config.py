"""The run as verl will read it: the job's overrides composed with the pinned verl's own Hydra
config (`ppo_trainer.yaml` from its wheel), checked before anything is created.

Hydra and omegaconf only. Importing any verl module pulls in torch, so verl's Python validator
(`verl.utils.config.validate_config`) runs in the tests against every stack's synth, and the
program's batch rules live in grpo_spec.verl_problems.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig

from domain.checkpoint_time import CheckpointTime, checkpoint_time
from domain.config import StackConfig, config_key, grpo_field_of, problem_line
from domain.grpo_spec import Override, override_sources, overrides
from domain.stack_files import engine_string, project_defaults
from domain.stack_run import stack_run
from domain.verl_wheel import VerlUnavailable, config_dir
from workloads.stage_data import DEFAULT_DATASET_REPO, DEFAULT_DATASET_REVISION, DEFAULT_DATASET_TRAIN_ROWS

CONFIG_NAME = "ppo_trainer"
EXTRA = "grpo.extra_overrides"
# Why a key is verl-gke's alone (Override.source == "managed").
MANAGED_BECAUSE = {
    "trainer.resume_mode": "a resubmitted run (after a preemption) must resume from its latest checkpoint",
}
# An FSDP checkpoint with AdamW state: fp32 weights plus two fp32 moments per parameter
# (a 32.5B model: ~390 GB).
CHECKPOINT_BYTES_PER_PARAM = 12
_BILLIONS = re.compile(r"(?<![0-9.])([0-9]+(?:\.[0-9]+)?)B(?![a-zA-Z])")
_QUOTED = re.compile(r"'([^']+)'")


@dataclass(frozen=True)
class RunPlan:
    """What the run will do and write, from the composed config."""

    verl_version: str
    steps: int | None
    """None when the dataset's size is unknown here (not the pinned GSM8K)."""
    save_freq: int
    checkpoints_saved: int | None
    checkpoints_kept: int | None
    checkpoint_bytes: int | None
    """Estimated size of one checkpoint; None when the model's size is not in its name."""
    warnings: list[str] = field(default_factory=list)
    run_id: str = ""
    checkpoint_folder: str = ""
    """Where the run's checkpoints go: verl's trainer.default_local_dir, `<grpoCheckpointDir>/<run id>`."""
    checkpoint_time: CheckpointTime | None = None
    """The GPU time the saves cost (domain/checkpoint_time.py); None when their size or count is unknown."""

    def lines(self) -> list[str]:
        """The plan as a few lines for synth's summary and `pulumi up`'s log."""
        steps = f"{self.steps} steps" if self.steps is not None else "steps unknown (dataset not the pinned GSM8K)"
        out = [f"GRPO run with verl {self.verl_version}: {steps}"]
        if self.run_id:
            out.append(f"  run id {self.run_id}, checkpoints in {self.checkpoint_folder}")
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
        return out


def _gb(n: int) -> str:
    return f"{n / 1e12:.1f} TB" if n >= 1e12 else f"{n / 1e9:.0f} GB"


def parse_problems(extras: Iterable[str], sources: dict[str, str]) -> list[str]:
    """Each extra override that is not one Hydra `key=value`, or that sets a key verl-gke owns."""
    parser = OverridesParser.create()
    out: list[str] = []

    def bad(text: str, message: str) -> None:
        out.append(problem_line(config_key(EXTRA), text, message))

    for text in extras:
        if not text.strip() or "\n" in text or "\r" in text:
            bad(text, "each item is one `key=value` on one line")
            continue
        if text.startswith("-"):
            bad(text, "a command-line flag; only Hydra overrides (`key=value`) go here")
            continue
        try:
            [parsed] = parser.parse_overrides([text])
        except HydraException as e:
            bad(text, f"Hydra cannot parse it: {_one_line(e)}")
            continue
        if not parsed.key_or_group:
            bad(text, "has no key; write `key=value`")
        elif parsed.is_sweep_override():
            bad(text, "is a sweep (several values); one job runs one value")
        elif parsed.key_or_group in sources:
            bad(text, _owned_message(parsed.key_or_group, sources[parsed.key_or_group]))
    return out


def _owned_message(key: str, source: str) -> str:
    if source == "managed":
        return f"sets {key}, which verl-gke owns: {MANAGED_BECAUSE[key]}"
    return f"sets {key}, which verl-gke sets from {config_key(source)}: set that key instead"


def compose_run(config_dir: Path, args: list[str]) -> DictConfig:
    """verl's `ppo_trainer` config with `args` applied, as `main_ppo` composes it."""
    with initialize_config_dir(config_dir=str(config_dir), version_base=None, job_name="verl-gke"):
        return compose(CONFIG_NAME, overrides=args)


def check_run(cfg: StackConfig, config_dir: Path, verl_version: str,
              user_set: set[str]) -> tuple[list[str], RunPlan | None]:
    """The problems of the run against verl's config (each naming its config key), or its plan.

    `user_set` holds the StackConfig fields the user set (`grpo.kl_coef`, ...): only those are
    warned about when they have no effect.
    """
    gpus, nodes = cfg.facts.gpus_per_node, cfg.gpu_nodes
    extras = list(cfg.grpo.extra_overrides)
    problems = parse_problems(extras, override_sources(cfg.grpo, gpus, nodes))
    # With the run id: the composed trainer.default_local_dir is the run's own checkpoint folder.
    run_id = stack_run(cfg)[0]
    program = overrides(cfg.grpo, gpus, nodes, run_id=run_id)
    base = [o.arg for o in program]
    valid_extras = [] if problems else extras
    try:
        composed = compose_run(config_dir, base + valid_extras)
    except HydraException as e:
        try:
            compose_run(config_dir, base)
        except HydraException as own:
            return [*problems, _program_problem(own, cfg, program, verl_version)], None
        # Hydra stops at the first bad override: try each alone to name them all.
        rejected = []
        for text in valid_extras:
            try:
                compose_run(config_dir, [*base, text])
            except HydraException as alone:
                rejected.append(problem_line(config_key(EXTRA), text, _rejected(alone, verl_version)))
        return rejected or [problem_line(config_key(EXTRA), extras, _rejected(e, verl_version))], None
    if problems:
        return problems, None
    return [], _plan(cfg, composed, verl_version, _warnings(composed, user_set, extras), run_id)


def _rejected(error: HydraException, verl_version: str) -> str:
    return f"verl {verl_version} rejects it: {_one_line(error)}"


def _program_problem(error: HydraException, cfg: StackConfig, program: list[Override], verl_version: str) -> str:
    """Hydra's reason for one of the program's own overrides, named by the config key behind it."""
    # Hydra quotes the key ('trainer.x') or the whole override ('trainer.x=v').
    quoted = {q.split("=", 1)[0] for q in _QUOTED.findall(str(error))}
    for o in program:
        if o.key in quoted and o.source.startswith("grpo."):
            value = getattr(cfg.grpo, o.source.removeprefix("grpo."))
            return problem_line(config_key(o.source), value, _rejected(error, verl_version))
    return f"verl {verl_version} rejects verl-gke's own overrides: {_one_line(error)}"


def _warnings(composed: DictConfig, user_set: set[str], extras: list[str]) -> list[str]:
    """Keys the user set that the composed run never reads (verl 0.6.1-0.9.x semantics)."""
    in_reward = bool(composed.algorithm.use_kl_in_reward)
    kl_loss = bool(composed.actor_rollout_ref.actor.use_kl_loss)
    parser = OverridesParser.create()  # the extras parsed already in parse_problems
    extra_keys = {text: parser.parse_overrides([text])[0].key_or_group for text in extras}
    out = []
    if not in_reward:
        why = "verl reads algorithm.kl_ctrl only with algorithm.use_kl_in_reward=True"
        if "grpo.kl_coef" in user_set:
            out.append(f"{config_key('grpo.kl_coef')} has no effect: {why} "
                       "(the KL loss weight is actor_rollout_ref.actor.kl_loss_coef)")
        out += [f"{config_key(EXTRA)} item {text!r} has no effect: {why}"
                for text, key in extra_keys.items() if key.startswith("algorithm.kl_ctrl.")]
    if not kl_loss:
        out += [f"{config_key(EXTRA)} item {text!r} has no effect: actor_rollout_ref.actor.use_kl_loss is false"
                for text, key in extra_keys.items() if key.startswith("actor_rollout_ref.actor.kl_loss_")]
    if not (in_reward or kl_loss) and "grpo.ref_log_prob_micro_batch_size_per_gpu" in user_set:
        out.append(f"{config_key('grpo.ref_log_prob_micro_batch_size_per_gpu')} has no effect: verl builds no "
                   "reference policy unless the KL loss or in-reward KL is on")
    return out


def _plan(cfg: StackConfig, composed: DictConfig, verl_version: str, warnings: list[str], run_id: str) -> RunPlan:
    trainer = composed.trainer
    steps = trainer.total_training_steps
    if steps is None and (cfg.dataset, cfg.dataset_revision) == (DEFAULT_DATASET_REPO, DEFAULT_DATASET_REVISION):
        # verl's train loader drops the last partial batch.
        steps = DEFAULT_DATASET_TRAIN_ROWS // composed.data.train_batch_size * trainer.total_epochs
    save_freq = int(trainer.save_freq)
    saved = kept = None
    if steps is not None and save_freq > 0:
        # verl saves every save_freq steps and after the last one.
        saved = len(set(range(save_freq, steps + 1, save_freq)) | {steps})
        keep = trainer.max_actor_ckpt_to_keep
        kept = saved if keep is None else min(saved, int(keep))
    billions = _BILLIONS.search(cfg.model.rsplit("/", 1)[-1])
    size = int(float(billions.group(1)) * 1e9 * CHECKPOINT_BYTES_PER_PARAM) if billions else None
    timing = (checkpoint_time(cfg.facts, checkpoint_bytes=size, nodes=cfg.gpu_nodes, saves=saved)
              if size is not None and saved else None)
    return RunPlan(verl_version, steps, save_freq, saved, kept, size, warnings, run_id=run_id,
                   checkpoint_folder=str(trainer.default_local_dir), checkpoint_time=timing)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def verl_run_check(cfg: StackConfig, raw: Mapping[str, Any]) -> tuple[list[str], Any]:
    """The run composed with its pinned verl's own config: (problems, RunPlan or None)."""

    release = cfg.facts.verl
    try:
        folder = config_dir(release)
    except VerlUnavailable as e:
        return [f"cannot check the GRPO run against verl's own config: {e}"], None
    # The engine hands over Pulumi.yaml's defaults too: "set" means changed from the default.
    defaults = {key: engine_string(value) for key, value in project_defaults().items()}
    user_set = {f for key, value in raw.items()
                if (f := grpo_field_of(key)) and str(value) != defaults.get(key)}
    return check_run(cfg, folder, release.version, user_set)
