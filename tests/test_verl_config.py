"""The run against the pinned verl's own config: Hydra composition in the program, verl's
validate_config here (a child process: importing verl needs torch)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from domain.config import ConfigError, StackConfig, _as_field_values, load_config
from domain.grpo_spec import CHECKPOINT_LAUNCHER, overrides, override_sources, verl_problems
from domain.platforms import PLATFORMS
from domain.platforms import VerlRelease
from domain.stack_run import stack_run
from domain.verl_config import check_run, compose_run, parse_problems
from tests.conftest import BASE_CONFIG, STACKS
from verl_gke import synth
from domain.verl_wheel import config_dir, unpacked

VALIDATE = Path(__file__).with_name("verl_validate.py")
EXTRA = "verl-gke:grpoExtraOverrides"
# The release before the tutorial's A4X verl commit (ddbcdb7, between 0.8.0 and 0.9.0).
VERL_0_8_0 = VerlRelease(
    "0.8.0",
    "https://files.pythonhosted.org/packages/f2/5d/dd2275e9cf00b4887bcbb1f99c1a5f1c4fb57000cc7cc8e126f6d4f13579/"
    "verl-0.8.0-py3-none-any.whl",
    "4e32830aae80771ee3b5f0d26a2b794d793f3bcece67aff07c2a7c62e948714f",
)


def verl_verdicts(release: VerlRelease, runs: list[list[str]]) -> list[str | None]:
    """verl's validate_config on each run (None: accepted), with the release first on the path."""
    request = json.dumps({"config_dir": str(config_dir(release)), "runs": runs})
    env = {**os.environ, "PYTHONPATH": str(unpacked(release))}
    done = subprocess.run([sys.executable, str(VALIDATE)], input=request, capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def job_args(result: synth.SynthResult) -> list[str]:
    """The overrides of the GRPO job's entrypoint as the program registered it."""
    job = next(r.inputs for r in result.registrations if r.type == synth.GRPO_JOB_TYPE)
    words = shlex.split(job["entrypoint"])
    assert words[:7] == [*CHECKPOINT_LAUNCHER, "python3", "-m", "verl.trainer.main_ppo"]
    return words[7:]


def unchecked(**config: str) -> StackConfig:
    """A StackConfig without the program's own batch rules, to ask verl alone."""
    return StackConfig.model_validate(_as_field_values({**BASE_CONFIG, **config}))


def args_of(cfg: StackConfig) -> list[str]:
    return [o.arg for o in overrides(cfg.grpo, cfg.facts.gpus_per_node, cfg.gpu_nodes)]


@pytest.mark.timeout(600)
def test_every_stack_passes_verls_own_validate_config(synth_stack: Any) -> None:
    by_release: dict[str, list[str]] = {}
    for stack in STACKS:
        by_release.setdefault(PLATFORMS[_platform(stack)].verl.version, []).append(stack)
    for stacks in by_release.values():
        release = PLATFORMS[_platform(stacks[0])].verl
        runs = [job_args(synth_stack(stack)) for stack in stacks]
        assert verl_verdicts(release, runs) == [None] * len(stacks), stacks


def _platform(stack: str) -> str:
    return "a3u" if stack.startswith("a3u") else "a4x" if stack == "a4x" else "a4"


# One case per batch rule: verl's validate_config verdict must match the program's.
VERL_RULES = {
    "train_batch_size x n divisible by the GPUs": {"verl-gke:grpoTrainBatchSize": "255",
                                                   "verl-gke:grpoPpoMiniBatchSize": "255"},
    "mini batch <= train batch": {"verl-gke:grpoPpoMiniBatchSize": "512"},
    "Ulysses needs remove padding": {"verl-gke:grpoUlyssesSequenceParallelSize": "2"},
}
# Rules verl checks only once the GPUs are allocated: validate_config accepts these runs.
AFTER_ALLOCATION = {
    "rollout TP divides the GPUs": {"verl-gke:grpoRolloutTensorParallelSize": "3"},
    "Ulysses size divides the GPUs": {"verl-gke:grpoUlyssesSequenceParallelSize": "3",
                                      "verl-gke:grpoUseRemovePadding": "true"},
    "mini batch x n divisible by data parallel": {"verl-gke:grpoPpoMiniBatchSize": "2",
                                                  "verl-gke:grpoRolloutN": "4"},
    "micro batch divides the per-GPU mini batch": {"verl-gke:grpoPpoMicroBatchSizePerGpu": "3"},
}


# verl's validate_config checks the batch rules only without dynamic batch size (verl/utils/config.py,
# ActorConfig.validate); the program keeps them either way.
STATIC_BATCHES = {"verl-gke:grpoUseDynamicBsz": "false", "verl-gke:grpoUseRemovePadding": "false"}


@pytest.mark.timeout(600)
def test_the_programs_batch_rules_are_verls_or_checked_by_verl_only_after_allocation() -> None:
    cases = {"defaults": {}, **VERL_RULES, **AFTER_ALLOCATION}
    configs = {name: unchecked(**{**STATIC_BATCHES, **given}) for name, given in cases.items()}
    verdicts = dict(zip(cases, verl_verdicts(PLATFORMS["a4"].verl, [args_of(c) for c in configs.values()])))
    ours = {name: verl_problems(c.grpo, c.facts.gpus_per_node, c.gpu_nodes) for name, c in configs.items()}
    assert verdicts["defaults"] is None and ours["defaults"] == []
    for name in VERL_RULES:
        assert verdicts[name] is not None and ours[name], name
    for name in AFTER_ALLOCATION:
        assert verdicts[name] is None and ours[name], name


def test_a4x_run_composes_identically_with_verl_0_8_0_and_the_pinned_0_9_0() -> None:
    cfg = load_config({**BASE_CONFIG, "verl-gke:platform": "a4x", "verl-gke:gpuNodes": "4"})
    args = args_of(cfg)
    pinned = compose_run(config_dir(PLATFORMS["a4x"].verl), args)
    before = compose_run(config_dir(VERL_0_8_0), args)
    keys = [a.split("=", 1)[0] for a in args]
    assert {k: OmegaConf.select(pinned, k) for k in keys} == {k: OmegaConf.select(before, k) for k in keys}


def _check(**config: str) -> tuple[list[str], Any]:
    cfg = load_config({**BASE_CONFIG, **config})
    release = cfg.facts.verl
    user_set = {"grpo." + k for k in ("kl_coef",) if "verl-gke:grpoKlCoef" in config}
    return check_run(cfg, config_dir(release), release.version, user_set)


def test_a_misspelt_override_is_rejected_with_hydras_reason() -> None:
    problems, plan = _check(**{EXTRA: '["trainer.nnodez=3", "trainer.project_name=gsm8k"]'})
    assert plan is None
    assert problems == [f'{EXTRA} = "trainer.nnodez=3": verl 0.6.1 rejects it: Could not override '
                        "'trainer.nnodez'. To append to your config use +trainer.nnodez=3"]


def test_an_added_key_composes() -> None:
    problems, plan = _check(**{EXTRA: '["+trainer.my_tag=1", "trainer.project_name=gsm8k"]'})
    assert problems == [] and plan is not None


def test_a_bad_value_of_a_grpo_key_is_named_by_that_key() -> None:
    problems, _ = _check(**{"verl-gke:grpoLogger": "console,wandb"})
    assert len(problems) == 1
    assert problems[0].startswith('verl-gke:grpoLogger = "console,wandb": verl 0.6.1 rejects it: Ambiguous value')


@pytest.mark.parametrize(("text", "message"), [
    ("", "each item is one `key=value` on one line"),
    ("trainer.a=1\ntrainer.b=2", "each item is one `key=value` on one line"),
    ("--config-name=other", "a command-line flag; only Hydra overrides (`key=value`) go here"),
    ("trainer.logger=[console", "Hydra cannot parse it: no viable alternative at input '[console'"),
    ("=value", "has no key; write `key=value`"),
    ("trainer.seed=1,2", "is a sweep (several values); one job runs one value"),
    ("trainer.nnodes=4", "sets trainer.nnodes, which verl-gke sets from verl-gke:gpuNodes: set that key instead"),
    ("~trainer.n_gpus_per_node", "sets trainer.n_gpus_per_node, which verl-gke sets from verl-gke:platform"),
    ("actor_rollout_ref.model.path=/data/other", "verl-gke sets from verl-gke:grpoModelPath"),
    ("data.train_files=/data/x.parquet", "verl-gke sets from verl-gke:grpoTrainFiles"),
    ("trainer.default_local_dir=/data/ck", "verl-gke sets from verl-gke:grpoCheckpointDir"),
    ("trainer.max_actor_ckpt_to_keep=9", "verl-gke sets from verl-gke:grpoMaxCheckpoints"),
    ("trainer.resume_mode=disable", "which verl-gke owns: a resubmitted run (after a preemption) must resume"),
    # Set by a grpo key even where the platform leaves it unset (a4 sets no use_kl_loss).
    ("actor_rollout_ref.actor.use_kl_loss=True", "verl-gke sets from verl-gke:grpoUseKlLoss"),
])
def test_each_bad_extra_override_is_one_problem_naming_the_key(text: str, message: str) -> None:
    cfg = load_config(BASE_CONFIG)
    problems = parse_problems([text, "trainer.project_name=ok"], override_sources(cfg.grpo, 8, 2))
    assert len(problems) == 1
    assert problems[0].startswith(f"{EXTRA} = {json.dumps(text)}: ")
    assert message in problems[0]


def test_the_plan_counts_steps_checkpoints_and_their_size() -> None:
    _, plan = _check()
    # GSM8K train: 7,473 rows // 256 = 29 steps per epoch, 2 epochs; saves at 10..50 and 58.
    assert (plan.steps, plan.checkpoints_saved, plan.checkpoints_kept) == (58, 6, 2)
    assert plan.checkpoint_bytes == 32 * 10**9 * 12
    run_id = stack_run(load_config(BASE_CONFIG))[0]
    assert re.fullmatch(r"run-[0-9a-f]{12}", run_id)
    assert plan.lines() == [
        "GRPO run with verl 0.6.1: 58 steps",
        f"  run id {run_id}, checkpoints in /data/verl/checkpoints/{run_id}",
        "  checkpoints: every 10 steps and at the end: 6 saved, 2 kept, ~384 GB each, ~768 GB in the bucket",
        # 2 nodes: 192 GB each; 8 ranks x 2 GB/s locally -> 12 s a save, the last copy at 2 GB/s 96 s.
        "  checkpoint time: 6 saves x 12 s to local disk + 96 s for the last copy to the bucket = 168 s of GPU time "
        "(straight to the bucket: 576 s); assumed 2 GB/s per rank into the page cache, 2 GB/s per node to the bucket",
    ]
    # However many attempts: the bucket keeps the newest 2 complete ones (workloads/checkpoints.py rotates).
    _, alone = _check(**{"verl-gke:runSupervisor": "false"})
    assert alone.lines() == plan.lines()
    _, keep_all = _check(**{"verl-gke:grpoMaxCheckpoints": "10", "verl-gke:grpoSaveFreq": "20"})
    assert (keep_all.checkpoints_saved, keep_all.checkpoints_kept) == (3, 3)
    _, none = _check(**{"verl-gke:grpoSaveFreq": "-1"})
    assert none.lines()[2] == "  checkpoints: none (trainer.save_freq <= 0): a preempted run starts over"


def test_the_plan_names_the_runs_own_folder_under_the_checkpoint_dir() -> None:
    config = {"verl-gke:grpoCheckpointDir": "/data/ckpt", "verl-gke:grpoSaveFreq": "20"}
    run_id = stack_run(load_config({**BASE_CONFIG, **config}))[0]
    _, plan = _check(**config)
    assert (plan.run_id, plan.checkpoint_folder) == (run_id, f"/data/ckpt/{run_id}")


def test_max_checkpoints_reaches_verl_for_actor_and_critic() -> None:
    cfg = load_config({**BASE_CONFIG, "verl-gke:grpoMaxCheckpoints": "3"})
    composed = compose_run(config_dir(cfg.facts.verl), args_of(cfg))
    assert (composed.trainer.max_actor_ckpt_to_keep, composed.trainer.max_critic_ckpt_to_keep) == (3, 3)
    with pytest.raises(ConfigError, match='grpoMaxCheckpoints = "0": input should be greater than or equal to 1'):
        load_config({**BASE_CONFIG, "verl-gke:grpoMaxCheckpoints": "0"})


def test_a_set_key_that_verl_never_reads_is_a_warning_not_an_error() -> None:
    problems, plan = _check(**{"verl-gke:grpoKlCoef": "0.1"})
    assert problems == []
    assert plan.warnings == [
        "verl-gke:grpoKlCoef has no effect: verl reads algorithm.kl_ctrl only with "
        "algorithm.use_kl_in_reward=True (the KL loss weight is actor_rollout_ref.actor.kl_loss_coef)"]
    _, with_kl = _check(**{"verl-gke:grpoKlCoef": "0.1", EXTRA: '["algorithm.use_kl_in_reward=True"]'})
    assert with_kl.warnings == []
    assert _check()[1].warnings == []


def test_synth_prints_the_plan_and_fails_on_a_managed_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                              ) -> None:
    assert synth.main(["a4", "--out", str(tmp_path / "ok")]) == 0
    out = capsys.readouterr().out
    assert "GRPO run with verl 0.6.1: 58 steps" in out
    # The folder the plan names is the one the job's entrypoint hands verl.
    (folder,) = re.findall(r"\n  run id run-[0-9a-f]{12}, checkpoints in (\S+)\n", out)
    assert f"trainer.default_local_dir={folder} " in (tmp_path / "ok" / "resources.json").read_text()
    code = synth.main(["a4", "--out", str(tmp_path / "bad"), "--set", f'{EXTRA}=["trainer.nnodes=1"]'])
    err = capsys.readouterr().err
    assert code == 2
    assert f'{EXTRA} = "trainer.nnodes=1": sets trainer.nnodes' in err and "Traceback" not in err


@pytest.mark.parametrize(("override", "reason"), [
    ("trainer.nnodez=3", "verl 0.6.1 rejects it: Could not override 'trainer.nnodez'."),
    ("trainer.nnodes=1", "sets trainer.nnodes, which verl-gke sets from verl-gke:gpuNodes: set that key instead"),
    ("trainer.logger=[console", "Hydra cannot parse it: "),
])
def test_synth_exits_2_naming_the_key_for_a_misspelt_managed_or_malformed_override(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, reason: str) -> None:
    code = synth.main(["a4", "--out", str(tmp_path), "--set", f"{EXTRA}={json.dumps([override])}"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"  {EXTRA} = {json.dumps(override)}: {reason}" in err and "Traceback" not in err


def test_extra_overrides_that_verl_never_reads_are_warnings() -> None:
    problems, plan = _check(**{EXTRA: '["algorithm.kl_ctrl.horizon=5000", "actor_rollout_ref.actor.kl_loss_coef=0.01"]'})
    assert problems == []
    assert plan.warnings == [
        f"{EXTRA} item 'algorithm.kl_ctrl.horizon=5000' has no effect: verl reads algorithm.kl_ctrl only with "
        "algorithm.use_kl_in_reward=True",
        f"{EXTRA} item 'actor_rollout_ref.actor.kl_loss_coef=0.01' has no effect: "
        "actor_rollout_ref.actor.use_kl_loss is false",
    ]


def _tutorial_args(platform: str) -> list[str]:
    """The tutorial's own `ray job submit` overrides for the platform (A4/A3 Ultra, or A4X on 4 nodes)."""
    from tests.test_grpo_spec import TUTORIAL_A4
    if platform != "a4x":
        return [a for a in TUTORIAL_A4 if not a.startswith(("trainer.max_", "trainer.resume_mode"))]
    return [
        "algorithm.adv_estimator=grpo", "data.train_files=/data/gsm8k/train.parquet",
        "data.val_files=/data/gsm8k/test.parquet", "data.train_batch_size=256", "data.max_prompt_length=512",
        "data.max_response_length=512", "actor_rollout_ref.model.path=/data/Qwen2.5-32B-Instruct",
        "actor_rollout_ref.actor.optim.lr=1e-5", "actor_rollout_ref.actor.ppo_mini_batch_size=64",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=4", "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16", "algorithm.kl_ctrl.kl_coef=0.001",
        "trainer.logger=console", "trainer.n_gpus_per_node=4", "trainer.nnodes=4", "trainer.save_freq=10",
        "trainer.test_freq=10", "trainer.total_epochs=2", "trainer.default_local_dir=/data/verl/checkpoints",
    ]


@pytest.mark.parametrize("stack", STACKS)
def test_each_stacks_run_keeps_the_tutorials_math_as_verl_composes_it(synth_stack: Any, stack: str) -> None:
    from domain.grpo_spec import MATH_KEYS
    platform = _platform(stack)
    folder = config_dir(PLATFORMS[platform].verl)
    ours = compose_run(folder, job_args(synth_stack(stack)))
    tutorial = compose_run(folder, _tutorial_args(platform))
    assert {k: OmegaConf.select(ours, k) for k in MATH_KEYS} == {k: OmegaConf.select(tutorial, k) for k in MATH_KEYS}
    # ... and runs faster: no padding, token-budget micro batches everywhere, more rollout replicas.
    ref = ours.actor_rollout_ref
    assert ref.model.use_remove_padding is True
    assert (ref.actor.use_dynamic_bsz, ref.rollout.log_prob_use_dynamic_bsz, ref.ref.log_prob_use_dynamic_bsz) == (
        True, True, True)
    assert (ref.actor.ppo_max_token_len_per_gpu, ref.rollout.log_prob_max_token_len_per_gpu,
            ref.ref.log_prob_max_token_len_per_gpu) == (16384, 32768, 32768)
    assert ref.rollout.tensor_model_parallel_size == 4
