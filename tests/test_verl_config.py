"""The run against the pinned verl's own config: Hydra composition in the program, verl's
validate_config here (a child process: importing verl needs torch)."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import re
import selectors
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from domain import algorithms
from domain.bucket import MOUNT_PATH
from domain.config import StackConfig, _as_field_values, load_config
from domain.grpo_spec import CHECKPOINT_LAUNCHER, overrides, verl_problems
from domain.platforms import PLATFORMS
from domain.platforms import VerlRelease
from domain.run_memory import MODELS
from domain.staged import model_dir_for
from domain.stack_run import stack_run
from domain.verl_config import check_run
from domain.verl_settings import compose_run
from tests import vllm_source
from tests.conftest import BASE_CONFIG, STACKS, verl_value
from verl_gke import synth
from domain.verl_wheel import config_dir, unpacked

VALIDATE = Path(__file__).with_name("verl_validate.py")
A, R = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."
# The release before the tutorial's A4X verl commit (ddbcdb7, between 0.8.0 and 0.9.0).
VERL_0_8_0 = VerlRelease(
    "0.8.0",
    "https://files.pythonhosted.org/packages/f2/5d/dd2275e9cf00b4887bcbb1f99c1a5f1c4fb57000cc7cc8e126f6d4f13579/"
    "verl-0.8.0-py3-none-any.whl",
    "4e32830aae80771ee3b5f0d26a2b794d793f3bcece67aff07c2a7c62e948714f",
)


class _Validator:
    """tests/verl_validate.py: started on the first request, ended with the pytest process (or when its stdin
    closes); each request answered within its deadline or the validator is killed."""

    def __init__(self) -> None:
        # No request leaves: a path no stand-in serves fails as on a node (an absolute path is no Hub repo id).
        # Nothing of this repository on the path: verl's alone, per request.
        env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "HF_HUB_OFFLINE": "1"}
        self.log = tempfile.TemporaryFile()
        self.process = subprocess.Popen([sys.executable, str(VALIDATE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.log, env=env, text=True, start_new_session=True)

    def ask(self, request: str, timeout: float = 300) -> list[str | None]:
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(request + "\n")
        self.process.stdin.flush()
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            ready = selector.select(timeout)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            self.stop()
        self.log.seek(0)
        stderr = self.log.read().decode(errors="replace")[-3000:]
        assert line, f"no answer from verl's validate_config within {timeout} s:\n{stderr}"
        reply = json.loads(line)
        assert "results" in reply, f"{reply['error']}:\n{stderr}"
        return reply["results"]

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


_VALIDATOR: list[_Validator] = []
atexit.register(lambda: [v.stop() for v in _VALIDATOR])
# The tests that ask verl run on one pytest worker (`--dist loadgroup`): one validator in the run.
ASKS_VERL = pytest.mark.xdist_group("verl_validate")


def verl_verdicts(release: VerlRelease, runs: list[list[str]], vllm_version: str | None = None) -> list[str | None]:
    """verl's validate_config on each run (None: accepted), with the release first on the path, each pinned
    model's folder and the image's vLLM (`vllm_version`: another version) as stand-ins (tests/verl_standins.py):
    each request in a fresh fork of the warm validator (tests/verl_validate.py)."""
    models = {f"{MOUNT_PATH}/{model_dir_for(repo)}": dataclasses.asdict(shape) for repo, shape in MODELS.items()}
    image_vllm = next((p.image_vllm for p in PLATFORMS.values() if p.verl == release and p.image_vllm), None)
    vllm = image_vllm and {"source": str(vllm_source.unpacked(image_vllm)),
                           "version": vllm_version or image_vllm.version}
    request = json.dumps({"verl": str(unpacked(release)), "config_dir": str(config_dir(release)), "runs": runs,
                          "models": models, "vllm": vllm})
    if not _VALIDATOR or _VALIDATOR[0].process.poll() is not None:
        _VALIDATOR[:] = [_Validator()]
    return _VALIDATOR[0].ask(request)


def job_args(result: synth.SynthResult) -> list[str]:
    """The overrides of the GRPO job's entrypoint as the program registered it."""
    job = next(r.inputs for r in result.registrations if r.type == synth.GRPO_JOB_TYPE)
    words = shlex.split(job["entrypoint"])
    assert words[:7] == [*CHECKPOINT_LAUNCHER, "python3", "-m", "verl.trainer.main_ppo"]
    return words[7:]


def unchecked(**paths: object) -> StackConfig:
    """A StackConfig without the program's own batch rules, to ask verl alone: their problems are collected in the
    context's list (StackConfig's cross-field rules) and left there."""
    return StackConfig.model_validate(_as_field_values({**BASE_CONFIG, "verl-gke:verl": verl_value(paths)}),
                                      context={"problems": []})


def args_of(cfg: StackConfig) -> list[str]:
    return [o.arg for o in overrides(cfg.verl)]


def _platform(stack: str) -> str:
    return "a3u" if stack.startswith("a3u") else "a4x" if stack == "a4x" else "a4"


# One case per batch rule: verl's validate_config verdict must match the program's.
VERL_RULES = {
    "train_batch_size x n divisible by the GPUs": {"data.train_batch_size": 255, A + "ppo_mini_batch_size": 255},
    "mini batch <= train batch": {A + "ppo_mini_batch_size": 512},
    "Ulysses needs remove padding": {A + "ulysses_sequence_parallel_size": 2},
    "critic mini batch <= train batch": {"algorithm.adv_estimator": "gae", "critic.ppo_mini_batch_size": 512,
                                         "critic.ppo_micro_batch_size_per_gpu": 4},
    "a critic micro batch with static batches": {"algorithm.adv_estimator": "gae"},
    "critic Ulysses needs remove padding": {"algorithm.adv_estimator": "gae", "critic.ppo_micro_batch_size_per_gpu": 4,
                                            "critic.ulysses_sequence_parallel_size": 2},
}
# Rules verl checks only once the GPUs are allocated: validate_config accepts these runs.
AFTER_ALLOCATION = {
    "rollout TP divides the GPUs": {R + "tensor_model_parallel_size": 3},
    "Ulysses size divides the GPUs": {A + "ulysses_sequence_parallel_size": 3,
                                      "actor_rollout_ref.model.use_remove_padding": True},
    "mini batch x n divisible by data parallel": {A + "ppo_mini_batch_size": 2, R + "n": 4},
    "micro batch divides the per-GPU mini batch": {A + "ppo_micro_batch_size_per_gpu": 3},
}


# verl's validate_config checks the batch rules only without dynamic batch size (verl/utils/config.py,
# ActorConfig.validate); the program keeps them either way.
STATIC_BATCHES = {A + "use_dynamic_bsz": False, R + "log_prob_use_dynamic_bsz": False,
                  "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": False,
                  "actor_rollout_ref.model.use_remove_padding": False}


@ASKS_VERL
@pytest.mark.timeout(600)
def test_every_stack_passes_verls_own_validate_config_and_the_batch_rules_are_verls(synth_stack: Any) -> None:
    """One request to verl per release (importing verl takes torch): the stacks' runs, and on a4's release the
    program's batch rules, each verl's validate_config verdict matching the program's, or checked by verl only
    after allocation."""
    cases = {"defaults": {}, **VERL_RULES, **AFTER_ALLOCATION}
    configs = {name: unchecked(**{**STATIC_BATCHES, **given}) for name, given in cases.items()}
    by_release: dict[str, list[str]] = {}
    for stack in STACKS:
        by_release.setdefault(PLATFORMS[_platform(stack)].verl.version, []).append(stack)
    assert PLATFORMS["a4"].verl.version in by_release
    for stacks in by_release.values():
        release = PLATFORMS[_platform(stacks[0])].verl
        runs = [job_args(synth_stack(stack)) for stack in stacks]
        rules = release == PLATFORMS["a4"].verl
        answers = verl_verdicts(release, runs + ([args_of(c) for c in configs.values()] if rules else []))
        assert answers[:len(stacks)] == [None] * len(stacks), stacks
        if rules:
            verdicts = dict(zip(cases, answers[len(stacks):]))
    ours = {name: verl_problems(c.verl, c.facts.gpus_per_node, c.gpu_nodes) + algorithms.problems(c.verl, False)
            for name, c in configs.items()}
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


def _check(paths: dict | None = None, **config: str) -> tuple[list[str], Any]:
    cfg = load_config({**BASE_CONFIG, "verl-gke:verl": verl_value(paths or {}), **config})
    return check_run(cfg, config_dir(cfg.verl.release))


def test_a_new_key_inside_a_map_verl_leaves_open_composes_as_an_addition() -> None:
    path = R + "engine_kwargs.vllm.enable_prefix_caching"
    cfg = load_config({**BASE_CONFIG, "verl-gke:verl": verl_value({path: True})})
    assert f"+{path}=True" in args_of(cfg)
    problems, plan = check_run(cfg, config_dir(cfg.verl.release))
    assert problems == [] and plan is not None
    assert compose_run(config_dir(cfg.verl.release), args_of(cfg)).actor_rollout_ref.rollout.engine_kwargs.vllm == {
        "enable_prefix_caching": True}


TRICKY = ["console,wandb", "run 1; rm -rf /", "it's", "[x", "a=b", "  lead", "null", "True", "1e-5", "back\\slash", "",
          "{a: 1}", "'", '"q"']


def test_every_string_reaches_verl_as_the_same_string() -> None:
    # Each as a key of a map verl leaves open, so that one composition reads them all.
    texts = {f"{R}engine_kwargs.vllm.k{i}": text for i, text in enumerate(TRICKY)}
    cfg = load_config({**BASE_CONFIG, "verl-gke:verl": verl_value({"trainer.experiment_name": TRICKY[1], **texts})})
    composed = compose_run(config_dir(cfg.verl.release), args_of(cfg))
    assert composed.trainer.experiment_name == TRICKY[1]
    assert dict(composed.actor_rollout_ref.rollout.engine_kwargs.vllm) == {f"k{i}": t for i, t in enumerate(TRICKY)}


def test_the_plan_counts_steps_checkpoints_and_their_size() -> None:
    _, plan = _check()
    # GSM8K train: 7,473 rows // 256 = 29 steps per epoch, 2 epochs; saves at 10..50 and 58.
    assert (plan.steps, plan.checkpoints_saved, plan.checkpoints_kept) == (58, 6, 2)
    assert plan.checkpoint_bytes == 32_762_757_120 * 12
    run_id = stack_run(load_config(BASE_CONFIG))[0]
    assert re.fullmatch(r"run-[0-9a-f]{12}", run_id)
    assert plan.lines()[:4] == [
        "GRPO run with verl 0.6.1: 58 steps",
        f"  run id {run_id}, checkpoints in /data/verl/checkpoints/{run_id}",
        "  checkpoints: every 10 steps and at the end: 6 saved, 2 kept, ~393 GB each, ~786 GB in the bucket",
        # 2 nodes: 197 GB each; 8 ranks x 2 GB/s locally -> 12 s a save; the last save's model (a third,
        # 66 GB) at 2 GB/s 33 s; 6 x 12.3 + 32.8 = 106 s.
        "  checkpoint time: 6 saves x 12 s to local disk + 33 s for the last save's model to the bucket (4 of its 12 "
        "bytes per parameter; the optimizer state follows in the background) = 106 s of GPU time (straight to the "
        "bucket: 590 s); assumed 2 GB/s per rank into the page cache, assumed 2 GB/s per node to the bucket",
    ]
    # However many attempts: the bucket keeps the newest 2 complete ones (workloads/checkpoints.py rotates).
    _, alone = _check(**{"verl-gke:runSupervisor": "false"})
    assert alone.lines() == plan.lines()
    _, keep_all = _check({"trainer.max_actor_ckpt_to_keep": 10, "trainer.save_freq": 20})
    assert (keep_all.checkpoints_saved, keep_all.checkpoints_kept) == (3, 3)
    _, none = _check({"trainer.save_freq": -1}, **{"verl-gke:exportModel": "false"})
    assert none.lines()[2] == "  checkpoints: none (trainer.save_freq <= 0): a preempted run starts over"


def test_the_plan_names_the_runs_own_folder_under_the_checkpoint_dir() -> None:
    paths = {"trainer.default_local_dir": "/data/ckpt", "trainer.save_freq": 20}
    run_id = stack_run(load_config({**BASE_CONFIG, "verl-gke:verl": verl_value(paths)}))[0]
    _, plan = _check(paths)
    assert (plan.run_id, plan.checkpoint_folder) == (run_id, f"/data/ckpt/{run_id}")


def test_the_plan_lists_every_verl_setting_the_users_marked() -> None:
    _, plan = _check({"data.train_batch_size": 128, A + "ppo_mini_batch_size": 128})
    lines = plan.lines()
    start = lines.index("verl settings (the platform's defaults; * = set in verl-gke:verl):")
    shown = lines[start + 1:]
    assert "  * data.train_batch_size=128" in shown and "    data.max_prompt_length=512" in shown
    assert "    trainer.nnodes=2" in shown and "    actor_rollout_ref.rollout.max_num_seqs=256" in shown
    assert len(shown) == len(load_config(BASE_CONFIG).verl.values)


def test_max_checkpoints_reach_verl_for_actor_and_critic() -> None:
    cfg = load_config({**BASE_CONFIG, "verl-gke:verl": verl_value({"trainer.max_actor_ckpt_to_keep": 3})})
    composed = compose_run(config_dir(cfg.verl.release), args_of(cfg))
    assert (composed.trainer.max_actor_ckpt_to_keep, composed.trainer.max_critic_ckpt_to_keep) == (3, 2)


def test_a_set_key_that_verl_never_reads_is_a_warning_not_an_error() -> None:
    problems, plan = _check({"algorithm.kl_ctrl.kl_coef": 0.1})
    assert problems == []
    assert plan.warnings == [
        "verl-gke:verl.algorithm.kl_ctrl.kl_coef has no effect: verl reads algorithm.kl_ctrl only with "
        "algorithm.use_kl_in_reward=True (the KL loss weight is actor_rollout_ref.actor.kl_loss_coef)"]
    _, with_kl = _check({"algorithm.kl_ctrl.kl_coef": 0.1, "algorithm.use_kl_in_reward": True})
    assert with_kl.warnings == []
    assert _check()[1].warnings == []


def test_paths_that_verl_never_reads_are_warnings() -> None:
    problems, plan = _check({"algorithm.kl_ctrl.horizon": 5000, A + "kl_loss_coef": 0.01})
    assert problems == []
    assert plan.warnings == [
        "verl-gke:verl.actor_rollout_ref.actor.kl_loss_coef has no effect: actor_rollout_ref.actor.use_kl_loss is "
        "false",
        "verl-gke:verl.algorithm.kl_ctrl.horizon has no effect: verl reads algorithm.kl_ctrl only with "
        "algorithm.use_kl_in_reward=True (the KL loss weight is actor_rollout_ref.actor.kl_loss_coef)",
    ]


def test_synth_prints_the_plan_and_fails_on_a_path_verl_gke_owns(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert synth.main(["a4", "--out", str(tmp_path / "ok")]) == 0
    out = capsys.readouterr().out
    assert "GRPO run with verl 0.6.1: 58 steps" in out
    # The folder the plan names is the one the job's entrypoint hands verl.
    (folder,) = re.findall(r"\n  run id run-[0-9a-f]{12}, checkpoints in (\S+)\n", out)
    assert f"trainer.default_local_dir={folder} " in (tmp_path / "ok" / "resources.json").read_text()
    code = synth.main(["a4", "--out", str(tmp_path / "bad"), "--set",
                       f"verl-gke:verl={verl_value({'trainer.nnodes': 1})}"])
    err = capsys.readouterr().err
    assert code == 2
    assert ("verl-gke:verl.trainer.nnodes = 1: verl-gke sets it from verl-gke:gpuNodes; set that key instead."
            in err and "Traceback" not in err)


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


# The smoke stack sizes its run for two L4s (Pulumi.smoke.yaml), not the tutorial's.
@pytest.mark.parametrize("stack", [stack for stack in STACKS if stack != "smoke"])
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
    # A4X: a GPU's whole mini-batch share in one micro-batch (verl 0.9.0 keeps unsharded gradients across them).
    update = 32768 if platform == "a4x" else 16384
    assert (ref.actor.ppo_max_token_len_per_gpu, ref.rollout.log_prob_max_token_len_per_gpu,
            ref.ref.log_prob_max_token_len_per_gpu) == (update, 32768, 32768)
    assert ref.rollout.tensor_model_parallel_size == 4
