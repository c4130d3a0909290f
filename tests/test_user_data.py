"""Your own data (issue 49, item 2): verl-gke:dataDir, a local folder in verl's parquet format, checked offline
and uploaded by the program into the bucket under its digest."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from domain import user_data
from domain.config import ConfigError, load_config
from domain.platforms import PLATFORMS
from tests.conftest import BASE_CONFIG, verl_value
from verl_gke import synth

KEY = "verl-gke:dataDir"


def row(source: str = "openai/gsm8k", **extra: Any) -> dict[str, Any]:
    """One row as verl's examples/data_preprocess/gsm8k.py writes it."""
    return {"data_source": source, "prompt": [{"role": "user", "content": "1 + 1?"}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "2"}, "extra_info": {"split": "train", "index": 0},
            **extra}


def write(folder: Path, rows: list[dict[str, Any]], drop: tuple[str, ...] = ()) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist([{k: v for k, v in r.items() if k not in drop} for r in rows])
    for name in ("train.parquet", "test.parquet"):
        pq.write_table(table, folder / name)
    return folder


def refused(**config: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config({**BASE_CONFIG, **config})
    return caught.value.problems


def test_good_data_sets_the_run_paths_under_its_digest(tmp_path: Path) -> None:
    folder = write(tmp_path / "mine", [row(), row("lighteval/MATH"), row("aime2024")])
    cfg = load_config({**BASE_CONFIG, KEY: str(folder)})
    d = user_data.digest(folder)
    assert cfg.verl.get("data.train_files") == f"/data/user-data/{d}/train.parquet"
    assert cfg.verl.get("data.val_files") == f"/data/user-data/{d}/test.parquet"


def test_missing_columns_are_named_in_one_line_per_file(tmp_path: Path) -> None:
    folder = write(tmp_path / "bad", [row()], drop=("reward_model", "data_source"))
    line = (f'verl-gke:dataDir = "{folder}": {{}} lacks what verl reads: data_source, reward_model (columns prompt, '
            "data_source, reward_model.ground_truth; extra_info optional).")
    assert refused(**{KEY: str(folder)}) == [line.format("train.parquet"), line.format("test.parquet")]


def test_a_ground_truth_outside_reward_model_is_refused(tmp_path: Path) -> None:
    folder = write(tmp_path / "flat", [row(reward_model={"style": "rule", "answer": "2"})])
    [first, _] = refused(**{KEY: str(folder)})
    assert first.endswith("train.parquet lacks what verl reads: reward_model.ground_truth (columns prompt, "
                          "data_source, reward_model.ground_truth; extra_info optional).")


def test_sources_verls_default_reward_does_not_score_are_refused_unless_a_custom_reward_is_set(tmp_path: Path) -> None:
    folder = write(tmp_path / "mine", [row("my/source"), row("openai/gsm8k")])
    lines = refused(**{KEY: str(folder)})
    assert len(lines) == 2 and lines[0].startswith(
        f'verl-gke:dataDir = "{folder}": train.parquet: data_source my/source is not one verl 0.6.1\'s default '
        "reward scores (")
    assert lines[0].endswith("...); set verl.custom_reward_function.path for your own.")
    load_config({**BASE_CONFIG, KEY: str(folder),
                 "verl-gke:verl": verl_value({"custom_reward_function.path": "/data/reward.py"})})


def test_a_folder_without_the_files_and_a_gs_path_are_refused(tmp_path: Path) -> None:
    assert refused(**{KEY: str(tmp_path)}) == [
        f'verl-gke:dataDir = "{tmp_path}": a folder holding train.parquet and test.parquet in verl\'s RL format '
        "(missing train.parquet, test.parquet)."]
    assert refused(**{KEY: "gs://b/data"}) == [
        'verl-gke:dataDir = "gs://b/data": a local folder (gs:// is not staged yet: copy the two files locally).']


def test_the_data_paths_may_not_be_set_twice(tmp_path: Path) -> None:
    folder = write(tmp_path / "mine", [row()])
    assert refused(**{KEY: str(folder), "verl-gke:verl": verl_value({"data.train_files": "/data/x.parquet"})}) == [
        f'verl-gke:dataDir = "{folder}": sets data.train_files itself: remove verl-gke:verl.data.train_files, or '
        "this key."]


def test_the_sources_are_read_from_the_pinned_verls_reward_function() -> None:
    names, prefixes = user_data.known_sources(PLATFORMS["a4"].verl)
    assert {"openai/gsm8k", "lighteval/MATH", "math_dapo"} <= names and "aime" in prefixes


def test_the_program_uploads_the_files_and_the_job_reads_them(tmp_path: Path) -> None:
    folder = write(tmp_path / "mine", [row()])
    result = synth.run("a4", overrides={KEY: str(folder)})
    d = user_data.digest(folder)
    objects = {r.inputs["name"]: r for r in result.registrations if r.type == "gcp:storage/bucketObject:BucketObject"}
    assert set(objects) == {f"user-data/{d}/train.parquet", f"user-data/{d}/test.parquet"}
    [job] = [r for r in result.registrations if r.type == "pulumi-python:dynamic:GrpoJob"]
    args = shlex.split(job.inputs["entrypoint"])
    assert f"data.train_files=/data/user-data/{d}/train.parquet" in args
    assert f"data.val_files=/data/user-data/{d}/test.parquet" in args


def test_a_file_that_is_not_parquet_is_refused_with_pyarrows_reason(tmp_path: Path) -> None:
    folder = write(tmp_path / "mine", [row()])
    (folder / "train.parquet").write_text("prompt,data_source\n")
    [line] = refused(**{KEY: str(folder)})
    assert line.startswith(f'verl-gke:dataDir = "{folder}": train.parquet is not a readable parquet file (')
    assert "\n" not in line
