"""`verl-gke metrics`: verl's per-step console metrics from the run's logs (every attempt) or a saved
log, as a table, a reward plot and a verdict (verl_gke.metrics parses them)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from verl_gke import cmd_logs, metrics, reach, runs, stack_outputs
from verl_gke.console import CliError, progress


def add_parser(subparsers: Any, parents: list[argparse.ArgumentParser]) -> None:
    met = subparsers.add_parser(
        "metrics", parents=parents, help="per-step metrics table, reward plot and verdict",
        description="Parse verl's console metrics (step:N - key:value ...) from the run's logs (all attempts, "
                    "a repeated step's latest value winning; from the bucket copy once the head is gone) or a saved "
                    f"log file. Verdict rule: {metrics.RISING_RULE}. With the stack's outputs (a saved log: "
                    "--outputs or --stack), the measured step time against the modeled one.",
    )
    met.add_argument("--log-file", type=Path, metavar="FILE", help="read this saved log instead of the run's logs")
    met.add_argument("--keys", type=_key_list, default=[], metavar="K1,K2",
                     help=f"more metric keys to show, comma-separated (always shown: {', '.join(metrics.DEFAULT_KEYS)})")
    met.add_argument("--plot", type=Path, metavar="PNG",
                     help=f"write a PNG plot of {metrics.REWARD_KEY} over the steps, the validation score beside it")
    met.set_defaults(handler=cmd_metrics)


def _key_list(text: str) -> list[str]:
    keys = [key.strip() for key in text.split(",") if key.strip()]
    if not keys:
        raise argparse.ArgumentTypeError(f"{text!r} names no metric key")
    return keys


def cmd_metrics(args: argparse.Namespace) -> int:
    if args.log_file is not None:
        source = str(args.log_file)
        try:
            text = args.log_file.read_text(encoding="utf-8", errors="replace")
        except OSError as error:
            raise CliError(f"cannot read log file {args.log_file}: {error.strerror or error}") from None
        # A saved log names no stack: its model only when the outputs are asked for (its run: --run, if given).
        outputs = stack_outputs.load(args.outputs, args.stack) if args.outputs or args.stack else None
        run_id = args.run or ""
    else:
        target = reach.target(args, need_outputs=False, bucket_dir=args.bucket_dir)
        outputs, run_id = target.outputs, target.run.run_id if target.run else ""
        source = f"the logs of run {target.run.run_id}" if target.run else f"the logs of job {target.submission_id}"
        # Every attempt of the run: a resumed attempt repeats steps, and the latest value of a step wins.
        every = target.run is not None
        text = "".join(text for _header, text in cmd_logs.run_logs(args, target, every=every, index=None))
    parsed = metrics.parse_log(text)
    if not parsed.steps:
        raise CliError(f"no verl metric lines (step:N - key:value ...) in {source}; "
                       "is trainer.logger set to console?")
    keys = list(dict.fromkeys([*metrics.DEFAULT_KEYS, *args.keys]))
    seen = set(parsed.keys())
    for key in keys:
        if key not in seen:
            progress(f"metric {key} appears in no step")
    print(metrics.table(parsed, keys))
    if parsed.partial_tail is not None:
        progress("the last log line is incomplete (still being written) and was left out")
    print(metrics.trend(parsed.series(metrics.REWARD_KEY)).verdict())
    print(f"rule: {metrics.RISING_RULE}")
    if outputs is not None:
        print(f"Step time: {runs.step_time(parsed, outputs, source, run_id)}")
    if args.plot is not None:
        try:
            metrics.plot_reward(parsed, args.plot)
        except ValueError as error:
            raise CliError(f"cannot plot: {error}") from None
        except OSError as error:
            raise CliError(f"cannot write plot {args.plot}: {error.strerror or error}") from None
        print(f"plot: {args.plot}")
    return 0
