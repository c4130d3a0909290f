"""Checkpoints written to local disk and copied to the bucket in the background (workloads/checkpoints.py):
the completeness rules, the copy against a local folder and a folder standing in for the bucket mount,
a copier killed mid-copy, and where a new attempt resumes. File layout as verl 0.6.1 and 0.9.0 write it
(verl/utils/checkpoint/fsdp_checkpoint_manager.py: per rank model/optim/extra_state, rank 0 fsdp_config.json
and huggingface/; the trainer: data.pt and latest_checkpointed_iteration.txt in default_local_dir)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads import checkpoints as ck
from workloads import export_model

REPO = Path(__file__).resolve().parent.parent
NODES, GPUS = 2, 2
WORLD = NODES * GPUS
RUN = "run-0123456789ab"


def _logs() -> tuple[list[str], object]:
    lines: list[str] = []
    return lines, lines.append


def verl_saves(local_roots: list[Path], head: Path, attempt: str, step: int, *, size: int = 1000,
               kinds: tuple[str, ...] = ("model", "optim", "extra_state")) -> None:
    """What verl leaves on each node's disk after a save of `step` returned on every rank."""
    for node, root in enumerate(local_roots):
        actor = root / RUN / attempt / f"global_step_{step}" / "actor"
        actor.mkdir(parents=True, exist_ok=True)
        for rank in range(node * GPUS, (node + 1) * GPUS):
            for kind in kinds:
                (actor / f"{kind}_world_size_{WORLD}_rank_{rank}.pt").write_bytes(bytes([rank]) * size)
            if rank == 0:
                (actor / "fsdp_config.json").write_text('{"world_size": 4}')
                (actor / "huggingface").mkdir(exist_ok=True)
                (actor / "huggingface" / "config.json").write_text("{}")
    step_dir = head / RUN / attempt / f"global_step_{step}"
    step_dir.mkdir(parents=True, exist_ok=True)
    (step_dir / "data.pt").write_bytes(b"d" * 10)
    (head / RUN / attempt / ck.TRACKER).write_text(str(step))


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    bucket = tmp_path / "bucket" / "verl" / "checkpoints"
    bucket.mkdir(parents=True)
    return {"bucket": bucket, "run": bucket / RUN, "head": tmp_path / "head",
            "nodes": [tmp_path / f"node{i}" for i in range(NODES)]}


def _start_attempt(world: dict, attempt: str, keep: int | None = None) -> ck.Launch:
    ck.write_json(world["run"] / ck.STATE_DIR / ck.ATTEMPT_FILE, {"attempt": attempt, "world_size": WORLD, "keep": keep})
    return ck.Launch([], world["run"], world["head"] / RUN / attempt, WORLD, None)


def _save_and_copy(world: dict, launch: ck.Launch, attempt: str, step: int, log) -> None:
    verl_saves(world["nodes"], world["head"], attempt, step)
    ck.announce(launch, attempt, step - 1, log)
    for i, node in enumerate(world["nodes"]):
        ck.copy_once(node, world["bucket"], f"node{i}", log)


# --- the rules ---------------------------------------------------------------------------------------


def _parts(world_size: int = WORLD, attempt: str = "a", drop: str = "") -> list[dict]:
    files = {f"actor/{kind}_world_size_{world_size}_rank_{r}.pt": 5
             for r in range(world_size) for kind in ("model", "optim", "extra_state")}
    files |= {"actor/fsdp_config.json": 2, "actor/huggingface/config.json": 2, "data.pt": 1}
    files.pop(drop, None)
    return [{"attempt": attempt, "files": files}]


def _present(parts: list[dict]):
    sizes = {name: size for part in parts for name, size in part["files"].items()}
    return sizes.get


def test_a_save_whose_every_rank_and_file_is_in_the_bucket_is_complete() -> None:
    parts = _parts()
    verdict = ck.judge({"attempt": "a", "world_size": WORLD}, parts, _present(parts))
    assert verdict.complete and len(verdict.files) == 3 * WORLD + 3


@pytest.mark.parametrize("drop", [f"actor/model_world_size_{WORLD}_rank_3.pt", f"actor/optim_world_size_{WORLD}_rank_0.pt",
                                  "actor/fsdp_config.json", "actor/huggingface/config.json", "data.pt"])
def test_a_save_missing_a_rank_or_a_file_is_incomplete(drop: str) -> None:
    parts = _parts(drop=drop)
    verdict = ck.judge({"attempt": "a", "world_size": WORLD}, parts, _present(parts))
    assert not verdict.complete and drop in verdict.reason


def test_a_save_without_optimizer_state_for_every_rank_is_complete() -> None:
    """checkpoint.save_contents=[model] (no optim, no extra_state) is still a checkpoint."""
    files = {f"actor/model_world_size_{WORLD}_rank_{r}.pt": 5 for r in range(WORLD)}
    files |= {"actor/fsdp_config.json": 2, "actor/huggingface/config.json": 2, "data.pt": 1}
    parts = [{"attempt": "a", "kinds": ["model"], "files": files}]
    assert ck.judge({"attempt": "a", "world_size": WORLD}, parts, _present(parts)).complete


def _model_phase(parts: list[dict]) -> list[dict]:
    """The same parts as a copier records them after its first phase: every kind named, the model's files only."""
    return [{**part, "kinds": ["extra_state", "model", "optim"],
             "files": {n: s for n, s in part["files"].items() if "optim_" not in n and "extra_state_" not in n}}
            for part in parts]


def test_a_step_whose_model_is_copied_but_not_its_optimizer_state_is_exportable_not_resumable() -> None:
    """The copiers record the model first; until the optimizer state of every rank is recorded too, the
    step is model complete (the export's) and never complete (a resume's)."""
    parts = _model_phase(_parts())
    saved = {"attempt": "a", "world_size": WORLD}
    whole = ck.judge(saved, parts, _present(_parts()))
    assert (whole.complete, whole.reason) == (
        False, f"not copied yet: actor/optim_world_size_{WORLD}_rank_0.pt, actor/optim_world_size_{WORLD}_rank_1.pt, "
               f"actor/optim_world_size_{WORLD}_rank_2.pt ...")
    model = ck.judge(saved, parts, _present(_parts()), ck.MODEL)
    assert model.complete and sorted(model.files) == sorted(
        [f"actor/model_world_size_{WORLD}_rank_{r}.pt" for r in range(WORLD)]
        + ["actor/fsdp_config.json", "actor/huggingface/config.json", "data.pt"])


def test_a_file_short_in_the_bucket_keeps_the_save_incomplete() -> None:
    parts = _parts()
    sizes = {**{n: s for n, s in parts[0]["files"].items()}, "data.pt": 0}
    verdict = ck.judge({"attempt": "a", "world_size": WORLD}, parts, sizes.get)
    assert (verdict.complete, verdict.reason) == (False, "data.pt: 0 bytes in the bucket, 1 recorded")


def test_parts_of_another_attempt_never_count_and_nothing_counts_before_verl_is_done() -> None:
    parts = _parts(attempt="old")
    assert not ck.judge({"attempt": "new", "world_size": WORLD}, parts, _present(parts)).complete
    assert ck.judge(None, _parts(), _present(_parts())).reason == "verl has not finished saving it"


# --- the copy, against folders -------------------------------------------------------------------------


def test_a_save_is_complete_once_the_last_node_has_copied_it_and_local_disks_are_emptied(world: dict) -> None:
    lines, log = _logs()
    launch = _start_attempt(world, "a1")
    verl_saves(world["nodes"], world["head"], "a1", 10)
    assert ck.announce(launch, "a1", 0, log) == 10
    ck.copy_once(world["nodes"][0], world["bucket"], "node0", log)
    assert not (world["run"] / "global_step_10" / ck.MARKER).exists()
    assert ck.resume_step(world["run"], WORLD) is None
    ck.copy_once(world["nodes"][1], world["bucket"], "node1", log)
    marker = json.loads((world["run"] / "global_step_10" / ck.MARKER).read_text())
    assert (marker["attempt"], marker["world_size"], len(marker["files"])) == ("a1", WORLD, 3 * WORLD + 3)
    assert (world["run"] / ck.TRACKER).read_text() == "10"
    assert ck.resume_step(world["run"], WORLD) == 10
    assert [p for root in (world["head"], *world["nodes"]) for p in root.rglob("global_step_*")] == []
    assert f"step 10: complete: {3 * WORLD + 3} files" in " ".join(lines)


def test_a_node_copies_nothing_verl_has_not_announced(world: dict) -> None:
    _, log = _logs()
    _start_attempt(world, "a1")
    verl_saves(world["nodes"], world["head"], "a1", 10)  # written, but the head has not seen the tracker move
    ck.copy_once(world["nodes"][0], world["bucket"], "node0", log)
    assert not (world["run"] / "global_step_10").exists()
    assert (world["nodes"][0] / RUN / "a1" / "global_step_10").is_dir()


def test_saves_the_head_missed_announcing_are_announced_at_its_next_look(world: dict) -> None:
    """The bucket stalled while verl saved step 10: at the next look verl is at 20, and both go."""
    _, log = _logs()
    launch = _start_attempt(world, "a1")
    verl_saves(world["nodes"], world["head"], "a1", 10)
    verl_saves(world["nodes"], world["head"], "a1", 20)
    assert ck.announce(launch, "a1", 0, log) == 20
    for i, node in enumerate(world["nodes"]):
        ck.copy_once(node, world["bucket"], f"node{i}", log)
    assert ck.complete_steps(world["run"], WORLD) == [10, 20]


def test_an_earlier_attempts_local_saves_are_dropped_not_copied(world: dict) -> None:
    _, log = _logs()
    verl_saves(world["nodes"], world["head"], "old", 20)
    _start_attempt(world, "new")
    ck.copy_once(world["nodes"][0], world["bucket"], "node0", log)
    assert not (world["nodes"][0] / RUN / "old").exists()
    assert not (world["run"] / "global_step_20").exists()


def _node1_killed_copying_step_20(world: dict, log, copy: str, size: int = 1000) -> Path:
    """Step 10 complete, step 20 saved and copied by node0; node1's copier, a real process, runs with `copy`
    (the source of a `copy(reader, writer, n)` that kills it, SIGKILL, at some line) as shutil's copyfileobj."""
    launch = _start_attempt(world, "a1")
    _save_and_copy(world, launch, "a1", 10, log)
    verl_saves(world["nodes"], world["head"], "a1", 20, size=size)
    ck.announce(launch, "a1", 10, log)
    ck.copy_once(world["nodes"][0], world["bucket"], "node0", log)
    dies = ("import os, signal, sys\n"
            "from workloads import checkpoints as c\n"
            "real = c.shutil.copyfileobj\n"
            f"{copy}"
            "c.shutil.copyfileobj = copy\n"
            "c.copy_once(c.Path(sys.argv[1]), c.Path(sys.argv[2]), 'node1', print)\n")
    done = subprocess.run([sys.executable, "-c", dies, str(world["nodes"][1]), str(world["bucket"])], cwd=REPO,
                          timeout=60, capture_output=True)
    assert done.returncode == -signal.SIGKILL
    return world["run"] / "global_step_20"


def test_a_copier_killed_mid_copy_leaves_no_record_and_its_restart_completes_the_save(world: dict) -> None:
    _, log = _logs()
    # node1's copier dies 1,000 bytes into a file.
    step = _node1_killed_copying_step_20(world, log, size=100_000, copy=(
        "def copy(reader, writer, n):\n"
        "    writer.write(reader.read(1000)); writer.flush(); os.kill(os.getpid(), signal.SIGKILL)\n"))
    assert [p for p in (step / "actor").iterdir() if p.stat().st_size == 1000]  # half-copied files
    assert not (step / ck.STATE_DIR / ck.PARTS_DIR / "node1.json").exists()
    assert not (step / ck.MARKER).exists() and not (step / ck.MODEL_MARKER).exists()
    assert ck.resume_step(world["run"], WORLD) == 10  # the half-copied one is never used
    ck.copy_once(world["nodes"][1], world["bucket"], "node1", log)  # the restarted copier
    assert ck.resume_step(world["run"], WORLD) == 20


def test_a_copier_killed_between_the_model_and_the_optimizer_state_leaves_a_consistent_bucket(world: dict) -> None:
    """node1's copier dies at its first optimizer file: the bucket then holds step 20's model, marked as such
    for the export, and no resumable step 20 (resume and verl's tracker stay at 10). Its restart copies only
    what its record lacks and completes the step."""
    lines, log = _logs()
    step = _node1_killed_copying_step_20(world, log, copy=(
        "def copy(reader, writer, n):\n"
        "    if 'optim_' in reader.name or 'extra_state_' in reader.name: os.kill(os.getpid(), signal.SIGKILL)\n"
        "    real(reader, writer, n)\n"))
    assert json.loads((step / ck.MODEL_MARKER).read_text())["attempt"] == "a1"
    assert not (step / ck.MARKER).exists()
    assert ck.resume_step(world["run"], WORLD) == 10
    assert (world["run"] / ck.TRACKER).read_text() == "10"
    lines.clear()
    ck.copy_once(world["nodes"][1], world["bucket"], "node1", log)  # the restarted copier
    assert "step 20: copied 4 files, 4000 bytes" in " ".join(lines)  # its ranks' optim and extra_state only
    assert ck.resume_step(world["run"], WORLD) == 20
    assert (world["run"] / ck.TRACKER).read_text() == "20"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, NODES - 1), st.booleans()), min_size=1, max_size=2 * NODES + 2))
def test_whatever_order_the_copiers_run_and_fail_in_a_step_is_resumable_only_when_whole(
        events: list[tuple[int, bool]]) -> None:
    """Each event: node i's copier passes once, its optimizer copy failing (the bucket stalled, or the
    pod went) or not. After every event: the model marker exactly when every node's model is recorded,
    the complete marker, the tracker and resume exactly when every node's optimizer state is too."""
    with tempfile.TemporaryDirectory() as tmp:
        world = {"bucket": Path(tmp) / "bucket", "run": Path(tmp) / "bucket" / RUN, "head": Path(tmp) / "head",
                 "nodes": [Path(tmp) / f"node{i}" for i in range(NODES)]}
        world["bucket"].mkdir()
        _, log = _logs()
        launch = _start_attempt(world, "a1")
        _save_and_copy(world, launch, "a1", 10, log)
        verl_saves(world["nodes"], world["head"], "a1", 20)
        ck.announce(launch, "a1", 10, log)
        real, model_in, whole_in = ck.shutil.copyfileobj, set(), set()

        def failing(reader, writer, n):
            if "optim_" in reader.name or "extra_state_" in reader.name:
                raise OSError("the bucket mount stalled")
            real(reader, writer, n)

        for node, fails in events:
            ck.shutil.copyfileobj = failing if fails else real
            try:
                ck.copy_once(world["nodes"][node], world["bucket"], f"node{node}", log)
            except OSError:
                pass
            finally:
                ck.shutil.copyfileobj = real
            model_in.add(node)
            if not fails:
                whole_in.add(node)
            step = world["run"] / "global_step_20"
            model, whole = len(model_in) == NODES, len(whole_in) == NODES
            assert ((step / ck.MODEL_MARKER).exists(), (step / ck.MARKER).exists()) == (model, whole)
            assert ck.resume_step(world["run"], WORLD) == (20 if whole else 10)
            assert (world["run"] / ck.TRACKER).read_text() == ("20" if whole else "10")
            assert export_model.latest_step(world["run"]) == (20 if model else 10)


def test_a_new_attempt_saving_a_step_again_drops_the_earlier_attempts_model_marker(
        world: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attempt a1's step 20 got its model into the bucket, never its optimizer state (node1's bucket writes
    failed); a2 resumes from 10 and saves 20 again: from its announce on the folder's files are a2's, and
    no marker vouches for them until a2's own copies are recorded."""
    _, log = _logs()
    launch = _start_attempt(world, "a1")
    _save_and_copy(world, launch, "a1", 10, log)
    verl_saves(world["nodes"], world["head"], "a1", 20)
    ck.announce(launch, "a1", 10, log)
    ck.copy_once(world["nodes"][0], world["bucket"], "node0", log)
    real = ck.shutil.copyfileobj

    def failing(reader, writer, n):
        if "optim_" in reader.name:
            raise OSError("the bucket mount stalled")
        real(reader, writer, n)

    with monkeypatch.context() as patch:
        patch.setattr(ck.shutil, "copyfileobj", failing)
        with pytest.raises(OSError):
            ck.copy_once(world["nodes"][1], world["bucket"], "node1", log)
    step = world["run"] / "global_step_20"
    assert (step / ck.MODEL_MARKER).exists() and ck.resume_step(world["run"], WORLD) == 10
    second = _start_attempt(world, "a2")
    verl_saves(world["nodes"], world["head"], "a2", 20)
    ck.announce(second, "a2", 10, log)
    assert not (step / ck.MODEL_MARKER).exists()
    for i, node in enumerate(world["nodes"]):
        ck.copy_once(node, world["bucket"], f"node{i}", log)
    assert json.loads((step / ck.MODEL_MARKER).read_text())["attempt"] == "a2"
    assert json.loads((step / ck.MARKER).read_text())["attempt"] == "a2"
    assert ck.resume_step(world["run"], WORLD) == 20


def test_a_marked_checkpoint_whose_file_went_missing_is_not_resumed_from(world: dict) -> None:
    _, log = _logs()
    launch = _start_attempt(world, "a1")
    _save_and_copy(world, launch, "a1", 10, log)
    _save_and_copy(world, launch, "a1", 20, log)
    (world["run"] / "global_step_20" / "actor" / f"model_world_size_{WORLD}_rank_1.pt").unlink()
    assert ck.resume_step(world["run"], WORLD) == 10


def test_only_the_newest_keep_complete_checkpoints_stay_and_older_leftovers_go(world: dict) -> None:
    _, log = _logs()
    launch = _start_attempt(world, "a1", keep=2)
    leftover = world["run"] / "global_step_5" / ck.STATE_DIR
    ck.write_json(leftover / ck.SAVED_FILE, {"attempt": "dead", "world_size": WORLD, "step": 5})
    for step in (10, 20, 30):
        _save_and_copy(world, launch, "a1", step, log)
    assert sorted(p.name for p in world["run"].glob("global_step_*")) == ["global_step_20", "global_step_30"]
    assert (world["run"] / ck.TRACKER).read_text() == "30"


def test_a_checkpoint_verl_wrote_straight_into_the_bucket_is_resumed_from_when_whole(world: dict) -> None:
    """Runs begun before local saves: verl's own tracker names a step it finished writing."""
    step = world["run"] / "global_step_30"
    for name, size in _parts()[0]["files"].items():
        (step / name).parent.mkdir(parents=True, exist_ok=True)
        (step / name).write_bytes(b"x" * size)
    (world["run"] / ck.TRACKER).write_text("30")
    assert ck.resume_step(world["run"], WORLD) == 30
    (step / f"actor/model_world_size_{WORLD}_rank_2.pt").unlink()
    assert ck.resume_step(world["run"], WORLD) is None


# --- the launcher --------------------------------------------------------------------------------------


def _command(run_dir: Path) -> list[str]:
    return ["python3", "-m", "verl.trainer.main_ppo", "trainer.save_freq=10", f"trainer.nnodes={NODES}",
            f"trainer.n_gpus_per_node={GPUS}", f"trainer.default_local_dir={run_dir}", "trainer.max_actor_ckpt_to_keep=2",
            "trainer.resume_mode=auto"]


def test_a_first_attempt_starts_from_scratch_and_saves_to_local_disk(world: dict) -> None:
    plan = ck.plan_launch(_command(world["run"]), "a1", Path("/local-checkpoints"))
    assert plan.command == [
        "python3", "-m", "verl.trainer.main_ppo", "trainer.save_freq=10", f"trainer.nnodes={NODES}",
        f"trainer.n_gpus_per_node={GPUS}", f"trainer.default_local_dir=/local-checkpoints/{RUN}/a1",
        "trainer.resume_mode=disable", "trainer.max_actor_ckpt_to_keep=null", "trainer.max_critic_ckpt_to_keep=null",
        "trainer.del_local_ckpt_after_load=False"]
    assert (plan.world_size, plan.resume_from) == (WORLD, None)


def test_a_later_attempt_resumes_from_the_newest_complete_checkpoint_in_the_bucket(world: dict) -> None:
    _, log = _logs()
    launch = _start_attempt(world, "a1")
    _save_and_copy(world, launch, "a1", 10, log)
    verl_saves(world["nodes"], world["head"], "a1", 20)
    ck.announce(launch, "a1", 10, log)  # step 20 announced, never copied by the nodes: preempted
    plan = ck.plan_launch(_command(world["run"]), "a2", Path("/local-checkpoints"))
    assert plan.command[-3:] == ["trainer.max_critic_ckpt_to_keep=null", "trainer.del_local_ckpt_after_load=False",
                                 f"trainer.resume_from_path={world['run']}/global_step_10"]
    assert "trainer.resume_mode=resume_path" in plan.command and plan.resume_from == 10


def test_a_command_without_the_checkpoint_folder_is_refused(world: dict) -> None:
    with pytest.raises(ck.CheckpointError, match="trainer.default_local_dir"):
        ck.plan_launch(["python3", "-m", "verl.trainer.main_ppo", "trainer.nnodes=2"], "a1", Path("/l"))


FAKE_VERL = (
    "import sys, pathlib\n"
    "args = dict(a.split('=', 1) for a in sys.argv[1:])\n"
    "local = pathlib.Path(args['trainer.default_local_dir'])\n"
    "(local / 'global_step_10').mkdir(parents=True)\n"
    "(local / 'global_step_10' / 'data.pt').write_bytes(b'd')\n"
    "(local / 'latest_checkpointed_iteration.txt').write_text('10')\n"
)


def _launch_with_fake_verl(world: dict, *, copy_nodes: bool, copying: list[Callable[[], None]] | None = None) -> int:
    """launch() with a stand-in for verl: it saves step 10 on the head; the nodes' shards appear as the
    announce makes them wanted, and a copier per node (a thread) stands in for the sidecars when
    `copy_nodes`. They go on after launch() returned when `copying` is given: it gets the call that ends them."""
    stop, saved = threading.Event(), threading.Event()

    def node(i: int) -> None:
        while not stop.wait(0.05):
            attempt = (ck.read_json(world["run"] / ck.STATE_DIR / ck.ATTEMPT_FILE) or {}).get("attempt")
            if i == 0 and attempt and not saved.is_set():
                verl_saves(world["nodes"], world["head"] / "unused", attempt, 10)
                saved.set()
            if copy_nodes and saved.is_set():
                ck.copy_once(world["nodes"][i], world["bucket"], f"node{i}", lambda m: None)

    threads = [threading.Thread(target=node, args=(i,), daemon=True) for i in range(NODES)]
    for thread in threads:
        thread.start()

    def end() -> None:
        stop.set()
        for thread in threads:
            thread.join()

    try:
        return ck.launch([sys.executable, "-c", FAKE_VERL, *_command(world["run"])[3:]], world["head"],
                         poll_s=0.05, final_wait_s=1)
    finally:
        if copying is None:
            end()
        else:
            copying.append(end)


def test_a_run_succeeds_only_once_its_last_model_is_in_the_bucket(world: dict) -> None:
    assert _launch_with_fake_verl(world, copy_nodes=True) == 0
    assert json.loads((world["run"] / "global_step_10" / ck.MODEL_MARKER).read_text())["step"] == 10


def test_a_run_whose_last_model_never_reaches_the_bucket_fails_after_the_deadline(world: dict,
                                                                                 capsys: pytest.CaptureFixture) -> None:
    assert _launch_with_fake_verl(world, copy_nodes=False) == 1
    assert "step 10: the model is still not in the bucket after 1 s (not copied yet: " \
           "actor/model_world_size_4_rank_0.pt" in capsys.readouterr().out


def test_a_run_succeeds_once_its_last_model_is_in_the_bucket_while_its_optimizer_state_still_copies(
        world: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """The GPUs wait for the last save's model only (what the export reads); the copiers finish its
    optimizer state in the background, and only then is the step resumable."""
    optimizer_may_go, copying = threading.Event(), []
    real = ck.shutil.copyfileobj

    def copy(reader, writer, n):
        if "optim_" in reader.name or "extra_state_" in reader.name:
            assert optimizer_may_go.wait(30)
        real(reader, writer, n)

    monkeypatch.setattr(ck.shutil, "copyfileobj", copy)
    try:
        assert _launch_with_fake_verl(world, copy_nodes=True, copying=copying) == 0
        step = world["run"] / "global_step_10"
        assert (step / ck.MODEL_MARKER).exists() and not (step / ck.MARKER).exists()
        assert ck.resume_step(world["run"], WORLD) is None
        assert "step 10: the model is in the bucket; its optimizer state goes on copying" in capsys.readouterr().out
        optimizer_may_go.set()
        for _ in range(600):
            if ck.resume_step(world["run"], WORLD) == 10:
                break
            threading.Event().wait(0.05)
        assert ck.resume_step(world["run"], WORLD) == 10
    finally:
        optimizer_may_go.set()
        for end in copying:
            end()


def test_the_program_ships_alone() -> None:
    """It runs from a ConfigMap as a lone file: standard library only, no package imports."""
    source = (REPO / "workloads" / "checkpoints.py").read_text()
    assert "from workloads" not in source and "import workloads" not in source
    out = subprocess.run([sys.executable, "-S", "-c", "import runpy, sys; sys.argv=['x', '--help'];"
                          f"runpy.run_path({str(REPO / 'workloads' / 'checkpoints.py')!r}, run_name='__main__')"],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": ""})
    assert out.returncode == 0 and "launch" in out.stdout


# --- an earlier attempt's copier, still at work when a later attempt starts ----------------------------


def _stamp(world: dict, attempt: str, step: int, byte: int, roots: list[Path] | None = None) -> None:
    """Give `attempt`'s local files of `step` content of its own (same sizes): two attempts train apart."""
    for root in roots or [*world["nodes"], world["head"]]:
        for f in (root / RUN / attempt / f"global_step_{step}").rglob("*.pt"):
            f.write_bytes(bytes([byte]) * f.stat().st_size)


def _30_copied_by_node0_only(world: dict, launch: ck.Launch, log) -> None:
    """a1: steps 10 and 20 complete; 30 saved, announced, and copied by node0 only."""
    for step in (10, 20):
        _save_and_copy(world, launch, "a1", step, log)
    verl_saves(world["nodes"], world["head"], "a1", 30)
    ck.announce(launch, "a1", 20, log)
    ck.copy_once(world["nodes"][0], world["bucket"], "node0", log)


def _copy_all(world: dict, log) -> None:
    for i, node in enumerate(world["nodes"]):
        ck.copy_once(node, world["bucket"], f"node{i}", log)


def _origin(world: dict, step: int) -> dict[int, int]:
    """Which attempt's bytes each rank's model shard in the bucket holds."""
    folder = world["run"] / f"global_step_{step}" / "actor"
    return {r: (folder / f"model_world_size_{WORLD}_rank_{r}.pt").read_bytes()[0] for r in range(WORLD)}


def _a1_completes_30_after_a2_planned(world: dict, log, keep: int = 2) -> ck.Launch:
    """a1: 10 and 20 complete, 30 announced and copied by node0; node1's copier is mid-pass over 30 when a1
    ends and its retry a2 starts: a2 plans (30 is not complete yet: it resumes from 20) and records itself.
    node1's pass then completes 30 with a1's records. Returns a2's plan."""
    launch = _start_attempt(world, "a1", keep=keep)
    for step in (10, 20):
        _save_and_copy(world, launch, "a1", step, log)
    verl_saves(world["nodes"], world["head"], "a1", 30)
    _stamp(world, "a1", 30, 0xA1)
    ck.announce(launch, "a1", 20, log)
    ck.copy_once(world["nodes"][0], world["bucket"], "node0", log)
    real, plans = ck.shutil.copyfileobj, []

    def copy(reader, writer, n):
        if not plans:
            plans.append(ck.plan_launch(_command(world["run"]), "a2", world["head"]))
            ck.record_attempt(plans[0], "a2", keep)
        real(reader, writer, n)

    ck.shutil.copyfileobj = copy
    try:
        ck.copy_once(world["nodes"][1], world["bucket"], "node1", log)
    finally:
        ck.shutil.copyfileobj = real
    assert plans[0].resume_from == 20
    assert json.loads((world["run"] / "global_step_30" / ck.MARKER).read_text())["attempt"] == "a1"
    return plans[0]


def test_a_step_saved_again_is_resumed_from_only_once_its_current_attempt_completes_it(world: dict) -> None:
    """a2 saves 30 again; node0 copies a2's 30, node1 not yet: the folder holds shards of both attempts and
    a1's complete marker is gone with a2's announce. Resume takes 20 until a2's own copies complete 30."""
    _, log = _logs()
    a2 = _a1_completes_30_after_a2_planned(world, log)
    verl_saves(world["nodes"], world["head"], "a2", 30)
    _stamp(world, "a2", 30, 0xA2)
    ck.announce(a2, "a2", 20, log)
    ck.copy_once(world["nodes"][0], world["bucket"], "node0", log)
    assert _origin(world, 30) == {0: 0xA2, 1: 0xA2, 2: 0xA1, 3: 0xA1}
    assert not (world["run"] / "global_step_30" / ck.MARKER).exists()
    assert ck.resume_step(world["run"], WORLD) == 20
    ck.copy_once(world["nodes"][1], world["bucket"], "node1", log)
    assert _origin(world, 30) == {r: 0xA2 for r in range(WORLD)}
    assert json.loads((world["run"] / "global_step_30" / ck.MARKER).read_text())["attempt"] == "a2"
    assert ck.resume_step(world["run"], WORLD) == 30


def test_a_complete_marker_of_an_earlier_attempt_never_counts_for_the_step_saved_again(world: dict) -> None:
    """An a1 marker left in the folder (written after a2's announce by a1's lingering copier) vouches for
    nothing: the launcher waits for a2's own model, the export and resume pass the step over."""
    _, log = _logs()
    a2 = _a1_completes_30_after_a2_planned(world, log)
    step = world["run"] / "global_step_30"
    markers = {name: (step / name).read_text() for name in (ck.MODEL_MARKER, ck.MARKER)}
    verl_saves(world["nodes"], world["head"], "a2", 30)
    ck.announce(a2, "a2", 20, log)
    for name, text in markers.items():
        (step / name).write_text(text)
    assert not ck.wait_model(world["run"], 30, deadline_s=0.1, poll_s=0.05, log=log)
    assert (ck.try_complete(world["run"], 30, log), ck.complete_steps(world["run"], WORLD)) == (None, [20])
    assert (export_model.model_steps(world["run"]), export_model.latest_step(world["run"])) == ([20], 20)


def test_a_late_completion_by_an_earlier_attempt_never_rotates_away_what_the_current_one_resumed_from(
        world: dict) -> None:
    """keep=1: a1's late completion of 30 makes 20 the one beyond the newest keep, but a2 is loading it."""
    lines, log = _logs()
    _a1_completes_30_after_a2_planned(world, log, keep=1)
    assert sorted(p.name for p in world["run"].glob("global_step_*")) == ["global_step_20", "global_step_30"]
    assert json.loads((world["run"] / ck.STATE_DIR / ck.ATTEMPT_FILE).read_text())["resume_from"] == 20
    assert [line for line in lines if "deleted" in line] == ["step 10: deleted (older than the newest 1)"]


def test_a_marker_the_announce_cannot_read_is_dropped(world: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """a1's 30 is model complete only; a2 saves 30 again and its announce's read of that marker fails (EIO):
    the marker goes all the same, so neither the launcher nor the export takes it for a2's files."""
    _, log = _logs()
    launch = _start_attempt(world, "a1")
    _save_and_copy(world, launch, "a1", 10, log)
    verl_saves(world["nodes"], world["head"], "a1", 30, kinds=("model",))
    ck.announce(launch, "a1", 10, log)
    _copy_all(world, log)
    step = world["run"] / "global_step_30"
    (step / ck.MARKER).unlink()  # as if its optimizer copy had been cut: model complete only
    a2 = _start_attempt(world, "a2")
    verl_saves(world["nodes"], world["head"], "a2", 30)
    real = Path.read_text

    def eio(path: Path, *args, **kwargs) -> str:
        if path.name == ck.MODEL_MARKER:
            raise OSError(5, "Input/output error")
        return real(path, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(Path, "read_text", eio)
        ck.announce(a2, "a2", 10, log)
    assert not (step / ck.MODEL_MARKER).exists()
    assert not ck.wait_model(world["run"], 30, deadline_s=0.1, poll_s=0.05, log=log)
    assert export_model.model_steps(world["run"]) == [10]


def a1_write_in_flight_past_a2s_copy_of_30(world: dict, monkeypatch: pytest.MonkeyPatch, log,
                                           before_it_lands: Callable[[], None] = lambda: None) -> list[str]:
    """a1's node1 copier (one stream) is writing its first file of 30 when a2 saves, copies and completes 30
    (node1's ranks on another pod, node1b); then (`before_it_lands`) the write lands and the copier goes on.
    Returns the local file whose write was in flight."""
    launch = _start_attempt(world, "a1")
    verl_saves(world["nodes"], world["head"], "a1", 30)
    _stamp(world, "a1", 30, 0xA1)
    ck.announce(launch, "a1", 0, log)
    node1b = world["nodes"][0].parent / "node1b"
    real, fired = ck.shutil.copyfileobj, []

    def copy(reader, writer, n):
        if not fired:
            fired.append(reader.name)
            a2 = _start_attempt(world, "a2")
            verl_saves([world["nodes"][0], node1b], world["head"], "a2", 30)
            _stamp(world, "a2", 30, 0xA2, [world["nodes"][0], node1b, world["head"]])
            ck.announce(a2, "a2", 0, log)
            ck.copy_once(world["nodes"][0], world["bucket"], "node0", log)
            ck.copy_once(node1b, world["bucket"], "node1b", log)
            before_it_lands()
        real(reader, writer, n)

    monkeypatch.setattr(ck, "COPY_STREAMS", 1)
    monkeypatch.setattr(ck.shutil, "copyfileobj", copy)
    ck.copy_once(world["nodes"][1], world["bucket"], "node1", log)
    return fired


def test_a_copier_of_an_earlier_attempt_stops_at_the_next_file_once_a_later_attempt_saved_the_step(
        world: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """The write in flight lands, then the copier stops; no other a1 file and no a1 record reach the folder
    (what the late write does to a2's markers: tests/test_checkpoint_generations.py)."""
    lines, log = _logs()
    fired = a1_write_in_flight_past_a2s_copy_of_30(world, monkeypatch, log)
    step = world["run"] / "global_step_30"
    assert fired[0].endswith(f"actor/model_world_size_{WORLD}_rank_2.pt")
    assert _origin(world, 30) == {0: 0xA2, 1: 0xA2, 2: 0xA1, 3: 0xA2}
    assert {(step / f"actor/{kind}_world_size_{WORLD}_rank_3.pt").read_bytes()[0]
            for kind in ("optim", "extra_state")} == {0xA2}
    assert not (step / ck.STATE_DIR / ck.PARTS_DIR / "node1.json").exists()
    assert "step 30: saved again by another attempt; node1 stops copying attempt a1's files" in lines


def test_rotation_deletes_nothing_while_the_bucket_does_not_answer_for_a_step(
        world: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """keep=3; when 30 completes, one stat of a step-20 file fails (EIO): 20 is not known incomplete, so
    rotation leaves everything; the next completion rotates as usual."""
    lines, log = _logs()
    launch = _start_attempt(world, "a1", keep=3)
    _30_copied_by_node0_only(world, launch, log)
    real = Path.stat

    def eio(path: Path, *args, **kwargs):
        if path.parent.parent.name == "global_step_20" and path.name.endswith("rank_3.pt"):
            raise OSError(5, "Input/output error")
        return real(path, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(Path, "stat", eio)
        ck.copy_once(world["nodes"][1], world["bucket"], "node1", log)
    assert sorted(p.name for p in world["run"].glob("global_step_*")) == [
        "global_step_10", "global_step_20", "global_step_30"]
    assert "rotation skipped: the bucket did not answer for step 20" in lines
    assert ck.complete_steps(world["run"], WORLD) == [10, 20, 30]


# --- the launcher's last save, through a stalled bucket ---------------------------------------------------


def _stall_saved_json(monkeypatch: pytest.MonkeyPatch, times: int) -> None:
    """The bucket mount stalls on the first `times` writes of a saved.json."""
    real, failed = ck.write_json, []

    def stalled(path: Path, data: dict) -> None:
        if path.name == ck.SAVED_FILE and len(failed) < times:
            failed.append(path)
            raise OSError(5, "Input/output error")
        real(path, data)

    monkeypatch.setattr(ck, "write_json", stalled)


def test_a_run_whose_last_save_is_never_announced_fails(world: dict, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture) -> None:
    _stall_saved_json(monkeypatch, times=10**6)
    code = ck.launch([sys.executable, "-c", FAKE_VERL, *_command(world["run"])[3:]], world["head"],
                     poll_s=0.05, final_wait_s=0.3)
    assert code == 1
    assert "step 10: verl's last save is still not announced after 0 s ([Errno 5] Input/output error)" \
        in capsys.readouterr().out


def test_the_launcher_announces_verls_last_save_again_and_waits_for_it_not_an_earlier_one(
        world: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """20 was announced and copied during the run; 30, verl's last, meets a stalled bucket at the first two
    tries after verl's exit: the launcher tries again and succeeds once 30's model is in the bucket."""
    lines, log = _logs()
    launch = _start_attempt(world, "a1")
    _save_and_copy(world, launch, "a1", 20, log)
    verl_saves(world["nodes"], world["head"], "a1", 30)
    _stall_saved_json(monkeypatch, times=2)
    stop = threading.Event()

    def copiers() -> None:
        while not stop.wait(0.02):
            _copy_all(world, log)

    copier = threading.Thread(target=copiers)
    copier.start()
    try:
        assert ck.finish(launch, "a1", 20, deadline_s=30, poll_s=0.05, log=log)
    finally:
        stop.set()
        copier.join()
    assert (world["run"] / "global_step_30" / ck.MODEL_MARKER).exists()
    assert [line.split(";")[0] for line in lines if "announcing" in line] == [
        "step 30: announcing verl's last save failed ([Errno 5] Input/output error)"] * 2


# --- verl's trainer on a GPU worker ---------------------------------------------------------------------
# verl runs its trainer as a Ray actor that needs a CPU to be scheduled (`@ray.remote class TaskRunnerV1`,
# verl/trainer/main_ppo.py in 0.9.0): A4X's head takes no Ray CPUs, so it runs on a GPU worker, and that
# node's disk gets data.pt and verl's tracker, not the head's.


def _finish_while_copiers_pass(world: dict, launch: ck.Launch, announced: int, log) -> bool:
    """The launcher's finish (10 s deadline) while every node's copier makes passes, as copy_forever does."""
    done: list[bool] = []
    waiting = threading.Thread(target=lambda: done.append(ck.finish(launch, "a1", announced, 10.0, 0.05, log)))
    waiting.start()
    while waiting.is_alive():
        _copy_all(world, log)
        waiting.join(0.1)
    return done == [True]


def test_saves_of_a_trainer_on_a_gpu_worker_are_announced_by_its_copier_and_resumed_from(world: dict) -> None:
    _, log = _logs()
    launch = _start_attempt(world, "a1")
    verl_saves(world["nodes"], world["nodes"][0], "a1", 10)  # the trainer ran on node0
    assert ck.announce(launch, "a1", 0, log) == 0  # the head has no tracker: it announces nothing
    _copy_all(world, log)
    assert ck.resume_step(world["run"], WORLD) == 10
    assert (world["run"] / "global_step_10" / "data.pt").read_bytes() == b"d" * 10


def test_the_launcher_waits_for_the_last_save_of_a_trainer_on_a_gpu_worker(world: dict) -> None:
    _, log = _logs()
    _start_attempt(world, "a1")
    launch = ck.Launch(["trainer.save_freq=10", f"trainer.nnodes={NODES}"], world["run"], world["head"] / RUN / "a1",
                       WORLD, None)
    verl_saves(world["nodes"], world["nodes"][0], "a1", 10)
    _copy_all(world, log)
    verl_saves(world["nodes"], world["nodes"][0], "a1", 20)  # the last save; then verl exits 0
    _copy_all(world, log)  # a pass before the exit: its report names step 20 but not this exit
    assert not ck.finish(launch, "a1", 0, deadline_s=0.3, poll_s=0.05, log=log)  # no copier pass since: unknown
    assert _finish_while_copiers_pass(world, launch, 0, log)
    assert (world["run"] / "global_step_20" / ck.MODEL_MARKER).exists()


def test_an_attempt_in_which_verl_saved_nothing_ends_once_every_copier_said_so(world: dict) -> None:
    """A retry that resumed from the last step: verl ends at once and saves nothing; no node has a tracker."""
    _, log = _logs()
    _start_attempt(world, "a1")
    for node in world["nodes"]:
        node.mkdir(parents=True)
    launch = ck.Launch(["trainer.save_freq=10", f"trainer.nnodes={NODES}"], world["run"], world["head"] / RUN / "a1",
                       WORLD, 60)
    assert _finish_while_copiers_pass(world, launch, 60, log)


def test_a_run_that_saves_nothing_waits_for_nothing(world: dict) -> None:
    _, log = _logs()
    _start_attempt(world, "a1")
    launch = ck.Launch(["trainer.save_freq=-1"], world["run"], world["head"] / RUN / "a1", WORLD, None)
    assert ck.finish(launch, "a1", 0, deadline_s=0.0, poll_s=0.05, log=log)


# --- a bucket that does not answer, and rotation racing a new attempt (a second fault review) -------------


class Killed(BaseException):
    """The process dies here (no handler runs)."""


def _eio_on(monkeypatch: pytest.MonkeyPatch, match: Callable[[Path], bool], once: bool = False) -> None:
    real, failed = Path.read_text, []

    def read_text(path: Path, *args, **kwargs) -> str:
        if match(path) and not (once and failed):
            failed.append(path)
            raise OSError(5, "Input/output error")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)


def test_a_new_attempt_never_resumes_from_an_older_step_because_one_read_failed(
        world: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    _, log = _logs()
    launch = _start_attempt(world, "a1")
    for step in (10, 20):
        _save_and_copy(world, launch, "a1", step, log)
    _eio_on(monkeypatch, lambda p: p.name == ck.MARKER and p.parent.name == "global_step_20")
    with pytest.raises(OSError, match="the bucket did not answer for step 20"):
        ck.plan_launch(_command(world["run"]), "a2", world["head"])  # the attempt fails; its retry reads again


def test_the_step_a_new_attempt_resumes_from_is_still_there_once_recorded(
        world: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """keep=1: a1's last copier completes 30 (and rotates 20 away) between a2's plan (resume from 20) and
    its record: a2 plans again and resumes from 30."""
    _, log = _logs()
    a1 = _start_attempt(world, "a1", keep=1)
    _30_copied_by_node0_only(world, a1, log)
    real, planned = ck.record_attempt, []

    def late_copier_then_record(plan: ck.Launch, attempt: str, keep: int | None) -> None:
        planned.append(plan.resume_from)
        if len(planned) == 1:
            ck.copy_once(world["nodes"][1], world["bucket"], "node1", log)
        real(plan, attempt, keep)

    monkeypatch.setattr(ck, "record_attempt", late_copier_then_record)
    check = ("import sys, pathlib\nargs = dict(a.split('=', 1) for a in sys.argv[1:])\n"
             "p = args.get('trainer.resume_from_path')\n"
             "sys.exit(0 if p and (pathlib.Path(p) / '.verl-gke-complete.json').is_file() else 3)\n")
    code = ck.launch([sys.executable, "-c", check, *_command(world["run"])[3:], "trainer.save_freq=-1"],
                     world["head"], poll_s=0.05, final_wait_s=1)  # saves nothing: no copier to wait for
    assert (planned, code) == ([20, 30], 0)


def test_a_copier_restarted_mid_cleanup_keeps_what_its_record_says_is_in_the_bucket(
        world: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    _, log = _logs()
    launch = _start_attempt(world, "a1")
    verl_saves(world["nodes"], world["head"], "a1", 10)
    ck.announce(launch, "a1", 0, log)

    def dies_mid_rmtree(path: Path, ignore_errors: bool = False) -> None:
        (Path(path) / f"actor/model_world_size_{WORLD}_rank_0.pt").unlink()
        raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(ck.shutil, "rmtree", dies_mid_rmtree)
        with pytest.raises(Killed):
            ck.copy_once(world["nodes"][0], world["bucket"], "node0", log)
    with monkeypatch.context() as patch:
        _eio_on(patch, lambda p: p.name == "node0.json", once=True)
        with pytest.raises(OSError):  # an unreadable record fails the pass (copy_forever retries it)
            ck.copy_once(world["nodes"][0], world["bucket"], "node0", log)
    ck.copy_once(world["nodes"][0], world["bucket"], "node0", log)
    ck.copy_once(world["nodes"][1], world["bucket"], "node1", log)
    step = world["run"] / "global_step_10"
    recorded = json.loads((step / ck.STATE_DIR / ck.PARTS_DIR / "node0.json").read_text())["files"]
    assert f"actor/model_world_size_{WORLD}_rank_0.pt" in recorded and (step / ck.MARKER).exists()
