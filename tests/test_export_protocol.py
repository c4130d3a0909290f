"""The export's protocol on GCS generations (workloads/export_model.py with workloads/gcs.py), against the
emulator (tests/gcs_emulator.py): two exports of one run (the supervisor's final export and `verl-gke
export`), and an export racing a retry that saves the step again. The schedules are driven by a stand-in
for verl's merger that stops between reading two shards until the test lets it go; the bucket mount is a
folder whose every write is also the object's new generation in the emulator (tests.gcs_emulator.put)."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.gcs_emulator import make_bucket, put
from workloads import checkpoints, export_model
from workloads.export_model import ExportError
from workloads.gcs import Gcs

RUN = "run-1"
MERGER = '''
"""Stand-in for `python -m verl.model_merger merge --backend fsdp --local_dir A --target_dir T` (verl's CLI):
reads the model shards of every rank in order and writes them, concatenated, as the model; between rank 0
and rank 1 it announces itself (`started`) and waits for `go`, or `go-<its target folder>` (at most 30 s)."""
import os, sys, time
from pathlib import Path
args = sys.argv[1:]
actor, target = Path(args[args.index("--local_dir") + 1]), Path(args[args.index("--target_dir") + 1])
flags = Path(os.environ["MERGER_FLAGS"])
shards = sorted(actor.glob("model_world_size_*_rank_*.pt"))
data = shards[0].read_bytes()
(flags / "started").touch()
give_up = time.monotonic() + 30
while not (flags / "go").exists() and not (flags / f"go-{target.name}").exists() and time.monotonic() < give_up:
    time.sleep(0.05)
for shard in shards[1:]:
    data += shard.read_bytes()
target.mkdir(parents=True)
(target / "model.safetensors").write_bytes(data)
'''


@pytest.fixture
def world(gcs_emulator: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    mount = tmp_path / "data"
    gcs = make_bucket(gcs_emulator, "verl-data", mount)
    merger = tmp_path / "fakeverl" / "verl" / "model_merger"
    merger.mkdir(parents=True)
    (merger / "__main__.py").write_text(MERGER)
    flags = tmp_path / "flags"
    flags.mkdir()
    monkeypatch.setenv("MERGER_FLAGS", str(flags))
    return mount, gcs, tmp_path / "fakeverl", flags


def save_step(gcs: Gcs, run_dir: Path, step: int, attempt: str, fill: bytes) -> None:
    """Step `step` of a world-size-2 run as the copiers leave it: each rank's model shard (`fill` bytes),
    the merger's config files, saved.json naming `attempt`, and the model marker naming every file's
    generation (workloads/checkpoints.py)."""
    step_dir = run_dir / f"global_step_{step}"
    put(gcs, step_dir / checkpoints.STATE_DIR / checkpoints.SAVED_FILE,
        json.dumps({"attempt": attempt, "world_size": 2, "step": step}).encode())
    files = {f"actor/model_world_size_2_rank_{r}.pt": fill * 8 for r in range(2)}
    files |= {"actor/fsdp_config.json": b'{"world_size": 2}', "actor/huggingface/config.json": b"{}"}
    generations = {name: put(gcs, step_dir / name, data) for name, data in files.items()}
    marker = {"step": step, "attempt": attempt, "world_size": 2, "files": {n: len(d) for n, d in files.items()},
              "generations": generations}
    put(gcs, step_dir / checkpoints.MODEL_MARKER, json.dumps(marker).encode())


def run_export(mount: Path, gcs: Gcs, verl: Path, export_id: str, **kw) -> Path:
    return export_model.export(mount / "verl" / "checkpoints" / RUN, mount / export_model.model_path(RUN),
                               python=sys.executable, verl_dir=verl, timeout_s=60, memory_bytes=10**9,
                               gcs=gcs, export_id=export_id, **kw)


def until(path: Path, timeout_s: float = 30.0) -> None:
    give_up = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < give_up, f"{path} did not appear within {timeout_s} s"
        time.sleep(0.05)


def in_thread(fn) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def body() -> None:
        try:
            out["result"] = fn()
        except Exception as error:  # noqa: BLE001 - the test asserts on it
            out["error"] = error
    thread = threading.Thread(target=body)
    thread.start()
    return thread, out


def test_two_exports_of_one_run_the_second_refuses_in_one_line_and_the_first_publishes_whole(world) -> None:
    """The supervisor's final export is merging; `verl-gke export` of the same run starts: it refuses (one
    line naming the run and the live export), never touching the first's folder; the first publishes its
    whole model and a pointer naming the generations it merged."""
    mount, gcs, verl, flags = world
    save_step(gcs, mount / "verl" / "checkpoints" / RUN, 10, "a1", b"A")
    first, out = in_thread(lambda: run_export(mount, gcs, verl, "verl-export-run-1-final-0"))
    until(flags / "started")
    with pytest.raises(ExportError) as refused:
        run_export(mount, gcs, verl, "verl-export-run-1-final")
    assert re.fullmatch(
        r"run run-1: export verl-export-run-1-final-0 of this run is live \(its claim models/run-1/\.export\.json, "
        r"[0-9] s old; taken over once 15000 s old\); export verl-export-run-1-final refuses and publishes nothing",
        str(refused.value)), str(refused.value)
    (flags / "go").touch()
    first.join(30)
    assert out == {"result": mount / "models" / RUN / "model"}
    assert (mount / "models" / RUN / "model" / "model.safetensors").read_bytes() == b"A" * 16
    assert sorted(p.name for p in (mount / "models" / RUN).iterdir()) == ["model"]  # no folder left over
    pointer, _ = gcs.read_json(f"models/{RUN}/model.json")
    step_dir = f"verl/checkpoints/{RUN}/global_step_10"
    assert pointer == {"export": "verl-export-run-1-final-0", "folder": f"models/{RUN}/model", "step": 10,
                       "sources": {f"{step_dir}/{n}": gcs.stat(f"{step_dir}/{n}").generation
                                   for n in ("actor/fsdp_config.json", "actor/huggingface/config.json",
                                             "actor/model_world_size_2_rank_0.pt",
                                             "actor/model_world_size_2_rank_1.pt")}}
    # The claim is released: the second export, run again, goes through.
    (flags / "started").unlink()
    assert run_export(mount, gcs, verl, "verl-export-run-1-final") == mount / "models" / RUN / "model"


def test_an_export_racing_a_retry_that_saves_the_step_again_publishes_nothing(world) -> None:
    """The export reads rank 0's shard of step 10 (attempt a1); a retry (attempt a2) saves step 10 again,
    both ranks; the merger then reads rank 1's new shard: a mixed model. The export sees the generations
    it started from changed and publishes nothing."""
    mount, gcs, verl, flags = world
    run_dir = mount / "verl" / "checkpoints" / RUN
    save_step(gcs, run_dir, 10, "a1", b"A")
    export, out = in_thread(lambda: run_export(mount, gcs, verl, "verl-export-run-1-final-0"))
    until(flags / "started")
    save_step(gcs, run_dir, 10, "a2", b"B")
    (flags / "go").touch()
    export.join(30)
    assert str(out.get("error")) == (
        "run run-1: step 10 was saved again while it was merged (verl/checkpoints/run-1/global_step_10/"
        "actor/fsdp_config.json is another generation); export verl-export-run-1-final-0 publishes nothing")
    assert not (mount / "models" / RUN).exists() or list((mount / "models" / RUN).iterdir()) == []
    assert gcs.stat(f"models/{RUN}/model.json") is None
    # Exported again, it merges the retry's whole step.
    (flags / "started").unlink()
    assert run_export(mount, gcs, verl, "verl-export-run-1-final-0") == mount / "models" / RUN / "model"
    assert (mount / "models" / RUN / "model" / "model.safetensors").read_bytes() == b"B" * 16


def test_a_shard_that_is_not_the_generation_its_marker_vouches_for_is_refused(world) -> None:
    """A copier's write that was in flight when a later attempt saved the step lands after that attempt's
    markers: same size, other bytes, another generation. The export refuses the step rather than merge it."""
    mount, gcs, verl, flags = world
    run_dir = mount / "verl" / "checkpoints" / RUN
    save_step(gcs, run_dir, 10, "a2", b"B")
    put(gcs, run_dir / "global_step_10" / "actor" / "model_world_size_2_rank_1.pt", b"A" * 8)  # the late write
    with pytest.raises(ExportError, match=r"latest_checkpointed_iteration.txt: no checkpoint yet"):
        run_export(mount, gcs, verl, "e1")
    with pytest.raises(ExportError, match=r"step 10's model has not been fully copied to the bucket"):
        run_export(mount, gcs, verl, "e1", step=10)
    assert not (flags / "started").exists()


def test_a_retry_of_the_same_export_takes_its_own_claim_and_a_lapsed_claim_is_taken_over(world) -> None:
    """The supervisor resubmits its export under the same id after a head restart killed the first driver:
    it goes on. Another export's claim that GCS's clock says is older than the merge's bound is taken over."""
    mount, gcs, verl, flags = world
    save_step(gcs, mount / "verl" / "checkpoints" / RUN, 10, "a1", b"A")
    gcs.write_json(f"models/{RUN}/.export.json", {"export": "verl-export-run-1-final-0", "state": "live"}, 0)
    (flags / "go").touch()
    assert run_export(mount, gcs, verl, "verl-export-run-1-final-0") == mount / "models" / RUN / "model"
    gcs.write_json(f"models/{RUN}/.export.json", {"export": "dead", "state": "live"},
                   gcs.stat(f"models/{RUN}/.export.json").generation)
    with pytest.raises(ExportError, match="export dead of this run is live"):
        run_export(mount, gcs, verl, "e2")
    time.sleep(2.1)  # GCS's Date header counts whole seconds
    assert run_export(mount, gcs, verl, "e2", claim_lapses_s=1.0) == mount / "models" / RUN / "model"


def test_an_export_that_outlives_its_claim_publishes_nothing_over_the_one_that_took_it_over(world) -> None:
    """Export e1 stalls in its merge past the claim's bound (here 2 s); e2 takes the lapsed claim over and
    publishes; e1's merge then ends: its claim is no longer the generation it wrote, so it neither replaces
    e2's model nor reports success."""
    mount, gcs, verl, flags = world
    save_step(gcs, mount / "verl" / "checkpoints" / RUN, 10, "a1", b"A")
    first, out = in_thread(lambda: run_export(mount, gcs, verl, "e1", claim_lapses_s=2.0))
    until(flags / "started")
    time.sleep(3.1)  # GCS's Date header counts whole seconds
    (flags / "go-model.partial-e2").touch()
    assert run_export(mount, gcs, verl, "e2", claim_lapses_s=2.0) == mount / "models" / RUN / "model"
    (flags / "go").touch()
    first.join(30)
    assert str(out.get("error")) == (
        "run run-1: another export took over this export's claim models/run-1/.export.json (export e1 outlived "
        "it); export e1 publishes nothing")
    assert gcs.read_json(f"models/{RUN}/model.json")[0]["export"] == "e2"
    assert sorted(p.name for p in (mount / "models" / RUN).iterdir()) == ["model"]


def test_of_two_exports_that_both_saw_no_claim_exactly_one_claims_the_run(world, monkeypatch) -> None:
    """Both read the claim as absent (neither had written it yet); both write it with ifGenerationMatch=0:
    GCS lets one through, the other gets 412 and refuses."""
    mount, gcs, verl, flags = world
    save_step(gcs, mount / "verl" / "checkpoints" / RUN, 10, "a1", b"A")
    first, out = in_thread(lambda: run_export(mount, gcs, verl, "e1"))
    until(flags / "started")
    with monkeypatch.context() as patch, pytest.raises(ExportError, match=(
            r"^run run-1: another export of this run claimed it first \(its claim models/run-1/\.export\.json\); "
            r"export e2 refuses and publishes nothing$")):
        patch.setattr(gcs, "read_json", lambda name, generation=None: None)  # read before e1 wrote
        run_export(mount, gcs, verl, "e2")
    (flags / "go").touch()
    first.join(30)
    assert out == {"result": mount / "models" / RUN / "model"}


class _Died(BaseException):
    """The export's process dying at this line (nothing after it runs; the claim lapses)."""


def test_an_export_cut_between_its_rename_and_its_pointer_leaves_no_pointer_to_another_model(
        world, monkeypatch) -> None:
    """Export e1 published step 10; e2 of step 20 dies once its folder replaced e1's, before its pointer: the
    pointer must not still vouch for e1's model (a warm start would take e2's folder for it), it says the
    model is being replaced until an export publishes again."""
    from domain import start_from

    mount, gcs, verl, flags = world
    run_dir = mount / "verl" / "checkpoints" / RUN
    save_step(gcs, run_dir, 10, "a1", b"A")
    (flags / "go").touch()
    run_export(mount, gcs, verl, "e1")
    save_step(gcs, run_dir, 20, "a1", b"B")
    rename = Path.rename

    def dies_after(self: Path, target: Path) -> Path:
        rename(self, target)
        raise _Died
    monkeypatch.setattr(Path, "rename", dies_after)
    with pytest.raises(_Died):
        run_export(mount, gcs, verl, "e2")
    monkeypatch.setattr(Path, "rename", rename)
    pointer, _ = gcs.read_json(f"models/{RUN}/model.json")
    assert (mount / "models" / RUN / "model" / "model.safetensors").read_bytes() == b"B" * 16
    assert pointer == {"export": "e2", "folder": f"models/{RUN}/model", "replacing": True, "step": 20}
    assert start_from.resumable_problem({"model": f"gs://verl-data/models/{RUN}/model"}, 16, {"pointer": pointer}) == (
        f'verl-gke:startFrom = {{"model": "gs://verl-data/models/{RUN}/model"}}: its export was cut while replacing '
        "the model (model.json says so): export the run again with `verl-gke export`.")
    # The next export publishes, and the pointer vouches for its model again.
    assert run_export(mount, gcs, verl, "e3", claim_lapses_s=0.0) == mount / "models" / RUN / "model"
    assert gcs.read_json(f"models/{RUN}/model.json")[0]["step"] == 20
