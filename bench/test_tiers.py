"""The suite's wall time per tier (tests/conftest.py's markers: unit, synth, integration), each tier a
pytest run of its own with `make test`'s workers, then what one run of all of them costs.

    python -m bench.test_tiers [--workers 3] [--tiers unit,synth,integration] [--all]

On a shared machine the wall times include whatever else runs: the load average is printed beside them,
and the CPU seconds (user + sys) of pytest and its workers, which the load does not inflate much.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import time

TIERS = ("unit", "synth", "integration")
_SUMMARY = re.compile(r"(\d+) (passed|failed|error|errors|skipped|deselected)")


def _children_cpu() -> float:
    """CPU seconds of every finished child and the children it waited for (pytest's workers)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(marker: str | None, workers: int) -> tuple[float, float, str, int]:
    """Wall seconds, CPU seconds, pytest's counts line and its exit code for one run."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(workers),
               "--dist", "loadgroup", *(["-m", marker] if marker else [])]
    started, cpu = time.monotonic(), _children_cpu()
    result = subprocess.run(command, capture_output=True, text=True)
    elapsed, cpu = time.monotonic() - started, _children_cpu() - cpu
    lines = [line for line in result.stdout.splitlines() if _SUMMARY.search(line)]
    return elapsed, cpu, (lines[-1].strip("= ") if lines else result.stdout[-300:]), result.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--tiers", default=",".join(TIERS))
    parser.add_argument("--all", action="store_true", help="also one run of the whole suite")
    args = parser.parse_args()
    failed = False
    for marker in [*args.tiers.split(","), *([None] if args.all else [])]:
        load = os.getloadavg()[0]
        elapsed, cpu, counts, code = run(marker, args.workers)
        failed |= code != 0
        print(f"{marker or 'all':<12} {elapsed:7.1f} s  {cpu:7.1f} CPU s  (load {load:.1f} at start)  {counts}",
              flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
