"""Checkpoint markers that name GCS generations (workloads/checkpoints.py with GENERATIONS from the bucket's
JSON API), against the emulator (tests/gcs_emulator.py). The copiers write through a folder standing for the
bucket mount; GCS FUSE uploads a file when its writer closes it, each upload a new generation of the object:
the stand-in uploads the file's bytes to the emulator where the copy ends (shutil.copyfileobj)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.gcs_emulator import make_bucket
from tests.test_checkpoints import (RUN, WORLD, _logs, _origin, _start_attempt, a1_write_in_flight_past_a2s_copy_of_30,
                                    verl_saves)
from workloads import checkpoints as ck
from workloads import export_model


@pytest.fixture
def world(gcs_emulator: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    mount = tmp_path / "bucket"
    bucket = mount / "verl" / "checkpoints"
    bucket.mkdir(parents=True)
    gcs = make_bucket(gcs_emulator, "verl-data", mount)
    real = shutil.copyfileobj

    def through_the_mount(reader, writer, n=0):
        real(reader, writer, n)
        writer.flush()
        if Path(writer.name).is_relative_to(mount):  # a write into the bucket: its upload on close
            gcs.write(gcs.name(writer.name), Path(writer.name).read_bytes(), (gcs.stat(gcs.name(writer.name))
                                                                                or _Absent).generation)

    monkeypatch.setattr(ck.shutil, "copyfileobj", through_the_mount)

    def generations(step_dir: Path) -> dict[str, int]:
        prefix = gcs.name(step_dir) + "/"
        return {name[len(prefix):]: stat.generation for name, stat in gcs.generations(prefix).items()}
    monkeypatch.setattr(ck, "GENERATIONS", generations)
    return {"bucket": bucket, "run": bucket / RUN, "head": tmp_path / "head", "gcs": gcs,
            "nodes": [tmp_path / f"node{i}" for i in range(2)]}


class _Absent:
    generation = 0


def test_a_copier_write_in_flight_past_a_later_attempts_markers_voids_them(
        world: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """The residual of 0.7.0 (docs/checkpoints-and-a4x.md): a1's node1 copier is writing rank 2's model shard
    of 30 when a2 saves, copies and completes 30; a1's write lands last, same size, a1's bytes. a2's markers
    name the generations a2's copiers wrote: the late one is another, so neither resume nor the export takes
    step 30 (resume: none complete; the export: no model); a2's next copy of 30 would make it whole again."""
    lines, log = _logs()

    def a2_complete() -> None:
        assert ck.resume_step(world["run"], WORLD) == 30  # a2's copy is whole
    a1_write_in_flight_past_a2s_copy_of_30(world, monkeypatch, log, a2_complete)
    assert _origin(world, 30) == {0: 0xA2, 1: 0xA2, 2: 0xA1, 3: 0xA2}  # the late write landed
    step = world["run"] / "global_step_30"
    marker = ck.read_record(step / ck.MARKER)
    assert marker is not None and marker["attempt"] == "a2"
    assert set(marker["generations"]) == set(marker["files"])
    assert ck.resume_step(world["run"], WORLD) is None
    assert export_model.model_steps(world["run"], world["gcs"]) == []
    assert "step 30: saved again by another attempt; node1 stops copying attempt a1's files" in lines


def test_markers_name_the_generation_of_every_file_they_vouch_for(world: dict) -> None:
    _, log = _logs()
    launch = _start_attempt(world, "a1")
    verl_saves(world["nodes"], world["head"], "a1", 10)
    ck.announce(launch, "a1", 0, log)
    for i, node in enumerate(world["nodes"]):
        ck.copy_once(node, world["bucket"], f"node{i}", log)
    step = world["run"] / "global_step_10"
    now = ck.GENERATIONS(step)
    for name in (ck.MODEL_MARKER, ck.MARKER):
        marker = ck.read_record(step / name)
        assert marker["generations"] == {f: now[f] for f in marker["files"]}
    assert ck.resume_step(world["run"], WORLD) == 10
    assert export_model.model_steps(world["run"], world["gcs"]) == [10]
