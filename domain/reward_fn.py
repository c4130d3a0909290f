"""Your reward (verl-gke:rewardFunction = `file.py` or `file.py:name`): checked at synth in a child process
with a deadline (importing it runs it), uploaded by the program beside your data, passed to verl as
custom_reward_function.path and .name."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from domain.bucket import MOUNT_PATH
from domain.platforms import VerlRelease
from domain.problems import problem_line
from domain.run_identity import verl_version_tuple
from domain.staged import RECIPES, Recipe
from domain.user_data import BUCKET_DIR
from domain.verl_wheel import VerlUnavailable, unpacked

KEY = "verl-gke:rewardFunction"
DEFAULT_NAME = "compute_score"
"""verl's default custom_reward_function.name."""
CHECK_TIMEOUT_S = 30


def recipe_sample(recipe: Recipe) -> dict[str, Any]:
    """The call verl makes (verl/workers/reward_manager/naive.py, 0.6.1 and 0.9.0: keywords data_source,
    solution_str, ground_truth, extra_info) on a row of the staged dataset: the synth check's without data of
    its own."""
    solution, truth = recipe.sample
    return {"data_source": recipe.data_source, "solution_str": solution, "ground_truth": truth,
            "extra_info": {"split": "test", "index": 0}}


SAMPLE = recipe_sample(RECIPES[0])
"""A GSM8K row."""

AWAITS_FROM = (0, 9)
"""verl releases from which the reward loop awaits an `async def` reward (verl/trainer/ppo/reward.py wraps it in
_call_with_kwargs_async; experimental/reward_loop/reward_manager/*.py await it). 0.6.1 validates through
workers/reward_manager/naive.py, which calls it without awaiting."""

# Run with -I -S: the standard library, the pinned verl and, from this machine's packages, only those verl
# itself requires (the image holds them to run verl; checked with this machine's copy). verl's and verl.utils'
# __init__ import torch and omegaconf: the probe skips those two, so that verl.utils.reward_score's modules
# (standard library only, measured on 0.6.1 and 0.9.0) import without them.
_PROBE = """
import asyncio, importlib.machinery, importlib.util, inspect, json, numbers, sys, types
path, name, rows = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sample = rows[0][1] if rows else json.loads(sys.argv[4])
version, awaits, verl_dir = sys.argv[5], sys.argv[6] == "1", sys.argv[7]
allowed, site = set(json.loads(sys.argv[8])) | {"verl"}, [p for p in json.loads(sys.argv[9]) if p not in sys.path]
class OnlyVerlsRequirements:
    def find_spec(self, fullname, path=None, target=None):
        if path is None and fullname not in allowed and importlib.machinery.PathFinder.find_spec(fullname, site):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
sys.meta_path.insert(0, OnlyVerlsRequirements())
sys.path[:0] = [verl_dir]
sys.path += site
for package in ("verl", "verl.utils"):
    sys.modules[package] = types.ModuleType(package)
    sys.modules[package].__path__ = [verl_dir + "/" + package.replace(".", "/")]
def answer(problem):
    print(json.dumps({"problem": problem})); sys.exit(0)
def why(e):
    return f"{type(e).__name__}: {e}" + (f" (a reward may import the standard library, verl {version} and "
        "what verl requires, which the image holds; other packages of the image are not known offline)"
        if isinstance(e, ModuleNotFoundError) else "")
try:
    spec = importlib.util.spec_from_file_location("custom_module", path)
    module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
except BaseException as e:
    answer(f"does not import: {why(e)}")
fn = getattr(module, name, None)
if not callable(fn):
    answer(f"has no function {name}")
try:
    inspect.signature(fn).bind(**sample)
except TypeError as e:
    answer(f"{name} does not take the keywords verl calls it with ({', '.join(sample)}): {e}")
except ValueError:
    pass
if inspect.iscoroutinefunction(fn) and not awaits:
    answer(f"{name} is async (async def), which verl {version} calls without awaiting; make it a plain def "
           "(verl 0.9.0, on a4x, awaits it)")
for where, sample in rows:
    try:
        score = asyncio.run(fn(**sample)) if inspect.iscoroutinefunction(fn) else fn(**sample)
    except BaseException as e:
        answer(f"{name} raised {why(e)} on {where}")
    value = score.get("score") if isinstance(score, dict) else score
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        answer(f"{name} returned {score!r} on {where}: verl takes a number, or a dict with a numeric 'score'")
answer(None)
"""


def _dist_names(lines: list[str]) -> set[str]:
    """The distribution names of Requires-Dist lines without an extra, normalized."""
    return {re.split(r"[\s\[<>=!;~(]", line, maxsplit=1)[0].lower().replace("_", "-")
            for line in lines if "extra ==" not in line}


def verls_requirements(verl_dir: Path) -> list[str]:
    """The top-level modules of the distributions the pinned verl requires (its wheel's Requires-Dist, no
    extras, and theirs in turn) as installed on this machine: the image holds them, the probe may import them."""
    [info] = verl_dir.glob("*.dist-info")
    metadata = (info / "METADATA").read_text().splitlines()
    todo = _dist_names([line.removeprefix("Requires-Dist: ") for line in metadata if line.startswith("Requires-Dist: ")])
    wanted: set[str] = set()
    while todo:
        name = todo.pop()
        wanted.add(name)
        try:
            todo |= _dist_names(importlib.metadata.requires(name) or []) - wanted
        except importlib.metadata.PackageNotFoundError:
            pass  # not on this machine: the probe cannot import it either
    return sorted(top for top, dists in importlib.metadata.packages_distributions().items()
                  if any(d.lower().replace("_", "-") in wanted for d in dists))


def parse(value: str) -> tuple[Path, str]:
    """`file.py[:name]` -> (the file, the function's name)."""
    path, _, name = value.partition(":")
    return Path(path).expanduser(), name or DEFAULT_NAME


def object_name(value: str) -> str:
    """The file's object in the bucket, named by its content's digest."""
    path, _ = parse(value)
    return f"{BUCKET_DIR}/reward/{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}/{path.name}"


VERL_PATHS = ("custom_reward_function.path", "reward.custom_reward_function.path")
"""Where verl reads a reward function's file (the second on 0.9.0): set only through KEY, which checks it."""


def verl_paths(value: str) -> dict[str, str]:
    """custom_reward_function.path and .name; {} when the file cannot be read (problems() says why)."""
    if not value:
        return {}
    try:
        return {"custom_reward_function.path": f"{MOUNT_PATH}/{object_name(value)}",
                "custom_reward_function.name": parse(value)[1]}
    except OSError:
        return {}


def problems(value: str, release: VerlRelease, sample: dict[str, Any] | None = None,
             timeout_s: float = CHECK_TIMEOUT_S, *,
             rows: Sequence[tuple[str, dict[str, Any]]] | None = None) -> list[str]:
    """The file imports, has the function, takes verl's keywords and returns a number on `sample` (default
    SAMPLE; awaited where `release` awaits an async one), or on each of `rows` ((where, sample), the first
    failure named by its where; () imports and binds only): in a child process, so a hang, an exit or a crash
    of the user's code ends within `timeout_s`."""
    if not value:
        return []
    path, name = parse(value)
    if path.suffix != ".py" or not path.is_file() or not name.isidentifier():
        return [problem_line(KEY, value, "a local Python file and, after ':', the function verl calls (default "
                             f"{DEFAULT_NAME}), e.g. reward.py:compute_score.")]
    try:
        verl_dir = unpacked(release)
    except VerlUnavailable as e:
        return [problem_line(KEY, value, f"cannot be checked with verl {release.version}: {e}")]
    try:
        rows = [("a sample row", sample or SAMPLE)] if rows is None else rows
        done = subprocess.run([sys.executable, "-I", "-S", "-c", _PROBE, str(path.resolve()), name,
                               json.dumps(list(rows), default=str), json.dumps(SAMPLE), release.version,
                               "1" if verl_version_tuple(release.version) >= AWAITS_FROM else "0", str(verl_dir),
                               json.dumps(verls_requirements(verl_dir)), json.dumps(sys.path[1:])],
                              capture_output=True, text=True, timeout=timeout_s, cwd=path.resolve().parent)
    except subprocess.TimeoutExpired:
        return [problem_line(KEY, value, f"importing and calling {name} on a sample row took over {timeout_s:g} s.")]
    lines = done.stdout.strip().splitlines()
    try:
        problem = json.loads(lines[-1])["problem"]
    except (IndexError, ValueError, KeyError, TypeError):
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        problem = f"the check ended without an answer ({last})"
    return [] if problem is None else [problem_line(KEY, value, " ".join(str(problem).split()) + ".")]
