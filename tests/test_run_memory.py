"""The per-GPU memory estimate and the rollout tensor parallel size chosen for the GPU's memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from domain import grpo_spec, run_memory
from domain.config import ConfigError, load_config
from domain.platforms import PLATFORMS, VERL_0_6_1
from tests.conftest import BASE_CONFIG, verl_value
from verl_gke import synth

GIB = 2**30
A, R, F = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "actor_rollout_ref.ref."
# The tutorial's execution settings on A4 / A3 Ultra (micro batch 64, padded, no dynamic batch size).
TUTORIAL_EXECUTION = {A + "use_dynamic_bsz": False, R + "log_prob_use_dynamic_bsz": False,
                      F + "log_prob_use_dynamic_bsz": False, "actor_rollout_ref.model.use_remove_padding": False,
                      A + "ppo_micro_batch_size_per_gpu": 64, R + "log_prob_micro_batch_size_per_gpu": 8,
                      F + "log_prob_micro_batch_size_per_gpu": 4, R + "tensor_model_parallel_size": 8}
NODES = {"a4": "2", "a3u": "2", "a4x": "4"}


def cfg_of(platform: str = "a4", paths: dict | None = None, **config: str):
    return load_config({**BASE_CONFIG, "verl-gke:platform": platform, "verl-gke:gpuNodes": NODES[platform],
                        "verl-gke:verl": verl_value(paths or {}), **config})


def refused(platform: str, paths: dict) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        cfg_of(platform, paths)
    return caught.value.problems


def test_qwen_32b_has_its_published_size() -> None:
    shape = run_memory.MODELS["Qwen/Qwen2.5-32B-Instruct"]
    # Model card: 32.5B parameters, 31.0B without embeddings (biases and norms left out here).
    assert shape.params == 32_762_757_120
    assert shape.layers * shape.layer_params == 31_205_621_760
    assert shape.kv_bytes_per_token == 262_144  # 2 x 64 layers x 8 KV heads x 128 x bf16


def test_gpu_memory_is_what_the_devices_report_in_gib() -> None:
    # nvidia-smi's memory.total: B200 183359MiB, H200 143771MiB, GB200 189471MiB, L4 23034MiB.
    assert {name: p.gpu_memory_bytes for name, p in PLATFORMS.items()} == {
        "a4": 183_359 * 2**20, "a3u": 143_771 * 2**20, "a4x": 189_471 * 2**20, "g2": 23_034 * 2**20}
    est = run_memory.for_run(cfg_of("a3u").verl, PLATFORMS["a3u"], "Qwen/Qwen2.5-32B-Instruct", 2)
    # vLLM's budget is gpu_memory_utilization of the bytes CUDA reports: 0.6 x 143771 MiB.
    assert est.phases[2].parts["vLLM"] == 0.6 * 143_771 * 2**20
    assert est.line().startswith("GPU memory estimate per GPU: peak 107 GiB (rollout) of 140 GiB, limit 126 GiB")


@pytest.mark.parametrize(("platform", "phases", "kv"), [
    ("a4", (57, 62, 130), 88),
    ("a3u", (57, 62, 107), 65),
    ("a4x", (85, 66, 138), 92),
])
def test_each_platforms_default_run_fits_with_the_margin(platform: str, phases: tuple[int, ...], kv: int) -> None:
    cfg = cfg_of(platform)
    est = run_memory.for_run(cfg.verl, cfg.facts, cfg.model, cfg.gpu_nodes)
    assert tuple(round(p.total / GIB) for p in est.phases) == phases
    assert round(est.kv_cache_bytes / GIB) == kv
    assert est.peak.total < est.limit_bytes == cfg.facts.gpu_memory_bytes * 0.9
    assert run_memory.problems(cfg.verl, cfg.facts, cfg.model, cfg.gpu_nodes) == []


def test_a4x_default_takes_one_micro_batch_a_mini_batch_so_no_unsharded_gradient() -> None:
    # 64 x 8 / 16 GPUs = 32 sequences x (512 + 512) = 32,768 tokens: the token budget's own size.
    cfg = cfg_of("a4x")
    assert run_memory.update_micro_batches(cfg.verl, 16) == (1, 32_768)
    est = run_memory.for_run(cfg.verl, cfg.facts, cfg.model, cfg.gpu_nodes)
    assert "unsharded fp32 gradient" not in est.phases[0].parts


def test_a4x_mini_batch_256_is_refused_with_verl_0_9_0s_unsharded_fp32_gradient() -> None:
    assert refused("a4x", {A + "ppo_mini_batch_size": 256}) == [
        "verl-gke:verl.actor_rollout_ref.actor.ppo_mini_batch_size = 256, "
        "verl-gke:verl.actor_rollout_ref.actor.ppo_max_token_len_per_gpu = 32768: the training phase needs ~207 GiB "
        "per GPU (unsharded fp32 gradient 122, actor state 31, checkpointed activations 20 GiB) of the 185 GiB "
        "nvidia-gb200, over the 167 GiB limit (10% margin): verl 0.9.0 keeps an unsharded fp32 gradient of the whole "
        "model while a mini-batch takes several micro-batches (4 here: a GPU's share of a mini-batch is up to 131072 "
        "tokens); make ppo_max_token_len_per_gpu x the Ulysses size at least that share (one micro-batch), lower "
        "ppo_mini_batch_size or add GPU nodes"]


def test_the_unsharded_gradient_is_32_8b_parameters_in_fp32() -> None:
    a4x, model = PLATFORMS["a4x"], "Qwen/Qwen2.5-32B-Instruct"
    run = grpo_spec.run_settings(a4x, model, 4, {A + "ppo_mini_batch_size": 256})
    est = run_memory.estimate(run, run_memory.MODELS[model], a4x.gpu_memory_bytes, 16)
    assert est.phases[0].parts["unsharded fp32 gradient"] == 32_762_757_120 * 4


def test_verl_0_6_1_syncs_every_micro_batch_so_a_large_mini_batch_fits() -> None:
    assert not VERL_0_6_1.defers_gradient_sync
    cfg = cfg_of("a4", {A + "ppo_max_token_len_per_gpu": 16384})
    assert run_memory.update_micro_batches(cfg.verl, 16) == (8, 131_072)
    assert "unsharded fp32 gradient" not in run_memory.for_run(cfg.verl, cfg.facts, cfg.model, 2).phases[0].parts


def test_the_tutorials_micro_batch_64_does_not_fit_an_h200_and_names_its_key() -> None:
    assert refused("a3u", TUTORIAL_EXECUTION) == [
        "verl-gke:verl.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = 64: the training phase needs ~129 GiB "
        "per GPU (checkpointed activations 40, logits and their gradient 37, actor state 31 GiB) of the 140 GiB "
        "nvidia-h200-141gb, over the 126 GiB limit (10% margin): lower it or add GPU nodes"]
    # The same on B200s fits.
    cfg_of("a4", TUTORIAL_EXECUTION)


def test_a_token_budget_too_large_names_the_dynamic_key() -> None:
    [line] = refused("a3u", {A + "ppo_max_token_len_per_gpu": 65536})
    assert line.startswith("verl-gke:verl.actor_rollout_ref.actor.ppo_max_token_len_per_gpu = 65536: the training "
                           "phase needs ~129 GiB per GPU")


def test_vllm_budget_plus_the_resident_actor_over_the_gpu_is_refused() -> None:
    assert refused("a3u", {R + "gpu_memory_utilization": 0.75}) == [
        "verl-gke:verl.actor_rollout_ref.rollout.gpu_memory_utilization = 0.75: the rollout phase needs ~128 GiB per "
        "GPU (vLLM 105, actor state 23 GiB) of the 140 GiB nvidia-h200-141gb, over the 126 GiB limit (10% margin): "
        "lower it or add GPU nodes"]


def test_a_kv_cache_too_small_for_one_sequence_names_tp_and_utilization() -> None:
    [line] = refused("a3u", {R + "tensor_model_parallel_size": 1, R + "gpu_memory_utilization": 0.45})
    assert line.startswith("verl-gke:verl.actor_rollout_ref.rollout.tensor_model_parallel_size = 1, "
                           "verl-gke:verl.actor_rollout_ref.rollout.gpu_memory_utilization = 0.45: vLLM's KV cache "
                           "(~0 GiB per GPU) holds 0 tokens, fewer than one sequence (1024)")


def test_every_problem_is_reported_at_once() -> None:
    problems = refused("a3u", {**TUTORIAL_EXECUTION, R + "gpu_memory_utilization": 0.75})
    assert [p.split(" = ")[0] for p in problems] == [
        "verl-gke:verl.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "verl-gke:verl.actor_rollout_ref.rollout.gpu_memory_utilization"]


@pytest.mark.parametrize(("platform", "model", "tp"), [
    ("a4", "Qwen/Qwen2.5-32B-Instruct", 4),
    ("a3u", "Qwen/Qwen2.5-32B-Instruct", 4),
    ("a4x", "Qwen/Qwen2.5-32B-Instruct", 4),
    ("a4", "Qwen/Qwen2.5-7B-Instruct", 1),
    ("a3u", "Qwen/Qwen2.5-7B-Instruct", 1),
    ("a4", "meta-llama/Llama-3.1-8B-Instruct", 8),  # not in the table: the GPUs per node
    ("a4x", "meta-llama/Llama-3.1-8B-Instruct", 4),
])
def test_rollout_tp_is_chosen_for_the_gpus_memory(platform: str, model: str, tp: int) -> None:
    # Another model than the default comes with its own commit (a config rule refuses the default's).
    revision = {} if model == "Qwen/Qwen2.5-32B-Instruct" else {"verl-gke:modelRevision": "1" * 40}
    cfg = cfg_of(platform, **{"verl-gke:model": model, "verl-gke:gpuNodes": "4", **revision})
    assert cfg.verl.get(R + "tensor_model_parallel_size") == tp


def test_a_smaller_vllm_budget_takes_a_larger_tp() -> None:
    # 0.3 x 140 GiB = 42 GiB: a quarter of it no longer holds a TP 4 shard of 32B (16 GB), TP 8 does.
    tp = run_memory.rollout_tp(PLATFORMS["a3u"], "Qwen/Qwen2.5-32B-Instruct", util=0.3, batch=256, n=8, seq=1024,
                               nnodes=2)
    assert tp == 8
    assert cfg_of("a3u", {R + "gpu_memory_utilization": 0.3}).verl.get(R + "tensor_model_parallel_size") == 8


def test_synth_prints_the_estimate_and_exits_2_on_a_run_that_does_not_fit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert synth.main(["a3u-standard", "--out", str(tmp_path / "ok")]) == 0
    assert ("GPU memory estimate per GPU: peak 107 GiB (rollout) of 140 GiB, limit 126 GiB with a 10% margin "
            "(phases in GiB: training 57, log-prob 62, rollout 107)") in capsys.readouterr().out.splitlines()
    assert synth.main(["a3u-standard", "--out", str(tmp_path / "bad"),
                       "--set", f"verl-gke:verl={verl_value(TUTORIAL_EXECUTION)}"]) == 2
    err = capsys.readouterr().err
    assert "  verl-gke:verl.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = 64: the training phase needs ~129" in err
    assert "Traceback" not in err
