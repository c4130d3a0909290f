"""workloads/gcs.py against the emulator: what the checkpoint markers and the export's publication rest on
(a write names the generation it replaces; another writer's write in between makes it fail with 412)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gcs_emulator import make_bucket, put
from workloads.gcs import PreconditionFailed, Stat


def test_the_emulator_enforces_if_generation_match_and_reads_a_named_generation(gcs_emulator: str,
                                                                                  tmp_path: Path) -> None:
    gcs = make_bucket(gcs_emulator, "verl-data", tmp_path)
    first = gcs.write("runs/r/claim.json", b"one", 0)
    with pytest.raises(PreconditionFailed, match=r"gs://verl-data/runs/r/claim.json: changed by another writer"):
        gcs.write("runs/r/claim.json", b"two", 0)  # 0: only if absent
    second = gcs.write("runs/r/claim.json", b"two", first)
    assert second != first
    with pytest.raises(PreconditionFailed):
        gcs.write("runs/r/claim.json", b"three", first)  # the generation it named is gone
    assert gcs.read("runs/r/claim.json") == (b"two", second)
    assert gcs.read("runs/r/claim.json", second) == (b"two", second)
    assert gcs.read("runs/r/claim.json", first) is None  # no versioning: an overwritten generation is gone
    assert gcs.stat("runs/r/claim.json") == Stat(second, 3)
    assert gcs.stat("runs/r/none") is None


def test_a_write_through_the_mount_is_a_new_generation_listed_under_its_prefix(gcs_emulator: str,
                                                                             tmp_path: Path) -> None:
    gcs = make_bucket(gcs_emulator, "verl-data", tmp_path)
    shard = tmp_path / "verl" / "r" / "global_step_1" / "actor" / "model_world_size_1_rank_0.pt"
    first = put(gcs, shard, b"x" * 10)
    again = put(gcs, shard, b"y" * 10)  # the same size, other bytes: only the generation tells
    assert again != first
    assert gcs.name(shard) == "verl/r/global_step_1/actor/model_world_size_1_rank_0.pt"
    assert gcs.generations("verl/r/global_step_1/") == {gcs.name(shard): Stat(again, 10)}


def test_the_run_logs_copy_goes_through_the_same_client(gcs_emulator: str, tmp_path: Path) -> None:
    """workloads/run_logs.GcsSink: one request a read or a write (objects.get alt=media, objects.insert
    uploadType=media), overwriting; a missing object reads as None, a missing bucket fails the write."""
    from workloads.gcs import Gcs
    from workloads.run_logs import GcsSink

    sink = GcsSink(make_bucket(gcs_emulator, "verl-data", tmp_path))
    assert sink.read("logs/run-1/decisions.log") is None
    sink.write("logs/run-1/decisions.log", "one\n")
    sink.write("logs/run-1/decisions.log", "one\ntwo é\n")
    assert sink.read("logs/run-1/decisions.log") == "one\ntwo é\n"
    with pytest.raises(FileNotFoundError, match="gs://no-such-bucket: no such bucket"):
        GcsSink(Gcs("no-such-bucket", storage_url=gcs_emulator, token_url=None)).write("logs/x", "x")
