"""verl's per-step console metrics: parse them from job logs, tabulate, plot, judge the trend.

verl's console logger (`trainer.logger=console`, the tutorial's choice) prints one line per
training step: `step:N - key:value - key:value ...`, each value as `pprint.pformat` gives it
(verl/utils/logger/aggregate_logger.py, `concat_dict_to_str`, verl 0.6.1 and 0.9.0): `0.3125` for a
Python float, `np.float64(0.3125)` for a numpy scalar under numpy 2 (older verl printed `:.3f`). Through Ray those lines gain a
`(TaskRunner pid=...)` prefix, colour codes and dedup suffixes, and sit among noise lines.
The tutorial's advice is to watch `critic/score/mean` rise; `trend` makes that a stated rule.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REWARD_KEY = "critic/score/mean"
STEP_TIME_KEY = "perf/time_per_step"
"""Seconds of one training step, as verl measures it (rollout, log-probs, update, weight sync)."""
DEFAULT_KEYS: tuple[str, ...] = (REWARD_KEY, "perf/throughput", STEP_TIME_KEY)
# verl 0.6.1/0.9.0 ray_trainer `_validate`: `val-core/<data_source>/<var>/<metric>` for the score (var `acc` where
# the reward function returns one, else `reward`) at the largest n (mean@1 with one validation sample);
# GSM8K's is val-core/openai/gsm8k/reward/mean@1, logged every trainer.test_freq steps.
_VALIDATION = re.compile(r"^val-core/.+/(?:acc|reward)/mean@\d+$")
VALIDATION_COLOR = "green"

RISING_RULE = (
    "rising = least-squares slope of the reward over the steps > 0 "
    "and mean of the last quarter of steps > mean of the first quarter (needs >= 4 steps)"
)
MIN_TREND_POINTS = 4

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# Ray's log deduplication appends this to a line it has seen on several workers.
_RAY_DEDUP = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
# `step:N` at the start of the payload, after any prefix such as `(TaskRunner pid=123)` or a
# timestamp; the look-behind keeps `global_step:10` out.
_STEP = re.compile(r"(?:^|(?<=[\s)\]]))step:(\d+)(?= - |\s*$)")
_NUMBER = r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|-?inf|nan"
# numpy 2 scalar reprs (NEP 51): np.float64(-0.012), np.float32(nan), np.int64(3), np.uint8(1).
_VALUE = re.compile(rf"(?:np\.(?:float|int|uint)\d*\((?P<np>{_NUMBER})\)|(?P<plain>{_NUMBER}))", re.IGNORECASE)


@dataclass(frozen=True)
class StepMetrics:
    """The metrics verl logged for one training step."""

    step: int
    values: Mapping[str, float]


@dataclass(frozen=True)
class ParsedLog:
    """Every step found in a log, in step order, and what was set aside."""

    steps: Sequence[StepMetrics]
    noise_lines: int
    """Lines that are not verl metric lines (Ray, vLLM, tqdm, ... output)."""
    partial_tail: str | None
    """The last line when the log does not end with a newline: still being written, so not parsed."""

    def keys(self) -> list[str]:
        """Every metric key seen, in first-seen order."""
        seen: dict[str, None] = {}
        for record in self.steps:
            seen.update(dict.fromkeys(record.values))
        return list(seen)

    def series(self, key: str) -> list[tuple[int, float]]:
        """(step, value) for each step that logged `key`."""
        return [(r.step, r.values[key]) for r in self.steps if key in r.values]


@dataclass(frozen=True)
class Trend:
    """Whether a metric rises over the steps, by `RISING_RULE`."""

    rising: bool | None
    """None when there are too few finite points to judge."""
    points: int
    slope: float | None
    intercept: float | None
    first_quarter_mean: float | None
    last_quarter_mean: float | None

    def verdict(self, key: str = REWARD_KEY) -> str:
        if self.rising is None:
            return f"{key}: not enough steps to judge ({self.points} < {MIN_TREND_POINTS})"
        word = "RISING" if self.rising else "NOT rising"
        return (
            f"{key}: {word} over {self.points} steps "
            f"(slope {self.slope:+.4g}/step, first quarter mean {self.first_quarter_mean:.3f}, "
            f"last quarter mean {self.last_quarter_mean:.3f})"
        )


def parse_log(text: str) -> ParsedLog:
    """Parse verl console metric lines out of a whole log.

    A step logged twice (a job resumed from a checkpoint repeats steps) keeps the latest value
    of each key.
    """
    lines = text.split("\n")
    tail = lines.pop()  # "" when the text ends with a newline
    by_step: dict[int, dict[str, float]] = {}
    noise = 0
    for line in lines:
        # tqdm redraws with carriage returns; each segment is a line of its own.
        for segment in line.split("\r"):
            parsed = parse_line(segment)
            if parsed is None:
                noise += segment.strip() != ""
            else:
                by_step.setdefault(parsed.step, {}).update(parsed.values)
    steps = [StepMetrics(step, values) for step, values in sorted(by_step.items())]
    return ParsedLog(steps=steps, noise_lines=noise, partial_tail=_strip_ansi(tail) or None)


def parse_line(line: str) -> StepMetrics | None:
    """One verl metric line, or None for any other line."""
    payload = _RAY_DEDUP.sub("", _strip_ansi(line)).rstrip()
    match = _STEP.search(payload)
    if match is None:
        return None
    values: dict[str, float] = {}
    for field in payload[match.end():].split(" - ")[1:]:
        key, sep, raw = field.strip().rpartition(":")
        number = _VALUE.fullmatch(raw) if sep and key else None
        if number:
            values[key] = float(number.group("np") or number.group("plain"))
    if not values:
        return None
    return StepMetrics(int(match.group(1)), values)


def _strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def trend(points: Iterable[tuple[int, float]]) -> Trend:
    """Judge a (step, value) series by `RISING_RULE`; NaN and infinite values are left out."""
    finite = [(float(s), v) for s, v in points if math.isfinite(v)]
    n = len(finite)
    if n < MIN_TREND_POINTS:
        return Trend(rising=None, points=n, slope=None, intercept=None,
                     first_quarter_mean=None, last_quarter_mean=None)
    xs = [s for s, _ in finite]
    ys = [v for _, v in finite]
    x_mean, y_mean = sum(xs) / n, sum(ys) / n
    spread = sum((x - x_mean) ** 2 for x in xs)
    slope = sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, ys)) / spread
    quarter = n // 4
    first = sum(ys[:quarter]) / quarter
    last = sum(ys[-quarter:]) / quarter
    return Trend(
        rising=slope > 0 and last > first,
        points=n,
        slope=slope,
        intercept=y_mean - slope * x_mean,
        first_quarter_mean=first,
        last_quarter_mean=last,
    )


def table(parsed: ParsedLog, keys: Sequence[str]) -> str:
    """A fixed-width table, one row per step, one column per key; `-` where a step lacks a key."""
    header = ["step", *keys]
    rows = [[str(r.step), *(_cell(r.values.get(k)) for k in keys)] for r in parsed.steps]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in [header, *rows]
    )


def _cell(value: float | None) -> str:
    # Three decimals: enough to read a reward or a loss, narrow enough for a terminal.
    return "-" if value is None else f"{value:.3f}"


def validation_key(parsed: ParsedLog) -> str | None:
    """The validation score verl logged (its first `val-core/.../mean@n`, `acc` before `reward`), or None."""
    found = sorted((k for k in parsed.keys() if _VALIDATION.match(k)), key=lambda k: "/acc/" not in k)
    return found[0] if found else None


def plot_reward(parsed: ParsedLog, path: Path, key: str = REWARD_KEY) -> Trend:
    """Write a PNG of `key` over the steps, with its least-squares line and, where verl validated, the
    validation score beside it; return the trend drawn."""
    # The Agg canvas renders without a display and without touching pyplot's global state.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    points = [(s, v) for s, v in parsed.series(key) if math.isfinite(v)]
    if not points:
        raise ValueError(f"no finite values of {key} to plot")
    verdict = trend(points)
    figure = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    steps = [s for s, _ in points]
    axes.plot(steps, [v for _, v in points], marker="o", markersize=3, label=key)
    if verdict.slope is not None and verdict.intercept is not None:
        ends = [steps[0], steps[-1]]
        axes.plot(ends, [verdict.intercept + verdict.slope * x for x in ends],
                  linestyle="--", label=f"least squares ({verdict.slope:+.3g}/step)")
    validation = validation_key(parsed)
    scores = [(s, v) for s, v in parsed.series(validation) if math.isfinite(v)] if validation else []
    if scores:
        axes.plot([s for s, _ in scores], [v for _, v in scores], marker="s", markersize=4,
                  color=VALIDATION_COLOR, label=validation)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("step")
    axes.set_ylabel(key)
    word = {True: "rising", False: "not rising", None: "too few steps to judge"}[verdict.rising]
    axes.set_title(f"GRPO reward: {word}")
    axes.grid(True, alpha=0.3)
    axes.legend(loc="best")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return verdict
