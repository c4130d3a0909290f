"""Your reward (issue 49, item 2): verl-gke:rewardFunction, checked at synth in a child process with a deadline,
uploaded beside your data and passed to verl as custom_reward_function."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from domain import reward_fn
from domain.config import load_config
from domain.platforms import VERL_0_6_1
from tests.conftest import BASE_CONFIG
from tests.test_user_data import refused, row, write
from verl_gke import synth

KEY = "verl-gke:rewardFunction"
GOOD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str.strip().endswith(str(ground_truth)))
'''


OFFLINE = ("(a reward may import the standard library, verl 0.6.1 and what verl requires, which the image holds; "
           "other packages of the image are not known offline)")


def reward(tmp_path: Path, text: str, name: str = "reward.py") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_good_function_is_passed_to_verl_by_its_bucket_path_and_name(tmp_path: Path) -> None:
    path = reward(tmp_path, GOOD.replace("compute_score", "score_it"))
    cfg = load_config({**BASE_CONFIG, KEY: f"{path}:score_it"})
    assert cfg.verl.get("custom_reward_function.path") == f"/data/{reward_fn.object_name(str(path))}"
    assert cfg.verl.get("custom_reward_function.path").startswith("/data/user-data/reward/")
    assert cfg.verl.get("custom_reward_function.name") == "score_it"


@pytest.mark.parametrize(("text", "why"), [
    ("import no_such_module_here\n", "does not import: ModuleNotFoundError: No module named 'no_such_module_here' "
     f"{OFFLINE}"),
    # on this machine (verl-gke's own dependency), not in the image
    ("import pulumi\n", f"does not import: ModuleNotFoundError: No module named 'pulumi' {OFFLINE}"),
    ("def compute_score(**kw):\n    import pulumi\n", "compute_score raised ModuleNotFoundError: No module named "
     f"'pulumi' {OFFLINE} on a sample row"),
    ("def other(): pass\n", "has no function compute_score"),
    ("def compute_score(response, answer):\n    return 1.0\n",
     "compute_score does not take the keywords verl calls it with (data_source, solution_str, ground_truth, "
     "extra_info): missing a required argument: 'response'"),
    (GOOD.replace("return float(", "return str("), "compute_score returned 'True' on a sample row: verl takes a "
     "number, or a dict with a numeric 'score'"),
    ("def compute_score(**kw):\n    raise ValueError('boom')\n", "compute_score raised ValueError: boom on a "
     "sample row"),
    ("import sys\nsys.exit(3)\n", "does not import: SystemExit: 3"),
])
def test_each_bad_function_is_refused_in_one_line(tmp_path: Path, text: str, why: str) -> None:
    path = reward(tmp_path, text)
    assert refused(**{KEY: str(path)}) == [f'{KEY} = "{path}": {why}.']


ASYNC = GOOD.replace("def compute_score", "async def compute_score")
A4X = {"verl-gke:platform": "a4x", "verl-gke:gpuNodes": "4"}


def test_an_async_function_is_awaited_on_a4x_as_verl_0_9_0_awaits_it(tmp_path: Path) -> None:
    # verl 0.9.0's reward loop (verl/experimental/reward_loop/reward_manager/naive.py) awaits a coroutine function.
    path = reward(tmp_path, ASYNC)
    cfg = load_config({**BASE_CONFIG, **A4X, KEY: str(path)})
    assert cfg.verl.get("custom_reward_function.name") == "compute_score"
    wrong = reward(tmp_path, ASYNC.replace("return float(", "return str("), "wrong.py")
    assert refused(**A4X, **{KEY: str(wrong)}) == [
        f"{KEY} = \"{wrong}\": compute_score returned 'True' on a sample row: verl takes a number, or a dict with a "
        "numeric 'score'."]


def test_an_async_function_is_refused_on_verl_0_6_1(tmp_path: Path) -> None:
    # verl 0.6.1 validates through verl/workers/reward_manager/naive.py, which calls it without awaiting it.
    path = reward(tmp_path, ASYNC)
    assert refused(**{KEY: str(path)}) == [
        f'{KEY} = "{path}": compute_score is async (async def), which verl 0.6.1 calls without awaiting; make it a '
        "plain def (verl 0.9.0, on a4x, awaits it)."]


def test_verls_own_scorers_import_as_in_the_image(tmp_path: Path) -> None:
    # The image holds verl; its reward_score modules need only the standard library (verl's and verl.utils'
    # package imports, which need torch, are skipped by the check).
    path = reward(tmp_path, "from verl.utils.reward_score import gsm8k, math_reward\n"
                            "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                            "    return gsm8k.compute_score(solution_str, ground_truth)\n")
    for config in ({}, A4X):
        assert load_config({**BASE_CONFIG, **config, KEY: str(path)}).reward_function == str(path)
    wrong = reward(tmp_path, "from verl.utils.reward_score import gsm8k\n"
                             "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                             "    return gsm8k.compute_score(solution_str, ground_truth) > 0\n", "wrong.py")
    assert refused(**{KEY: str(wrong)}) == [  # True: verl's gsm8k scored the sample row 1.0
        f"{KEY} = \"{wrong}\": compute_score returned True on a sample row: verl takes a number, or a dict with a "
        "numeric 'score'."]


def test_a_function_that_never_returns_is_stopped_at_the_deadline(tmp_path: Path) -> None:
    path = reward(tmp_path, "import time\ntime.sleep(60)\n")
    assert reward_fn.problems(str(path), VERL_0_6_1, timeout_s=2) == [
        f'{KEY} = "{path}": importing and calling compute_score on a sample row took over 2 s.']


def test_not_a_python_file_is_refused(tmp_path: Path) -> None:
    assert refused(**{KEY: f"{tmp_path}/missing.py"}) == [
        f'{KEY} = "{tmp_path}/missing.py": a local Python file and, after \':\', the function verl calls (default '
        "compute_score), e.g. reward.py:compute_score."]


def test_it_is_called_on_your_data_and_lets_its_sources_through(tmp_path: Path) -> None:
    folder = write(tmp_path / "mine", [row("my/source", reward_model={"style": "rule", "ground_truth": "42"})])
    picky = reward(tmp_path, "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                             "    assert data_source == 'my/source' and ground_truth == '42'\n    return 1\n")
    load_config({**BASE_CONFIG, "verl-gke:dataDir": str(folder), KEY: str(picky)})


def test_the_program_uploads_the_file_and_the_job_names_it(tmp_path: Path) -> None:
    path = reward(tmp_path, GOOD)
    result = synth.run("a4", overrides={KEY: str(path)})
    [obj] = [r for r in result.registrations if r.type == "gcp:storage/bucketObject:BucketObject"]
    assert obj.inputs["name"] == reward_fn.object_name(str(path))
    [job] = [r for r in result.registrations if r.type == "pulumi-python:dynamic:GrpoJob"]
    args = shlex.split(job.inputs["entrypoint"])
    assert f"custom_reward_function.path=/data/{obj.inputs['name']}" in args
    assert "custom_reward_function.name=compute_score" in args


def test_with_math_staged_it_is_called_on_a_math_row(tmp_path: Path) -> None:
    picky = reward(tmp_path, "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                             "    assert data_source == 'DigitalLearningGmbH/MATH-lighteval', data_source\n"
                             "    assert solution_str.endswith('\\\\boxed{' + ground_truth + '}')\n    return 1\n")
    load_config({**BASE_CONFIG, "verl-gke:dataset": "DigitalLearningGmbH/MATH-lighteval", KEY: str(picky),
                 "verl-gke:verl": '{"data": {"filter_overlong_prompts": true}}'})


def test_it_is_called_on_a_row_of_each_data_source_of_your_folder(tmp_path: Path) -> None:
    folder = write(tmp_path / "mine", [row("my/source"), row("their/source")])
    picky = reward(tmp_path, "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                             "    assert data_source == 'my/source', data_source\n    return 1\n")
    assert refused(**{"verl-gke:dataDir": str(folder), KEY: str(picky)}) == [
        f'{KEY} = "{picky}": compute_score raised AssertionError: their/source on row 1 of train.parquet '
        "(data_source their/source)."]


def test_a_reward_may_import_what_verl_requires_as_the_image_holds_it(tmp_path: Path) -> None:
    """numpy and pandas (and pandas' own dependencies) are verl's requirements: the image has them."""
    path = reward(tmp_path, "import numpy, pandas\n" + GOOD.replace("return float(", "return numpy.float64("))
    assert reward_fn.problems(str(path), VERL_0_6_1) == []
