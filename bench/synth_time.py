"""Synth wall time per stack vs the time of merely importing the SDK modules it uses.

Each measurement is a fresh `python` process (median of 3). The import baseline imports exactly
the `pulumi*` modules that the synth of that stack loaded, so the ratio shows what the program
itself costs on top of the SDKs. Target: ratio <= 2.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time

from domain.stack_files import PROJECT_DIR, stack_names

RUNS = 3
TARGET_RATIO = 2.0

_LIST_SDK_MODULES = """
import json, sys
from verl_gke import synth
synth.run(sys.argv[1])
roots = ("pulumi", "pulumi_gcp", "pulumi_kubernetes")
mods = sorted(m for m in sys.modules if m.split(".")[0] in roots and not m.split(".")[-1].startswith("_"))
print(json.dumps(mods))
"""


def _wall(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(args, cwd=PROJECT_DIR, check=True, capture_output=True)
    return time.perf_counter() - start


def _median(args: list[str]) -> float:
    return statistics.median(_wall(args) for _ in range(RUNS))


def sdk_modules(stack: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", _LIST_SDK_MODULES, stack], cwd=PROJECT_DIR,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    print(f"{'stack':14s} {'synth s':>8s} {'import s':>8s} {'ratio':>6s}  (median of {RUNS}, target <= {TARGET_RATIO})")
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for stack in stack_names():
            imports = "import " + ", ".join(sdk_modules(stack))
            synth_s = _median([sys.executable, "-m", "verl_gke.synth", stack, "--out", f"{tmp}/{stack}"])
            import_s = _median([sys.executable, "-c", imports])
            ratio = synth_s / import_s
            worst = max(worst, ratio)
            print(f"{stack:14s} {synth_s:8.2f} {import_s:8.2f} {ratio:6.2f}")
    print(f"worst ratio {worst:.2f}: {'within' if worst <= TARGET_RATIO else 'ABOVE'} target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
