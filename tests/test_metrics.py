"""verl console metrics: parsing noisy Ray job logs, the table, the trend rule and the PNG plot."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from domain.platforms import PLATFORMS
from domain.verl_wheel import unpacked
from verl_gke import metrics
from verl_gke.metrics import REWARD_KEY


def verl_line(step: int, values: dict[str, float]) -> str:
    """A line as verl's console logger printed it before it switched to pprint (`:.3f`)."""
    return " - ".join([f"step:{step}", *(f"{key}:{value:.3f}" for key, value in values.items())])


REWARDS = [0.125, 0.25, 0.3125, 0.5]

# A job log as `ray job logs` returns it: driver noise, Ray's task prefix and colours, tqdm
# carriage returns, a deduplicated line, a checkpoint message that mentions global_step, and the
# last step still being written (no newline).
LOG = "\n".join([
    "2026-11-02 10:00:01,123\tINFO worker.py:1852 -- Connecting to existing Ray cluster at address: 10.0.0.2:6379...",
    "(TaskRunner pid=4242) Using LocalLogger is deprecated. The constructor API will change",
    "(TaskRunner pid=4242) " + verl_line(1, {
        "actor/entropy": 0.61, REWARD_KEY: REWARDS[0], "perf/throughput": 1523.25, "perf/time_per_step": 98.5,
    }),
    "\x1b[36m(TaskRunner pid=4242)\x1b[0m Training Progress:   1%|          | 1/116 [01:38<3:09:46, 98.50s/it]\r"
    "\x1b[36m(TaskRunner pid=4242)\x1b[0m " + verl_line(2, {
        "actor/entropy": 0.6, REWARD_KEY: REWARDS[1], "perf/throughput": 1601.5, "perf/time_per_step": 95.0,
    }),
    "(WorkerDict pid=977, ip=10.0.1.7) INFO 11-02 10:03:11 [block_pool.py:321] Successfully reset prefix cache",
    "(TaskRunner pid=4242) local_global_step_folder: /data/verl/checkpoints/global_step_2 - saving",
    "\x1b[36m(TaskRunner pid=4242)\x1b[0m " + verl_line(3, {
        REWARD_KEY: REWARDS[2], "perf/throughput": 1610.0, "perf/time_per_step": 94.25, "val-core/acc": float("nan"),
    }) + " [repeated 2x across cluster]",
    "(TaskRunner pid=4242) " + verl_line(4, {REWARD_KEY: REWARDS[3], "perf/throughput": 1650.75, "perf/time_per_step": 92.0}),
    "",
    "(TaskRunner pid=4242) step:5 - critic/score/mean:0.6",
])


def test_parses_only_verl_metric_lines_with_exact_values() -> None:
    parsed = metrics.parse_log(LOG)
    assert [r.step for r in parsed.steps] == [1, 2, 3, 4]
    assert parsed.series(REWARD_KEY) == [(1, 0.125), (2, 0.25), (3, 0.312), (4, 0.5)]
    assert parsed.series("perf/throughput") == [(1, 1523.25), (2, 1601.5), (3, 1610.0), (4, 1650.75)]
    assert parsed.series("perf/time_per_step") == [(1, 98.5), (2, 95.0), (3, 94.25), (4, 92.0)]
    assert parsed.steps[0].values == {
        "actor/entropy": 0.61, REWARD_KEY: 0.125, "perf/throughput": 1523.25, "perf/time_per_step": 98.5,
    }
    assert math.isnan(parsed.steps[2].values["val-core/acc"])
    assert parsed.keys() == ["actor/entropy", REWARD_KEY, "perf/throughput", "perf/time_per_step", "val-core/acc"]


def test_sets_aside_the_unfinished_last_line_and_counts_noise() -> None:
    parsed = metrics.parse_log(LOG)
    assert parsed.partial_tail == "(TaskRunner pid=4242) step:5 - critic/score/mean:0.6"
    # connect, deprecation, tqdm segment, vLLM, checkpoint message
    assert parsed.noise_lines == 5
    assert metrics.parse_log(LOG + "12\n").series(REWARD_KEY)[-1] == (5, 0.612)


@pytest.mark.parametrize("line", [
    "(TaskRunner pid=1) global_step:3 - critic/score/mean:0.500",
    "Saving checkpoint at step:3",
    "step:3 - critic/score/mean:high",
    "(TaskRunner pid=1) mystep:3 - critic/score/mean:0.500",
])
def test_lines_that_only_look_like_metrics_are_not_metrics(line: str) -> None:
    assert metrics.parse_line(line) is None


def test_a_resumed_job_keeps_the_latest_value_of_a_repeated_step() -> None:
    log = "\n".join([
        verl_line(7, {REWARD_KEY: 0.4, "perf/throughput": 1000.0}),
        "(TaskRunner pid=9) Resuming from /data/verl/checkpoints/global_step_6",
        verl_line(7, {REWARD_KEY: 0.45}),
        "",
    ])
    assert metrics.parse_log(log).steps == [metrics.StepMetrics(7, {REWARD_KEY: 0.45, "perf/throughput": 1000.0})]


def test_table_has_a_row_per_step_and_dashes_for_missing_keys() -> None:
    parsed = metrics.parse_log(LOG)
    assert metrics.table(parsed, [REWARD_KEY, "actor/entropy"]).splitlines() == [
        "step  critic/score/mean  actor/entropy",
        "   1              0.125          0.610",
        "   2              0.250          0.600",
        "   3              0.312              -",
        "   4              0.500              -",
    ]


@pytest.mark.parametrize(("values", "rising"), [
    ([0.1, 0.2, 0.15, 0.3, 0.35, 0.4, 0.5, 0.55], True),
    ([2.0, 0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 0.1], False),  # falls overall
    ([1.0, 0.6, 0.0, 0.1, 0.9, 1.0, 1.0, 0.5], False),  # slope > 0, but ends below where it began
    ([0.0, 0.1, 1.0, 1.0, 1.0, 0.0, 0.0, 0.2], False),  # ends above where it began, slope < 0
])
def test_rising_needs_both_a_positive_slope_and_a_higher_last_quarter(values: list[float], rising: bool) -> None:
    result = metrics.trend(list(enumerate(values, start=1)))
    assert result.rising is rising
    assert result.points == 8


def test_trend_exact_numbers_and_verdict_text() -> None:
    result = metrics.trend([(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.5)])
    assert result.slope == pytest.approx(0.13)
    assert result.first_quarter_mean == pytest.approx(0.1)
    assert result.last_quarter_mean == pytest.approx(0.5)
    assert result.verdict() == (
        "critic/score/mean: RISING over 4 steps "
        "(slope +0.13/step, first quarter mean 0.100, last quarter mean 0.500)"
    )


def test_too_few_finite_points_gives_no_verdict() -> None:
    result = metrics.trend([(1, 0.1), (2, float("nan")), (3, 0.2), (4, 0.3)])
    assert result.rising is None
    assert result.points == 3
    assert result.verdict() == "critic/score/mean: not enough steps to judge (3 < 4)"


def test_plot_writes_a_png_of_the_reward(tmp_path: Path) -> None:
    out = tmp_path / "plots" / "reward.png"
    result = metrics.plot_reward(metrics.parse_log(LOG), out)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000
    assert imread(out).shape == (450, 800, 4)  # 8 x 4.5 in at 100 dpi, RGBA
    assert result.rising is True


def test_plot_without_reward_values_is_a_clear_error(tmp_path: Path) -> None:
    parsed = metrics.parse_log(verl_line(1, {"perf/throughput": 1.0}) + "\n")
    with pytest.raises(ValueError, match="^no finite values of critic/score/mean to plot$"):
        metrics.plot_reward(parsed, tmp_path / "reward.png")
    assert not (tmp_path / "reward.png").exists()


def verl_formatter(version: str) -> Callable[[dict[str, object], int], str]:
    """`concat_dict_to_str` of the pinned verl `version`, loaded from its wheel (the module alone: it
    imports only torch and the standard library)."""
    release = next(p.verl for p in PLATFORMS.values() if p.verl.version == version)
    path = unpacked(release) / "verl" / "utils" / "logger" / "aggregate_logger.py"
    spec = importlib.util.spec_from_file_location(f"verl_aggregate_logger_{version.replace('.', '_')}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.concat_dict_to_str


@pytest.mark.parametrize("version", sorted({p.verl.version for p in PLATFORMS.values()}))
def test_reads_numpy_2_values_as_verls_own_formatter_prints_them(version: str) -> None:
    assert np.__version__.startswith("2.")
    # What verl's trainer reduces its metrics to: numpy scalars (np.mean), Python numbers, and a
    # non-number it leaves out.
    data: dict[str, object] = {
        "actor/pg_loss": np.float64(-0.012),
        "actor/entropy": np.float32(0.5),
        REWARD_KEY: np.float64(0.3125),
        "response_length/max": np.int64(512),
        "perf/throughput": 1601.5,
        "perf/total_num_tokens": 123456,
        "val-core/acc": np.float64("nan"),
        "actor/grad_norm": np.float64("inf"),
        "timing_s/gen": np.float64(1.5e-05),
        "note": "text",
    }
    line = verl_formatter(version)(data, step=7)
    assert "np.float64(-0.012)" in line  # numpy 2 repr, the case the parser used to drop
    parsed = metrics.parse_log("(TaskRunner pid=42) " + line + "\n")
    assert parsed.noise_lines == 0
    [record] = parsed.steps
    assert record.step == 7
    values = dict(record.values)
    assert math.isnan(values.pop("val-core/acc"))
    assert values == {
        "actor/pg_loss": -0.012,
        "actor/entropy": 0.5,
        REWARD_KEY: 0.3125,
        "response_length/max": 512.0,
        "perf/throughput": 1601.5,
        "perf/total_num_tokens": 123456.0,
        "actor/grad_norm": float("inf"),
        "timing_s/gen": 1.5e-05,
    }


@pytest.mark.parametrize("raw", ["np.float64(high)", "np.float64(0.5", "np.str_(0.5)", "float64(0.5)"])
def test_a_value_that_only_looks_like_a_numpy_number_is_not_read(raw: str) -> None:
    assert metrics.parse_line(f"step:1 - {REWARD_KEY}:{raw}") is None


# verl 0.6.1 ray_trainer._validate names the validation score `val-core/<data_source>/<var>/<metric>`, with var
# `acc` where the reward function returns one, else `reward`, and metric mean@<n>; GSM8K's data_source is
# openai/gsm8k (verl's examples/data_preprocess/gsm8k.py), its reward function returns a plain score.
VAL_KEY = "val-core/openai/gsm8k/reward/mean@1"
VAL_COLOR = (0.0, 0.5, 0.0)  # what plot_reward draws the validation score in (matplotlib's "green")


def _pixels_of(path: Path, rgb: tuple[float, float, float]) -> int:
    image = imread(path)[:, :, :3]
    return int(np.all(np.abs(image - np.array(rgb)) < 0.02, axis=-1).sum())


def test_plot_draws_the_validation_score_beside_the_reward(tmp_path: Path) -> None:
    lines = [verl_line(step, {REWARD_KEY: reward, **({VAL_KEY: 0.4 + step / 100} if step % 2 == 0 else {})})
             for step, reward in enumerate(REWARDS, start=1)]
    parsed = metrics.parse_log("\n".join(lines) + "\n")
    assert metrics.validation_key(parsed) == VAL_KEY
    assert parsed.series(VAL_KEY) == [(2, 0.42), (4, 0.44)]
    with_val, without = tmp_path / "with.png", tmp_path / "without.png"
    metrics.plot_reward(parsed, with_val)
    metrics.plot_reward(metrics.parse_log("\n".join(verl_line(s, {REWARD_KEY: r})
                                                    for s, r in enumerate(REWARDS, start=1)) + "\n"), without)
    assert _pixels_of(with_val, VAL_COLOR) > 100 and _pixels_of(without, VAL_COLOR) == 0


def test_the_validation_key_prefers_verls_core_score_and_takes_acc_where_the_reward_gives_one() -> None:
    parsed = metrics.parse_log(verl_line(10, {"val-aux/openai/gsm8k/reward/std@1": 0.1,
                                              "val-core/openai/gsm8k/acc/mean@1": 0.5}) + "\n")
    assert metrics.validation_key(parsed) == "val-core/openai/gsm8k/acc/mean@1"
    assert metrics.validation_key(metrics.parse_log(verl_line(1, {REWARD_KEY: 0.1}) + "\n")) is None
