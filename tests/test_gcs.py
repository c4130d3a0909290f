"""workloads/gcs.py against the emulator: what the checkpoint markers and the export's publication rest on
(a write names the generation it replaces; another writer's write in between makes it fail with 412)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gcs_emulator import make_bucket, put
from workloads.gcs import Gcs, PreconditionFailed, Stat


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
    from workloads.run_logs import GcsSink

    sink = GcsSink(make_bucket(gcs_emulator, "verl-data", tmp_path))
    assert sink.read("logs/run-1/decisions.log") is None
    sink.write("logs/run-1/decisions.log", "one\n")
    sink.write("logs/run-1/decisions.log", "one\ntwo é\n")
    assert sink.read("logs/run-1/decisions.log") == "one\ntwo é\n"
    with pytest.raises(FileNotFoundError, match="gs://no-such-bucket: no such bucket"):
        GcsSink(Gcs("no-such-bucket", storage_url=gcs_emulator, token_url=None)).write("logs/x", "x")


def test_a_rewrite_copies_the_named_generation_inside_gcs(gcs_emulator: str, tmp_path: Path) -> None:
    """staging's gs:// dataDir copy (objects.rewrite); a generation no longer live is None (no versioning)."""
    theirs = make_bucket(gcs_emulator, "their-data", tmp_path / "theirs")
    ours = make_bucket(gcs_emulator, "verl-data", tmp_path / "ours")
    first = theirs.write("rl/train.parquet", b"generation one", 0)
    copy = ours.rewrite("user-data/train.parquet", "their-data", "rl/train.parquet", first, 0)
    assert copy is not None and ours.read("user-data/train.parquet") == (b"generation one", copy)
    theirs.write("rl/train.parquet", b"generation two", first)
    assert ours.rewrite("user-data/test.parquet", "their-data", "rl/train.parquet", first, 0) is None
    assert ours.stat("user-data/test.parquet") is None


def test_a_rewrite_gcs_answers_in_steps_goes_on_with_its_token(gcs_emulator: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """GCS may answer `done: false` with a rewriteToken, to be sent with the same request until done
    (https://cloud.google.com/storage/docs/json_api/v1/objects/rewrite). fake-gcs-server copies in one call
    whatever maxBytesRewrittenPerCall says, so here GCS's not-done answer comes first, then the emulator's."""
    theirs = make_bucket(gcs_emulator, "their-data", tmp_path / "theirs")
    ours = make_bucket(gcs_emulator, "verl-data", tmp_path / "ours")
    first = theirs.write("rl/train.parquet", b"x" * 1000, 0)
    urls: list[str] = []
    emulator = ours._call

    def in_steps(url: str, name: str, **kw):
        urls.append(url)
        if len(urls) == 1:
            return json.dumps({"kind": "storage#rewriteResponse", "done": False, "rewriteToken": "step/1",
                               "totalBytesRewritten": "512", "objectSize": "1000"}).encode()
        return emulator(url, name, **kw)
    monkeypatch.setattr(ours, "_call", in_steps)
    copy = ours.rewrite("user-data/train.parquet", "their-data", "rl/train.parquet", first, 0)
    assert urls == [f"{gcs_emulator}/storage/v1/b/their-data/o/rl%2Ftrain.parquet/rewriteTo/b/verl-data/o/"
                    f"user-data%2Ftrain.parquet?sourceGeneration={first}&ifGenerationMatch=0",
                    urls[0] + "&rewriteToken=step%2F1"]
    assert ours.stat("user-data/train.parquet") == Stat(copy, 1000)

    monkeypatch.setattr(ours, "_call", lambda url, name, **kw: json.dumps(
        {"done": False, "rewriteToken": "t", "totalBytesRewritten": "512", "objectSize": "1000"}).encode())
    with pytest.raises(TimeoutError) as caught:
        ours.rewrite("user-data/test.parquet", "their-data", "rl/train.parquet", first, 0, deadline_s=0)
    assert str(caught.value) == ("gs://verl-data/user-data/test.parquet: the copy of gs://their-data/rl/train.parquet "
                                 "is not done after 0 s (512 of 1000 bytes)")


def test_ranged_reads_of_a_named_generation(gcs_emulator: str, tmp_path: Path) -> None:
    """preview's parquet footers: objects.get of one generation, then Range requests of its media."""
    gcs = make_bucket(gcs_emulator, "their-data", tmp_path)
    data = bytes(range(256)) * 4
    first = gcs.write("rl/train.parquet", data, 0)
    assert gcs.stat("rl/train.parquet", first) == Stat(first, 1024)
    assert gcs.media("rl/train.parquet", first, start=1014, length=10) == data[-10:]
    assert gcs.media("rl/train.parquet", start=4, length=8) == data[4:12]
    assert gcs.media("rl/train.parquet", first) == data
    gcs.write("rl/train.parquet", b"new", first)
    assert gcs.stat("rl/train.parquet", first) is None and gcs.media("rl/train.parquet", first, 0, 4) is None


def test_a_token_the_caller_holds_is_sent_as_is() -> None:
    """preview's reads carry the gcp provider's token (components/preflight.py), not the metadata server's."""
    assert Gcs("b", token_url=None, access_token="ya29.user")._headers() == {"Authorization": "Bearer ya29.user"}
    assert Gcs("b", token_url=None)._headers() == {}


def test_the_preview_reader_is_this_client_with_the_providers_token(gcs_emulator: str, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """components/preflight.open_gcs_object: the gcp provider's token (getClientConfig's accessToken) on every
    request, the pinned generation's size, then its ranges; a generation gone is one line, not a 404."""
    from components import preflight

    gcs = make_bucket(gcs_emulator, "their-data", tmp_path)
    data = bytes(range(256)) * 4
    first = gcs.write("rl/train.parquet", data, 0)
    monkeypatch.setattr(preflight, "engine_invoke", lambda token, args: {"accessToken": "ya29.user"} if (
        token, args) == (preflight.CLIENT_CONFIG, {}) else {})
    sent: list[tuple[str, dict[str, str]]] = []
    answer = Gcs._answer

    def recorded(self: Gcs, url: str, name: str, **kw):
        sent.append((url.removeprefix(gcs_emulator), {**self._headers(), **(kw.get("headers") or {})}))
        return answer(self, url, name, **kw)
    monkeypatch.setattr(Gcs, "_answer", recorded)
    size, read = preflight.open_gcs_object("their-data", "rl/train.parquet", first, root=gcs_emulator)
    assert (size, read(1014, 10)) == (1024, data[-10:])
    bearer = {"Authorization": "Bearer ya29.user"}
    assert sent == [(f"/storage/v1/b/their-data/o/rl%2Ftrain.parquet?generation={first}", bearer),
                    (f"/storage/v1/b/their-data/o/rl%2Ftrain.parquet?alt=media&generation={first}",
                     {**bearer, "Range": "bytes=1014-1023"})]
    gcs.write("rl/train.parquet", b"new", first)
    with pytest.raises(FileNotFoundError, match=f"^gs://their-data/rl/train.parquet has no generation {first} any "
                       "more$"):
        read(0, 4)
    with pytest.raises(FileNotFoundError, match=f"^gs://their-data/rl/train.parquet has no generation {first}$"):
        preflight.open_gcs_object("their-data", "rl/train.parquet", first, root=gcs_emulator)
