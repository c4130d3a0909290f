"""The modeled step and run time and the run's cost: each formula against a hand calculation, and each
platform's default run against the issue's ballpark."""

from __future__ import annotations

from typing import Any

import pytest

from domain import run_time
from domain.config import load_config
from domain.run_time import Assumptions, RunShape
from domain.verl_config import check_run
from domain.verl_wheel import config_dir
from tests.conftest import BASE_CONFIG

# Round numbers, so that every figure below is a hand calculation.
SHAPE = RunShape(params=10**9, sequences=100, n_gpus=2, peak_flops=1e15, reference=True, recompute=True,
                 steps=10, checkpoint_s=4.0)
ASSUME = Assumptions(mfu=0.5, prompt_tokens=100, response_tokens=100, decode_share=0.2, step_overhead_s=10.0)


def test_each_formula_matches_a_hand_calculation() -> None:
    t = run_time.model(SHAPE, ASSUME)
    # 100 sequences x (100 + 100) tokens = 20,000 tokens; 2 GPUs x 1e15 x 0.5 = 1e15 FLOP/s.
    assert t.update_s == pytest.approx(8 * 1e9 * 20_000 / 1e15)  # forward, backward, recompute: 0.16 s
    assert t.log_prob_s == pytest.approx(2 * 1e9 * 20_000 * 2 / 1e15)  # actor and reference: 0.08 s
    assert t.decode_tokens_per_s == pytest.approx(1e15 * 0.2 / 2e9)  # 100,000 tokens/s a GPU
    assert t.rollout_s == pytest.approx(100 * 100 / (2 * 100_000))  # 0.05 s
    assert t.step_s == pytest.approx(0.16 + 0.08 + 0.05 + 10)
    assert t.run_s == pytest.approx(10 * 10.29 + 4)  # and the checkpoints' GPU time: 106.9 s
    assert t.gpu_hours == pytest.approx(106.9 * 2 / 3600)
    assert t.cost_usd(36.0) == 1.07  # 106.9 s at $36/h
    assert run_time.measured_ratio(20.58, t.step_s) == pytest.approx(2.0)


def test_no_reference_no_recompute_and_unknowns() -> None:
    t = run_time.model(RunShape(**{**SHAPE.__dict__, "reference": False, "recompute": False, "steps": None}), ASSUME)
    assert (t.update_s, t.log_prob_s) == (pytest.approx(0.12), pytest.approx(0.04))
    assert (t.run_s, t.gpu_hours, t.cost_usd(36.0)) == (None, None, None)
    assert t.lines(36.0)[0].endswith("run time unknown (steps unknown)")


def test_the_assumptions_are_this_modules_and_named_in_what_synth_prints() -> None:
    a = Assumptions.for_platform("a3u")
    assert (a.mfu, a.prompt_tokens, a.response_tokens, a.decode_share, a.step_overhead_s) == (0.40, 128, 320, 0.20,
                                                                                              10.0)
    assert run_time.model(SHAPE, ASSUME).lines(None) == [
        "Modeled run: step ~10 s (rollout 0, log-probs 0, update 0, weight sync and overhead 10); 10 steps and "
        "checkpoints (4 s) ~2 min, 0.1 GPU-hours, cost unknown (no price: set verl-gke:gpuNodeHourlyUsd)",
        "  assumptions (domain/run_time.py): training at 50% MFU of 1 PFLOP/s bf16 a GPU; 200 tokens a sequence (100 "
        "prompt + 100 response), 100 sequences a step; decode ~100,000 tokens/s a GPU (20% of peak); 10 s a step for "
        "weight sync and overhead; checkpoints as above (domain/checkpoint_time.py)",
    ]


def _plan(platform: str, nodes: str, **config: str) -> Any:
    cfg = load_config({**BASE_CONFIG, "verl-gke:platform": platform, "verl-gke:gpuNodes": nodes, **config})
    problems, plan = check_run(cfg, config_dir(cfg.verl.release))
    assert problems == []
    return plan


# The issue's ballpark for each platform's default run: a step, and the 58 steps in 40-75 minutes.
@pytest.mark.parametrize(("platform", "nodes", "step"), [("a3u", "2", (65, 75)), ("a4", "2", (40, 45)),
                                                         ("a4x", "4", (40, 50))])
def test_each_platforms_default_run_is_in_the_issues_ballpark(platform: str, nodes: str, step: tuple[int, int]) -> None:
    plan = _plan(platform, nodes)
    t = plan.time
    assert step[0] <= t.step_s <= step[1]
    assert t.shape.steps == 58 and 40 <= t.run_s / 60 <= 75
    assert t.shape.checkpoint_s == plan.checkpoint_time.total_s  # the checkpoints' own model
    assert t.shape.reference is (platform == "a4x")  # the A4X run has the KL loss, so a reference policy


def test_synth_prints_the_cost_with_a_price_and_says_when_the_price_is_unknown(synth_stack: Any) -> None:
    [a3u] = [line for line in synth_stack("a3u-standard").log if line.startswith("Modeled run: ")]
    cfg = load_config({**BASE_CONFIG, "gcp:region": "europe-west1", "gcp:zone": "europe-west1-b",
                       "verl-gke:platform": "a3u"})
    t = _plan("a3u", "2", **{"gcp:region": "europe-west1", "gcp:zone": "europe-west1-b"}).time
    assert a3u.endswith(f"~${t.cost_usd(cfg.hourly_usd):,.2f} at ${cfg.hourly_usd:,.2f}/h")
    assert t.cost_usd(cfg.hourly_usd) == round(t.run_s / 3600 * cfg.hourly_usd, 2)
    [a4] = [line for line in synth_stack("a4-standard").log if line.startswith("Modeled run: ")]
    assert a4.endswith("cost unknown (no price: set verl-gke:gpuNodeHourlyUsd)")
