"""The algorithms a stack runs (domain/algorithms.py): docs/recipes.md's snippets through synth and verl's own
validate_config, what the memory and step models count for a critic and LoRA, and the response length in the
modeled step (issue 49, items 3-4)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from domain import run_memory, run_time
from domain.config import load_config
from domain.platforms import PLATFORMS
from tests.conftest import BASE_CONFIG, verl_value
from tests.test_verl_config import _platform, job_args, verl_verdicts
from verl_gke import synth

RECIPES = Path(__file__).resolve().parent.parent / "docs" / "recipes.md"
_SNIPPET = re.compile(r"```yaml\n# stack: (?P<stack>[\w-]+)\n(?P<body>.*?)```", re.S)


def recipes() -> list[tuple[str, dict[str, Any]]]:
    """(stack, config) of every snippet on the page."""
    found = [(m["stack"], yaml.safe_load(m["body"])["config"]) for m in _SNIPPET.finditer(RECIPES.read_text())]
    assert len(found) == 5, "one snippet per algorithm and the warm start"
    return found


@pytest.mark.timeout(900)
def test_every_recipe_synthesizes_and_verl_accepts_it() -> None:
    results = [(stack, synth.run(stack, overrides=config)) for stack, config in recipes()]
    for release in {PLATFORMS[_platform(stack)].verl for stack, _ in results}:
        runs = [job_args(result) for stack, result in results if PLATFORMS[_platform(stack)].verl == release]
        assert verl_verdicts(release, runs) == [None] * len(runs)
    plans = [next(line for line in r.log if " run with verl " in line) for _, r in results]
    assert [p.split(" run with verl ")[0] for p in plans] == ["GRPO", "GRPO", "PPO with a critic",
                                                             "GRPO with LoRA rank 64", "GRPO"]


def _cfg(**paths: object):
    return load_config({**BASE_CONFIG, "verl-gke:verl": verl_value(paths)})


def _estimate(cfg) -> run_memory.MemoryEstimate:
    est = run_memory.for_run(cfg.verl, cfg.facts, cfg.model, cfg.gpu_nodes)
    assert est is not None
    return est


GIB = run_memory.GIB


def test_a_critic_as_large_as_the_actor_is_in_every_phase_of_the_memory_estimate() -> None:
    grpo, ppo = _estimate(_cfg()), _estimate(_cfg(**{"algorithm.adv_estimator": "gae"}))
    params, n = run_memory.MODELS["Qwen/Qwen2.5-32B-Instruct"].params, 16
    for before, after in zip(grpo.phases, ppo.phases):
        added = after.parts["critic state"]
        # fp32 weights and AdamW moments (12 bytes a parameter), and its fp32 gradients in training.
        assert added == params * (12 + (4 if after.name == "training" else 0)) / n
        assert after.total - before.total == added
    assert (round(grpo.peak.total / GIB), round(ppo.peak.total / GIB)) == (130, 153)  # docs/recipes.md


def test_lora_trains_the_adapters_alone_and_keeps_no_reference_copy() -> None:
    full = _estimate(_cfg(**{"actor_rollout_ref.actor.use_kl_loss": True}))
    lora = _estimate(_cfg(**{"actor_rollout_ref.actor.use_kl_loss": True, "actor_rollout_ref.model.lora_rank": 64}))
    params, n = run_memory.MODELS["Qwen/Qwen2.5-32B-Instruct"].params, 16
    training = {p.name: p for p in lora.phases}["training"]
    adapters = 64 * 64 * (2 * (5120 + 5120) + 2 * (5120 + 1024) + 2 * (5120 + 27648) + (27648 + 5120))
    assert training.parts["actor state"] == params * 4 / n + adapters * 12 / n
    assert training.parts["reference"] == 0 and {p.name: p for p in full.phases}["training"].parts["reference"] > 0
    plain = {p.name: round(p.total / GIB) for p in _estimate(_cfg()).phases}
    lora_plain = {p.name: round(p.total / GIB)
                  for p in _estimate(_cfg(**{"actor_rollout_ref.model.lora_rank": 64})).phases}
    assert (plain["training"], lora_plain["training"]) == (57, 34)  # docs/recipes.md


def _modeled(cfg) -> run_time.RunTime:
    from domain.verl_config import verl_run_check

    problems, plan = verl_run_check(cfg)
    assert problems == [] and plan is not None and plan.time is not None
    return plan.time


def test_the_step_model_counts_the_critics_passes_and_loras_cheaper_update() -> None:
    grpo = _modeled(_cfg())
    ppo = _modeled(_cfg(**{"algorithm.adv_estimator": "gae"}))
    lora = _modeled(_cfg(**{"actor_rollout_ref.model.lora_rank": 64}))
    # Gradient checkpointing on: the actor's update 8 FLOPs a parameter a token, the critic's 8 more; one value pass.
    assert ppo.update_s == pytest.approx(grpo.update_s * 16 / 8)
    assert ppo.log_prob_s == pytest.approx(grpo.log_prob_s * 2)
    assert lora.update_s == pytest.approx(grpo.update_s * 6 / 8)
    assert ppo.shape.model_loads == 2 and lora.shape.model_loads == 1
    assert 1.5 <= ppo.modeled_step_s / grpo.modeled_step_s < 1.6  # docs/recipes.md: about 1.5x


def test_max_response_length_changes_modeled_step_seconds_through_synth() -> None:
    """Issue 49 item 4: a 16,384-token response limit waits for its longest responses (the tail)."""
    plain = synth.run("a4-standard")
    longer = synth.run("a4-standard", overrides={"verl-gke:verl": {"data": {"max_response_length": 16384}}})
    tail = (16384 - 512) * run_time.TAIL_TOKEN_S
    assert longer.outputs["modeledStepSeconds"] == pytest.approx(plain.outputs["modeledStepSeconds"] + tail, abs=0.1)
