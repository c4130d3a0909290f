"""The modeled step and run time and the run's cost: each formula against a hand calculation, and each
platform's default run against the issue's ballpark."""

from __future__ import annotations

from typing import Any

import pytest

from domain import run_time, staged
from domain.config import load_config
from domain.measured import Measured, Rates
from domain.run_time import Assumptions, RunShape
from domain.verl_config import check_run
from domain.verl_wheel import config_dir
from tests.conftest import BASE_CONFIG, verl_value

# Round numbers, so that every figure below is a hand calculation.
SHAPE = RunShape(params=10**9, sequences=100, n_gpus=2, peak_flops=1e15, reference=True, recompute=True,
                 steps=10, checkpoint_s=4.0, max_response_tokens=150, validation_prompts=1319, validations=2,
                 validate_first=True, model_loads=2)
ASSUME = Assumptions(mfu=0.5, prompt_tokens=100, response_tokens=100, decode_share=0.2, step_overhead_s=10.0)


def test_each_formula_matches_a_hand_calculation() -> None:
    t = run_time.model(SHAPE, ASSUME)
    # 100 sequences x (100 + 100) tokens = 20,000 tokens; 2 GPUs x 1e15 x 0.5 = 1e15 FLOP/s.
    assert t.update_s == pytest.approx(8 * 1e9 * 20_000 / 1e15)  # forward, backward, recompute: 0.16 s
    assert t.log_prob_s == pytest.approx(2 * 1e9 * 20_000 * 2 / 1e15)  # actor and reference: 0.08 s
    assert t.decode_tokens_per_s == pytest.approx(1e15 * 0.2 / 2e9)  # 100,000 tokens/s a GPU
    # The tail: responses up to 150 tokens against a mean of 100, 50 iterations at 20 ms.
    assert t.tail_s == pytest.approx(50 * 0.02)  # 1 s
    assert t.rollout_s == pytest.approx(100 * 100 / (2 * 100_000) + 1.0)  # 1.05 s
    assert t.step_s == t.modeled_step_s == pytest.approx(0.16 + 0.08 + 1.05 + 10)  # 11.29 s
    # A validation pass: GSM8K's 1,319 test prompts at the decode rate, and the same tail.
    assert t.validation_s == pytest.approx(1319 * 100 / 200_000 + 1.0)  # 1.6595 s
    # Start-up: processes 60 s, the bf16 model (2 GB) read twice at 1 GB/s, vLLM 90 s, first sync 30 s and
    # the validation before training.
    assert t.startup_s == t.verl_startup_s == pytest.approx(60 + 4 + 90 + 30 + 1.6595)
    assert t.export_s == pytest.approx(60 + 8)  # the fp32 model read and the merged one written at 1 GB/s
    assert t.run_s == pytest.approx(10 * 11.29 + 2 * 1.6595 + 4)  # steps, validations, checkpoints: 120.219 s
    assert t.gpu_hours == pytest.approx(120.219 * 2 / 3600)
    assert t.cost_usd(36.0) == 1.2  # 120.219 s at $36/h
    assert run_time.measured_ratio(22.58, t.step_s) == pytest.approx(2.0)


def test_validation_passes_are_verls() -> None:
    # Every test_freq steps and after the last (verl's fit loop); none with test_freq <= 0.
    assert [run_time.validation_passes(58, f) for f in (10, 29, 58, 100, 0, -1)] == [6, 2, 1, 1, 0, 0]
    assert run_time.validation_passes(None, 10) == 0


def test_measured_rates_replace_the_assumed_ones_and_say_so() -> None:
    measured = Measured.model_validate({"run": "run-1", "stack": "smoke", "measuredAt": "2026-12-07T12:00:00Z",
                                        "rates": {"modelLoadGBps": 2.0, "verlStartupSeconds": 300.0,
                                                  "stepSeconds": 30.0}})
    a = Assumptions.for_platform("g2", staged.RECIPES[0], measured)
    assert a.model_load_gbps == 2.0 and a.mfu == 0.20
    t = run_time.model(SHAPE, Assumptions(**{**ASSUME.__dict__, "model_load_gbps": 2.0, "measured": measured}))
    assert t.modeled_step_s == pytest.approx(11.29) and t.step_s == 30.0
    assert t.run_s == pytest.approx(10 * 30 + 2 * 1.6595 + 4)
    assert t.startup_s == pytest.approx(60 + 2 + 90 + 30 + 1.6595) and t.verl_startup_s == 300.0
    assert t.lines(None)[0].startswith("Modeled run: step ~30 s (measured on run run-1) (modeled 11: ")
    assert t.startup_line() == "verl start-up 5.0 min (measured on run run-1) (modeled 3.1)"
    load_only = run_time.model(SHAPE, Assumptions(**{**ASSUME.__dict__, "model_load_gbps": 2.0, "measured":
                                                     measured.model_copy(update={"rates": Rates(model_load_gbps=2.0)})}))
    assert load_only.startup_line() == (
        "verl start-up 3.1 min: processes 60 s + the model (2.0 GB bf16, read 2x) through GCS FUSE at 2 GB/s "
        "(measured on run run-1) + vLLM start and CUDA graphs 90 s + first weight sync 30 s + validation before "
        "training 2 s")


def test_no_reference_no_recompute_and_unknowns() -> None:
    t = run_time.model(RunShape(**{**SHAPE.__dict__, "reference": False, "recompute": False, "steps": None}), ASSUME)
    assert (t.update_s, t.log_prob_s) == (pytest.approx(0.12), pytest.approx(0.04))
    assert (t.run_s, t.gpu_hours, t.cost_usd(36.0)) == (None, None, None)
    assert t.lines(36.0)[0].endswith("run time unknown (steps unknown)")


def test_the_assumptions_are_this_modules_and_named_in_what_synth_prints() -> None:
    a = Assumptions.for_platform("a3u", staged.RECIPES[0])
    assert (a.mfu, a.prompt_tokens, a.response_tokens, a.decode_share, a.step_overhead_s) == (0.40, 128, 320, 0.20,
                                                                                              10.0)
    assert (a.tail_token_s, a.model_load_gbps, a.measured) == (0.02, 1.0, None)
    assert (run_time.VERL_PROCESS_START_S, run_time.VLLM_START_S, run_time.FIRST_SYNC_S,
            run_time.EXPORT_START_S) == (60.0, 90.0, 30.0, 60.0)
    t = run_time.model(SHAPE, ASSUME)
    assert t.lines(None) == [
        "Modeled run: step ~11 s (modeled 11: rollout 1 with a response tail of 1, log-probs 0, update 0, weight sync "
        "and overhead 10); 10 steps, 2 validation passes (2 s each) and checkpoints (4 s) ~2 min, 0.1 GPU-hours, cost "
        "unknown (no price: set verl-gke:gpuNodeHourlyUsd)",
        "  assumptions (domain/run_time.py): training at 50% MFU of 1 PFLOP/s bf16 a GPU; 200 tokens a sequence (100 "
        "prompt + 100 response; the dataset's, domain/staged.py), 100 sequences a step; decode ~100,000 tokens/s a "
        "GPU (20% of peak); responses up to "
        "150 tokens, the tail at 20 ms an iteration; 1319 validation prompts a pass; 10 s a step for weight sync and "
        "overhead; checkpoints as above (domain/checkpoint_time.py)",
    ]
    assert t.startup_line() == (
        "verl start-up 3.1 min: processes 60 s + the model (2.0 GB bf16, read 2x) through GCS FUSE at 1 GB/s + vLLM "
        "start and CUDA graphs 90 s + first weight sync 30 s + validation before training 2 s")


def _plan(platform: str, nodes: str, **config: str) -> Any:
    cfg = load_config({**BASE_CONFIG, "verl-gke:platform": platform, "verl-gke:gpuNodes": nodes, **config})
    problems, plan = check_run(cfg, config_dir(cfg.verl.release))
    assert problems == []
    return plan


# The issue's ballpark for each platform's default run, with the response tail (~4 s a step) and six
# validation passes added (issue 46): a step, and the 58 steps in 40-80 minutes.
@pytest.mark.parametrize(("platform", "nodes", "step"), [("a3u", "2", (70, 80)), ("a4", "2", (45, 50)),
                                                         ("a4x", "4", (45, 55))])
def test_each_platforms_default_run_is_in_the_issues_ballpark(platform: str, nodes: str, step: tuple[int, int]) -> None:
    plan = _plan(platform, nodes)
    t = plan.time
    assert step[0] <= t.step_s <= step[1]
    assert t.shape.steps == 58 and 40 <= t.run_s / 60 <= 80
    assert (t.shape.validations, t.shape.max_response_tokens) == (6, 512)  # test_freq 10, and after step 58
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


def test_the_default_gsm8k_run_is_modeled_as_before() -> None:
    # GSM8K's pinned facts moved into its recipe (domain/staged.py): 7,473 train rows, 1,319 test rows, 128 + 320
    # tokens a sequence; the a4 default's figures are the ones the constants gave.
    t = _plan("a4", "2").time
    assert (t.shape.steps, t.shape.validation_prompts) == (58, 1319)
    assert (t.step_s, t.validation_s, t.run_s) == (pytest.approx(47.63757487081244), pytest.approx(7.681251257002667),
                                                   pytest.approx(2915.5458106891374))


MATH = {"verl-gke:dataset": "DigitalLearningGmbH/MATH-lighteval", "verl-gke:gpuNodeHourlyUsd": '{"reservation": 100}',
        "verl-gke:verl": verl_value({"data.filter_overlong_prompts": True})}


def test_a_math_run_is_modeled_from_its_recipes_pinned_facts() -> None:
    plan = _plan("a4", "2", **MATH)
    t = plan.time
    math = staged.recipe_for(staged.MATH_REPO)
    assert (math.train_rows, math.test_rows, math.prompt_tokens, math.response_tokens) == (7500, 5000, 150, 550)
    # 7,500 rows // 256 a batch x 2 epochs; fewer when verl drops prompts over data.max_prompt_length.
    assert (plan.steps, plan.steps_at_most, t.shape.steps, t.shape.validation_prompts) == (58, True, 58, 5000)
    # 16 B200s at 2.25 PFLOP/s: training at 30% (1.08e16 FLOP/s), decoding at 20% over 2 FLOPs a parameter.
    p, tokens = 32762757120, 2048 * (150 + 512)  # responses of 550 tokens on average, capped at 512
    decode = 16 * 2.25e15 * 0.2 / (2 * p)  # 109,881 tokens/s
    assert t.update_s == pytest.approx(8 * p * tokens / 1.08e16)  # recomputed: 32.90 s
    assert t.log_prob_s == pytest.approx(2 * p * tokens / 1.08e16)  # the actor's alone on a4: 8.23 s
    assert (t.tail_s, t.rollout_s) == (0.0, pytest.approx(2048 * 512 / decode))  # 9.54 s
    assert t.validation_s == pytest.approx(5000 * 512 / decode)  # 23.30 s
    assert t.step_s == pytest.approx(32.9029 + 8.2257 + 9.5428 + 10, abs=1e-3)  # 60.67 s
    assert t.shape.checkpoint_s == pytest.approx(106, abs=0.5)  # as GSM8K's: 6 saves
    assert t.run_s == pytest.approx(58 * 60.6715 + 6 * 23.2980 + 106, abs=1)  # 3,765 s
    usd = plan.hourly_usd  # the two GPU nodes at $100/h and the stack's other nodes
    assert 200 < usd < 202 and t.cost_usd(usd) == round(t.run_s / 3600 * usd, 2)
    lines = plan.lines()
    assert lines[0] == ("GRPO run with verl 0.6.1: at most 58 steps (an upper bound: data.filter_overlong_prompts "
                        "drops the prompts longer than data.max_prompt_length before the run)")
    [run] = [line for line in lines if line.startswith("Modeled run: ")]
    assert run.endswith(f"; at most 58 steps, 6 validation passes (23 s each) and checkpoints (106 s) "
                        f"~{t.run_s / 60:.0f} min, {t.gpu_hours:.1f} GPU-hours, ~${t.cost_usd(usd):,.2f} at "
                        f"${usd:,.2f}/h")
    [assume] = [line for line in lines if line.startswith(run_time.ASSUMPTIONS)]
    assert ("662 tokens a sequence (150 prompt + 512 response: a mean of 550 capped at data.max_response_length; "
            "the dataset's, domain/staged.py)" in assume and "5000 validation prompts a pass" in assume)
