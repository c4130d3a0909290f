"""The per-GPU memory estimate and the rollout tensor parallel size chosen for the GPU's memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from domain import run_memory
from domain.config import ConfigError, load_config
from domain.platforms import PLATFORMS
from tests.conftest import BASE_CONFIG
from verl_gke import synth

GB = 1e9
# The tutorial's execution settings on A4 / A3 Ultra (micro batch 64, padded, no dynamic batch size).
TUTORIAL_EXECUTION = {"verl-gke:grpoUseDynamicBsz": "false", "verl-gke:grpoUseRemovePadding": "false",
                      "verl-gke:grpoPpoMicroBatchSizePerGpu": "64",
                      "verl-gke:grpoRolloutLogProbMicroBatchSizePerGpu": "8",
                      "verl-gke:grpoRefLogProbMicroBatchSizePerGpu": "4",
                      "verl-gke:grpoRolloutTensorParallelSize": "8"}


def cfg_of(**config: str):
    return load_config({**BASE_CONFIG, **config})


def test_qwen_32b_has_its_published_size() -> None:
    shape = run_memory.MODELS["Qwen/Qwen2.5-32B-Instruct"]
    # Model card: 32.5B parameters, 31.0B without embeddings (biases and norms left out here).
    assert shape.params == 32_762_757_120
    assert shape.layers * shape.layer_params == 31_205_621_760
    assert shape.kv_bytes_per_token == 262_144  # 2 x 64 layers x 8 KV heads x 128 x bf16


@pytest.mark.parametrize(("platform", "nodes", "phases", "kv"), [
    ("a4", "2", (61, 67, 133), 88),
    ("a3u", "2", (61, 67, 109), 64),
    ("a4x", "4", (65, 71, 140), 91),
])
def test_each_platforms_default_run_fits_with_the_margin(platform: str, nodes: str, phases: tuple[int, ...],
                                                         kv: int) -> None:
    cfg = cfg_of(**{"verl-gke:platform": platform, "verl-gke:gpuNodes": nodes})
    est = run_memory.for_run(cfg.grpo, cfg.facts, cfg.model, cfg.gpu_nodes)
    assert tuple(round(p.total / GB) for p in est.phases) == phases
    assert round(est.kv_cache_gb) == kv
    assert est.peak.total < est.limit_gb * GB == cfg.facts.gpu_memory_gb * 0.9 * GB
    assert run_memory.problems(cfg.grpo, cfg.facts, cfg.model, cfg.gpu_nodes) == []


def test_the_tutorials_micro_batch_64_does_not_fit_an_h200_and_names_its_key() -> None:
    with pytest.raises(ConfigError) as caught:
        cfg_of(**{"verl-gke:platform": "a3u", **TUTORIAL_EXECUTION})
    assert caught.value.problems == [
        "verl-gke:grpoPpoMicroBatchSizePerGpu = 64: the training phase needs ~139 GB per GPU (checkpointed "
        "activations 43, logits and their gradient 40, actor state 33 GB) of the 141 GB nvidia-h200-141gb, over "
        "the 127 GB limit (10% margin): lower it or add GPU nodes"]
    # The same on 180 GB B200s fits.
    cfg_of(**TUTORIAL_EXECUTION)


def test_a_token_budget_too_large_names_the_dynamic_key() -> None:
    with pytest.raises(ConfigError) as caught:
        cfg_of(**{"verl-gke:platform": "a3u", "verl-gke:grpoPpoMaxTokenLenPerGpu": "65536"})
    [line] = caught.value.problems
    assert line.startswith("verl-gke:grpoPpoMaxTokenLenPerGpu = 65536: the training phase needs ~139 GB per GPU")


def test_vllm_budget_plus_the_resident_actor_over_the_gpu_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        cfg_of(**{"verl-gke:platform": "a3u", "verl-gke:grpoGpuMemoryUtilization": "0.75"})
    assert caught.value.problems == [
        "verl-gke:grpoGpuMemoryUtilization = 0.75: the rollout phase needs ~130 GB per GPU (vLLM 106, actor "
        "state 25 GB) of the 141 GB nvidia-h200-141gb, over the 127 GB limit (10% margin): lower it or add "
        "GPU nodes"]


def test_a_kv_cache_too_small_for_one_sequence_names_tp_and_utilization() -> None:
    with pytest.raises(ConfigError) as caught:
        cfg_of(**{"verl-gke:platform": "a3u", "verl-gke:grpoRolloutTensorParallelSize": "1",
                  "verl-gke:grpoGpuMemoryUtilization": "0.45"})
    [line] = caught.value.problems
    assert line.startswith('verl-gke:grpoRolloutTensorParallelSize = 1, verl-gke:grpoGpuMemoryUtilization = 0.45: '
                           "vLLM's KV cache (~0 GB per GPU) holds 0 tokens, fewer than one sequence (1024)")


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        cfg_of(**{"verl-gke:platform": "a3u", **TUTORIAL_EXECUTION, "verl-gke:grpoGpuMemoryUtilization": "0.75"})
    assert [p.split(" = ")[0] for p in caught.value.problems] == [
        "verl-gke:grpoPpoMicroBatchSizePerGpu", "verl-gke:grpoGpuMemoryUtilization"]


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
    cfg = cfg_of(**{"verl-gke:platform": platform, "verl-gke:model": model, "verl-gke:gpuNodes": "4", **revision})
    assert cfg.grpo.rollout_tensor_parallel_size == tp


def test_a_smaller_vllm_budget_takes_a_larger_tp() -> None:
    # 0.3 x 141 GB = 42 GB: a quarter of it no longer holds a TP 4 shard of 32B (16 GB), TP 8 does.
    assert run_memory.rollout_tp(PLATFORMS["a3u"], "Qwen/Qwen2.5-32B-Instruct",
                                 {"gpu_memory_utilization": "0.3"}, 2) == 8
    # An unreadable value counts as its default here (its own field reports it).
    assert run_memory.rollout_tp(PLATFORMS["a3u"], "Qwen/Qwen2.5-32B-Instruct",
                                 {"gpu_memory_utilization": "lots"}, 2) == 4


def test_synth_prints_the_estimate_and_exits_2_on_a_run_that_does_not_fit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert synth.main(["a3u-standard", "--out", str(tmp_path / "ok")]) == 0
    assert ("GPU memory estimate per GPU: peak 109 GB (rollout) of 141 GB, limit 127 GB with a 10% margin "
            "(phases in GB: training 61, log-prob 67, rollout 109)") in capsys.readouterr().out.splitlines()
    sets = [a for k, v in TUTORIAL_EXECUTION.items() for a in ("--set", f"{k}={v}")]
    assert synth.main(["a3u-standard", "--out", str(tmp_path / "bad"), *sets]) == 2
    err = capsys.readouterr().err
    assert "  verl-gke:grpoPpoMicroBatchSizePerGpu = 64: the training phase needs ~139 GB" in err
    assert "Traceback" not in err
