"""Checkpoints that never stall the GPUs: verl saves to each node's local disk, and this program copies
each save to the bucket in the background and decides when a copy is complete.

`checkpoints.py launch -- <verl's command>` is the job's entrypoint: it records the attempt, picks the
newest COMPLETE checkpoint to resume from, runs verl, and after success waits for the last save's model
to reach the bucket. `checkpoints.py copy` is every GPU worker's sidecar: it copies its node's share of
each announced save, the model first, then what only a resume reads. The bucket holds the only state
(markers under `.verl-gke/`); a marker counts only for the attempt, and with BUCKET_ENV the GCS
generations, that wrote it. The protocol and its layout: docs/checkpoints-and-a4x.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUCKET_ENV = "VERL_GKE_BUCKET"
"""The bucket's name in every Ray pod's environment (the launcher's and the copier's): markers rest on its
object generations (use_bucket). Unset: sizes only."""
LOCAL_ROOT = "/local-checkpoints"
"""Where verl writes on every Ray pod: an emptyDir on the node's ephemeral storage (Local SSD on A4/A3 Ultra)."""
STATE_DIR = ".verl-gke"
ATTEMPT_FILE = "attempt.json"
SAVED_FILE = "saved.json"
PARTS_DIR = "parts"
MARKER = ".verl-gke-complete.json"
MODEL_MARKER = ".verl-gke-model-complete.json"
"""Read by workloads/export_model.py (which ships alone: it names it again)."""
MODEL, COMPLETE = "model complete", "complete"
"""The two levels of a step in the bucket: what the export needs, and what a resume needs."""
TRACKER = "latest_checkpointed_iteration.txt"
"""verl's record of its newest checkpoint (verl/utils/checkpoint/checkpoint_manager.py, 0.6.1 and 0.9.0)."""
HEAD_PART = "head"
EXITED_FILE = "exited.json"
"""<run>/.verl-gke/exited.json: verl exited 0 (the attempt, a nonce): a copier's report that echoes the
nonce was written after it, so its tracker step is verl's last save."""
TRAINERS_DIR = "trainers"
"""<run>/.verl-gke/trainers/<pod>.json: the tracker of a node where verl's trainer runs."""
POLL_S = 5.0
FINAL_WAIT_S = 1800.0
"""How long a succeeded run goes on announcing its last save (while the bucket stalls) and waits for its model
to be in the bucket: ~65 GB per node at the
bucket's 2-5 GB/s per node takes under a minute; a copier that makes no progress for this long has
failed, and the attempt fails with it (the supervisor's retry resumes from the last complete one)."""
_CHUNK = 8 << 20
COPY_STREAMS = 8
"""Files copied at once per pod: verl's ranks wrote them in parallel too (8 per A4 / A3 Ultra node)."""
_STEP = re.compile(r"global_step_(\d+)")
_RANK_FILE = re.compile(r"actor/(model|optim|extra_state)_world_size_(\d+)_rank_(\d+)\.pt")
RESUME_ONLY = ("optim", "extra_state")
"""Kinds of rank files only a resume reads (verl's optimizer state; its scheduler and RNG state): copied
after the model."""
MODEL_FILES = ("actor/fsdp_config.json", "actor/huggingface/config.json")
"""Rank 0's files verl's model merger reads besides the shards (verl writes both on every save, 0.6.1 and
0.9.0: fsdp_checkpoint_manager.py)."""


GENERATIONS: Callable[[Path], dict[str, int]] | None = None
"""Every object's GCS generation under a step folder (path under it -> generation), read through GCS's JSON
API (use_bucket); None: no bucket named, sizes only. A generation is GCS's own: every write of an object makes a
new one, so a marker naming them vouches for exact bytes, and a late write of the same size is seen."""


class CheckpointError(Exception):
    """Something this program cannot go on with; `str()` says what, on one line."""


class Superseded(CheckpointError):
    """A later attempt saved the step again (its saved.json names another attempt): the files are no longer ours."""


# --- the rules (pure) -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    complete: bool
    """The records reach the level judged."""
    reason: str
    files: dict[str, int]
    """The files that level needs (path under the step folder -> bytes), when reached."""
    generations: dict[str, int] = dataclasses.field(default_factory=dict)
    """Their GCS generations as the copiers recorded them (those recorded: none without a bucket)."""


def resume_only(name: str) -> bool:
    """A file of a step (path under its folder) that only a resume reads."""
    m = _RANK_FILE.fullmatch(name)
    return m is not None and m.group(1) in RESUME_ONLY


def judge(saved: dict[str, Any] | None, parts: Sequence[dict[str, Any]],
          size_of: Callable[[str], int | None], level: str = COMPLETE) -> Verdict:
    """Whether one step's records reach `level` (MODEL or COMPLETE); `size_of` gives a file's bytes in the
    bucket (None: absent). The verdict's files are those the level needs."""
    if saved is None:
        return Verdict(False, "verl has not finished saving it", {})
    attempt, world = saved.get("attempt"), saved.get("world_size")
    if not isinstance(world, int) or world < 1:
        return Verdict(False, f"saved.json has no world size ({world!r})", {})
    files: dict[str, int] = {}
    generations: dict[str, int] = {}
    kinds: set[str] = set()
    for part in parts:
        if part.get("attempt") == attempt:
            files.update(part.get("files", {}))
            generations.update(part.get("generations", {}))
            kinds.update(part.get("kinds", []))
    ranks: dict[str, set[int]] = {}
    for name in files:
        m = _RANK_FILE.fullmatch(name)
        if m and int(m.group(2)) == world:
            ranks.setdefault(m.group(1), set()).add(int(m.group(3)))
    # A kind verl saved is named by the copiers' records; files alone name it where no copier recorded kinds
    # (a checkpoint verl wrote straight into the bucket).
    needed = ["model"] + ([k for k in RESUME_ONLY if k in kinds or k in ranks] if level == COMPLETE else [])
    everyone = set(range(world))
    missing = [f"actor/{kind}_world_size_{world}_rank_{r}.pt"
               for kind in needed for r in sorted(everyone - ranks.get(kind, set()))]
    missing += [name for name in (*MODEL_FILES, *(["data.pt"] if level == COMPLETE else [])) if name not in files]
    if missing:
        return Verdict(False, f"not copied yet: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}", {})
    if level == MODEL:
        files = {name: size for name, size in files.items() if not resume_only(name)}
    for name, size in sorted(files.items()):
        actual = size_of(name)
        if actual != size:
            return Verdict(False, f"{name}: {actual} bytes in the bucket, {size} recorded", {})
    return Verdict(True, f"{level}: {len(files)} files, {sum(files.values())} bytes, world size {world}", files,
                   {name: generations[name] for name in files if isinstance(generations.get(name), int)})


def step_of(name: str) -> int | None:
    m = _STEP.fullmatch(name)
    return int(m.group(1)) if m else None


# --- the bucket (a mounted folder) --------------------------------------------------------------------


def read_record(path: Path) -> dict[str, Any] | None:
    """The JSON object at `path`, None when absent or not a record (a record half-written by a dead writer is
    never there: every record is written whole and renamed into place); OSError when the bucket does not
    answer, for the caller not to take it for an answer."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object at `path`, None when absent or unreadable."""
    try:
        return read_record(path)
    except OSError:
        return None


def vouches(marker: dict[str, Any] | None, saved: dict[str, Any] | None) -> bool:
    """A marker counts only for the step's current attempt (its saved.json's): the folder's files are that
    attempt's from its announce on, whatever an earlier attempt's marker says."""
    return marker is not None and saved is not None and marker.get("attempt") is not None \
        and marker.get("attempt") == saved.get("attempt")


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _size_in(root: Path) -> Callable[[str], int | None]:
    def size_of(name: str) -> int | None:
        try:
            return (root / name).stat().st_size
        except FileNotFoundError:  # any other error: the bucket did not answer, which is not "absent"
            return None
    return size_of


def step_records(step_dir: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    state = step_dir / STATE_DIR
    parts = [p for f in sorted((state / PARTS_DIR).glob("*.json")) if (p := read_record(f)) is not None]
    return read_record(state / SAVED_FILE), parts


def is_complete(step_dir: Path, world_size: int) -> bool:
    """Whether the step's complete marker is its current attempt's, names `world_size`, and every file it
    lists is in the bucket at its size. OSError when the bucket does not answer."""
    marker = read_record(step_dir / MARKER)
    if marker is None or marker.get("world_size") != world_size:
        return False
    if not vouches(marker, read_record(step_dir / STATE_DIR / SAVED_FILE)):
        return False
    size_of = _size_in(step_dir)
    if not all(size_of(name) == size for name, size in marker.get("files", {}).items()):
        return False
    return generations_hold(step_dir, marker)


def generations_hold(step_dir: Path, marker: dict[str, Any]) -> bool:
    """Every file the marker names a generation for is still that generation (no bucket named, or a marker
    from before generations were recorded: sizes alone, as before)."""
    named = marker.get("generations") or {}
    if GENERATIONS is None or not named:
        return True
    now = GENERATIONS(step_dir)
    return all(now.get(name) == generation for name, generation in named.items())


def step_states(run_dir: Path, world_size: int) -> dict[int, bool | None]:
    """Each step folder's completeness (is_complete); None where the bucket did not answer."""
    states: dict[int, bool | None] = {}
    for step_dir in run_dir.glob("global_step_*"):
        if (step := step_of(step_dir.name)) is not None:
            try:
                states[step] = is_complete(step_dir, world_size)
            except OSError:
                states[step] = None
    return states


def complete_steps(run_dir: Path, world_size: int) -> list[int]:
    """Steps known to be complete (is_complete), ascending."""
    return sorted(step for step, complete in step_states(run_dir, world_size).items() if complete)


def legacy_step(run_dir: Path, world_size: int) -> int | None:
    """A checkpoint verl wrote straight into the bucket (verl-gke before local saves): verl writes its
    tracker only after every rank saved, so the step it names is whole if its files are there."""
    try:
        step = int((run_dir / TRACKER).read_text().strip())
    except (OSError, ValueError):
        return None
    step_dir = run_dir / f"global_step_{step}"
    if (step_dir / STATE_DIR).exists() or (step_dir / MARKER).exists():
        return None
    names = [p.relative_to(step_dir).as_posix() for p in step_dir.rglob("*") if p.is_file()]
    sizes = _size_in(step_dir)
    try:
        fake = {"attempt": "legacy", "files": {n: sizes(n) for n in names}}
        verdict = judge({"attempt": "legacy", "world_size": world_size}, [fake], sizes)
    except OSError:
        return None
    return step if verdict.complete else None


def resume_step(run_dir: Path, world_size: int) -> int | None:
    """Where a new attempt resumes: the newest complete checkpoint of this world size, or None. OSError when
    the bucket did not answer for a step: an older one is never taken for the newest."""
    states = step_states(run_dir, world_size)
    if None in states.values():
        unknown = sorted(step for step, state in states.items() if state is None)
        raise OSError(f"the bucket did not answer for step {unknown[0]}: where to resume is unknown")
    steps = sorted(step for step, complete in states.items() if complete)
    legacy = legacy_step(run_dir, world_size)
    candidates = steps + ([legacy] if legacy is not None else [])
    return max(candidates) if candidates else None


def try_complete(run_dir: Path, step: int, log: Callable[[str], None]) -> str | None:
    """Write the markers step's records now allow (the model's, then the whole checkpoint's, then the
    tracker, then rotate); return the level it has reached (MODEL, COMPLETE), None below both."""
    step_dir = run_dir / f"global_step_{step}"
    saved, parts = step_records(step_dir)
    reached = None
    for level, marker in ((MODEL, MODEL_MARKER), (COMPLETE, MARKER)):
        if vouches(found := read_json(step_dir / marker), saved) and generations_hold(step_dir, found or {}):
            if level == COMPLETE:
                return COMPLETE
            reached = level
            continue
        verdict = judge(saved, parts, _size_in(step_dir), level)
        if not verdict.complete or not generations_hold(step_dir, {"generations": verdict.generations}):
            return reached  # or a file was written again after its copy was recorded: never vouched for
        assert saved is not None
        if read_record(step_dir / STATE_DIR / SAVED_FILE) != saved:
            return reached  # saved again by a later attempt meanwhile: these records no longer describe the folder
        write_json(step_dir / marker, {"step": step, "attempt": saved["attempt"], "world_size": saved["world_size"],
                                       "files": verdict.files, "generations": verdict.generations})
        log(f"step {step}: {verdict.reason}")
        reached = level
    assert saved is not None
    world = saved["world_size"]
    newest = max(complete_steps(run_dir, world), default=step)
    tmp = run_dir / f".{TRACKER}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.write_text(str(newest))
    os.replace(tmp, run_dir / TRACKER)
    rotate(run_dir, world, log)
    return COMPLETE


def rotate(run_dir: Path, world_size: int, log: Callable[[str], None]) -> None:
    """Keep the newest `keep` complete checkpoints (attempt.json; all when unset); delete the older
    ones, and incomplete folders older than the newest complete one (earlier attempts' leftovers). Never
    the step the current attempt resumed from (verl may be loading it), nor anything while a step's
    completeness is unknown (the bucket did not answer: it is retried at the next completion)."""
    attempt = read_json(run_dir / STATE_DIR / ATTEMPT_FILE) or {}
    keep = attempt.get("keep")
    states = step_states(run_dir, world_size)
    unknown = sorted(step for step, complete in states.items() if complete is None)
    if unknown:
        log(f"rotation skipped: the bucket did not answer for step {', '.join(map(str, unknown))}")
        return
    complete = sorted(step for step, done in states.items() if done)
    if not complete:
        return
    drop = set(complete[:-keep]) if isinstance(keep, int) and keep >= 1 else set()
    for step_dir in run_dir.glob("global_step_*"):
        step = step_of(step_dir.name)
        if step is None or step == attempt.get("resume_from"):
            continue
        if step in drop or (step < complete[-1] and step not in complete):
            shutil.rmtree(step_dir, ignore_errors=True)
            log(f"step {step}: deleted ({'older than the newest ' + str(keep) if step in drop else 'incomplete'})")


def copy_files(local_step: Path, bucket_step: Path, names: Sequence[str],
               still_ours: Callable[[], None]) -> dict[str, int]:
    """Copy `names` (paths under `local_step`) to `bucket_step`, COPY_STREAMS at a time (one GCS FUSE write
    stream per file: a node reaches the bucket's rate only with several), each after `still_ours()` (which
    raises when it is not); return them (path -> bytes)."""

    def copy(name: str) -> tuple[str, int]:
        still_ours()
        src, dst = local_step / name, bucket_step / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        with src.open("rb") as reader, dst.open("wb") as writer:
            shutil.copyfileobj(reader, writer, _CHUNK)
        return name, src.stat().st_size

    with ThreadPoolExecutor(max_workers=COPY_STREAMS) as pool:
        return dict(pool.map(copy, names))


def publish_part(run_dir: Path, local_step: Path, step: int, attempt: str, part: str,
                 log: Callable[[str], None]) -> None:
    """Copy this pod's files of `step` in two phases, the model first, then what only a resume reads;
    record each (with the kinds of rank files verl left here) and try to complete the step after each."""
    bucket_step = run_dir / f"global_step_{step}"
    record = bucket_step / STATE_DIR / PARTS_DIR / f"{part}.json"

    def still_ours() -> None:
        # A copier of an earlier attempt may still be at it when a later attempt saves the step again.
        if (read_record(bucket_step / STATE_DIR / SAVED_FILE) or {}).get("attempt") != attempt:
            raise Superseded(f"step {step}: saved again by another attempt; {part} stops copying attempt "
                             f"{attempt}'s files")

    local = sorted(p.relative_to(local_step).as_posix() for p in local_step.rglob("*") if p.is_file())
    kinds = sorted({m.group(1) for name in local if (m := _RANK_FILE.fullmatch(name))})
    # A restarted copier keeps what its attempt's record says is in the bucket already at its size (also what
    # it deleted locally after recording: a cleanup cut short). A record it cannot read fails the pass.
    earlier = read_record(record) or {}
    in_bucket = _size_in(bucket_step)
    files = {name: size for name, size in earlier.get("files", {}).items()
             if earlier.get("attempt") == attempt and in_bucket(name) == size}
    for later in (False, True):
        todo = [name for name in local if resume_only(name) == later and name not in files]
        if todo or not record.exists():
            started = time.monotonic()
            copied = copy_files(local_step, bucket_step, todo, still_ours)
            files.update(copied)
            still_ours()
            entry: dict[str, Any] = {"attempt": attempt, "kinds": kinds, "files": files}
            if GENERATIONS is not None:  # what this pod wrote, as GCS numbered it when its writes closed
                now = GENERATIONS(bucket_step)
                entry["generations"] = {name: now.get(name) for name in files}
            write_json(record, entry)
            log(f"step {step}: copied {len(copied)} files, {sum(copied.values())} bytes in "
                f"{time.monotonic() - started:.1f} s ({part}{', resume state' if later else ''})")
        try_complete(run_dir, step, log)


# --- the sidecar ------------------------------------------------------------------------------------------


def copy_once(local_root: Path, bucket_root: Path, part: str, log: Callable[[str], None]) -> None:
    """One pass over this pod's local saves: copy what verl announced, drop what no attempt will use."""
    for attempt_dir in sorted(p for p in local_root.glob("*/*") if p.is_dir()):
        run, attempt = attempt_dir.parent.name, attempt_dir.name
        run_dir = bucket_root / run
        current = read_json(run_dir / STATE_DIR / ATTEMPT_FILE)
        if current is None:
            continue  # the bucket is not readable now, or the run is not recorded yet: try later
        if current.get("attempt") != attempt:
            shutil.rmtree(attempt_dir, ignore_errors=True)
            log(f"{run}/{attempt}: an earlier attempt's local saves, deleted")
            continue
        trainer_here(attempt_dir, run_dir, attempt, current.get("world_size"), part, log)
        for local_step in sorted(attempt_dir.glob("global_step_*"), key=lambda p: step_of(p.name) or -1):
            step = step_of(local_step.name)
            saved = read_json(run_dir / local_step.name / STATE_DIR / SAVED_FILE)
            if step is None or saved is None or saved.get("attempt") != attempt:
                continue  # verl may still be writing it
            try:
                publish_part(run_dir, local_step, step, attempt, part, log)
            except Superseded as e:  # its local files go with the attempt's folder at the next pass
                log(str(e))
                continue
            shutil.rmtree(local_step, ignore_errors=True)
    report_exits(local_root, bucket_root, part)


def trainer_here(attempt_dir: Path, run_dir: Path, attempt: str, world_size: Any, part: str,
                 log: Callable[[str], None]) -> None:
    """verl's trainer (its TaskRunner actor, which writes data.pt and the tracker) runs on this node, not on
    the head (A4X's head takes no Ray CPUs; elsewhere Ray may place it so too): announce the saves its
    tracker names."""
    tracker = local_tracker(attempt_dir)
    if tracker is None or not isinstance(world_size, int):
        return
    for local_step in attempt_dir.glob("global_step_*"):
        step = step_of(local_step.name)
        saved = read_record(run_dir / local_step.name / STATE_DIR / SAVED_FILE)
        if step is not None and step <= tracker and (saved or {}).get("attempt") != attempt:
            announce_step(run_dir, step, attempt, world_size, log)


def local_tracker(attempt_dir: Path) -> int | None:
    """verl's tracker in an attempt's local folder: its newest save on this node (None: none here, or being
    written: the next pass reads it)."""
    try:
        return int((attempt_dir / TRACKER).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def report_exits(local_root: Path, bucket_root: Path, part: str) -> None:
    """For each run whose current attempt's verl exited (exited.json), this pod's answer, echoing the
    launcher's nonce: verl's tracker here (read now, after the exit: its last save), or none."""
    for exited_path in bucket_root.glob(f"*/{STATE_DIR}/{EXITED_FILE}"):
        run_dir = exited_path.parent.parent
        exited = read_record(exited_path) or {}
        current = read_record(run_dir / STATE_DIR / ATTEMPT_FILE) or {}
        attempt = exited.get("attempt")
        if not attempt or attempt != current.get("attempt"):
            continue
        report = {"attempt": attempt, "nonce": exited.get("nonce"),
                  "step": local_tracker(local_root / run_dir.name / attempt)}
        path = run_dir / STATE_DIR / TRAINERS_DIR / f"{part}.json"
        if read_record(path) != report:  # written when it changes, not at every pass
            write_json(path, report)


def copy_forever(local_root: Path, bucket_root: Path, part: str, poll_s: float) -> None:
    while True:
        try:
            copy_once(local_root, bucket_root, part, _log)
        except OSError as e:  # the bucket mount stalled or failed: the next pass starts over
            _log(f"copy pass failed, retrying in {poll_s:.0f} s: {e}")
        time.sleep(poll_s)


# --- the launcher -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """The verl command as the launcher runs it, and what it needs to know of it."""

    command: list[str]
    run_dir: Path
    local_dir: Path
    world_size: int
    resume_from: int | None


def _override(args: Sequence[str], key: str) -> str | None:
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"{key}=")]
    return values[-1] if values else None


def plan_launch(command: Sequence[str], attempt: str, local_root: Path) -> Launch:
    """The verl command with its checkpoint settings moved to this attempt: saves to local disk,
    resume from the bucket's newest complete checkpoint, no deletion by verl (the bucket's rotation
    is this program's, after the next checkpoint is complete)."""
    folder = _override(command, "trainer.default_local_dir")
    nodes, gpus = _override(command, "trainer.nnodes"), _override(command, "trainer.n_gpus_per_node")
    if folder is None or not folder.startswith("/") or not (nodes or "").isdigit() or not (gpus or "").isdigit():
        raise CheckpointError("the verl command must set trainer.default_local_dir (an absolute path), "
                              "trainer.nnodes and trainer.n_gpus_per_node")
    run_dir, world = Path(folder), int(nodes) * int(gpus)  # type: ignore[arg-type]
    local_dir = local_root / run_dir.name / attempt
    step = resume_step(run_dir, world)
    moved = {
        "trainer.default_local_dir": str(local_dir),
        "trainer.resume_mode": "disable" if step is None else "resume_path",
        "trainer.max_actor_ckpt_to_keep": "null",
        "trainer.max_critic_ckpt_to_keep": "null",
        # verl would delete what it resumed from: here, the bucket's checkpoint.
        "trainer.del_local_ckpt_after_load": "False",
    }
    if step is not None:
        moved["trainer.resume_from_path"] = str(run_dir / f"global_step_{step}")
    # Each key once (Hydra refuses a key given twice); all of them are in verl's trainer config
    # (ppo_trainer.yaml, 0.6.1 and 0.9.0), so none needs Hydra's `+`.
    out = [a for a in command if a.split("=", 1)[0] not in moved]
    out += [f"{key}={value}" for key, value in moved.items()]
    return Launch(out, run_dir, local_dir, world, step)


def announce_step(run_dir: Path, step: int, attempt: str, world_size: int, log: Callable[[str], None]) -> None:
    """saved.json: verl finished writing `step` on every node (its trainer's tracker reached it)."""
    bucket_step = run_dir / f"global_step_{step}"
    for marker in (MODEL_MARKER, MARKER):
        # An earlier attempt's (or unreadable) marker of a step the copiers are about to overwrite: gone
        # before saved.json names this attempt, so no reader ever takes it for this attempt's files.
        if (read_json(bucket_step / marker) or {}).get("attempt") != attempt:
            (bucket_step / marker).unlink(missing_ok=True)
    write_json(bucket_step / STATE_DIR / SAVED_FILE, {"attempt": attempt, "world_size": world_size, "step": step})
    log(f"step {step}: saved by verl on every node, copying")


def announce(launch: Launch, attempt: str, announced: int, log: Callable[[str], None]) -> int:
    """Announce every save verl finished (its tracker at or past it) and this pod has not announced yet,
    oldest first, with the head's own files; return the newest one announced."""
    try:
        tracker = int((launch.local_dir / TRACKER).read_text().strip())
    except (OSError, ValueError):
        return announced
    pending = sorted((step, p) for p in launch.local_dir.glob("global_step_*")
                     if (step := step_of(p.name)) is not None and step <= tracker)
    for step, local_step in pending:
        announce_step(launch.run_dir, step, attempt, launch.world_size, log)
        publish_part(launch.run_dir, local_step, step, attempt, HEAD_PART, log)
        shutil.rmtree(local_step, ignore_errors=True)
        announced = max(announced, step)
    return announced


def wait_model(run_dir: Path, step: int, deadline_s: float, poll_s: float, log: Callable[[str], None]) -> bool:
    """Wait until `step`'s model is in the bucket (the sidecars copy it), showing what is missing."""
    give_up = time.monotonic() + deadline_s
    step_dir = run_dir / f"global_step_{step}"
    while True:
        try:
            reached = try_complete(run_dir, step, log)
            if reached == MODEL:
                log(f"step {step}: the model is in the bucket; its optimizer state goes on copying in the background "
                    f"(the step is resumable once {MARKER} is there; until then a new attempt resumes from the one "
                    "before)")
            if reached is not None:
                return True
            saved, parts = step_records(step_dir)
            reason = judge(saved, parts, _size_in(step_dir), MODEL).reason
        except OSError as e:
            reason = f"the bucket did not answer: {e}"
        left = give_up - time.monotonic()
        if left <= 0:
            log(f"step {step}: the model is still not in the bucket after {deadline_s:.0f} s ({reason})")
            return False
        log(f"step {step}: waiting for the model's copy to the bucket ({reason}); {left:.0f} s left")
        time.sleep(min(poll_s, left))


def launch(command: Sequence[str], local_root: Path, *, poll_s: float = POLL_S,
           final_wait_s: float = FINAL_WAIT_S) -> int:
    """Run verl for a new attempt of the run; its exit status, or 1 when its last save's model never reaches
    the bucket."""
    attempt = uuid.uuid4().hex[:12]
    # An earlier attempt's copier may complete a step and rotate between the plan and the record: the step
    # chosen must still be there once the record protects it.
    for _ in range(4):
        plan = plan_launch(command, attempt, local_root)
        record_attempt(plan, attempt, _keep(command))
        if plan.resume_from is None or is_complete(plan.run_dir / f"global_step_{plan.resume_from}", plan.world_size):
            break
    else:
        raise CheckpointError(f"step {plan.resume_from} was rotated away three times while this attempt started")
    _log(f"attempt {attempt}: world size {plan.world_size}, "
         + (f"resuming from step {plan.resume_from}" if plan.resume_from is not None else "starting from scratch")
         + f" (complete checkpoints in {plan.run_dir})")
    plan.local_dir.mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen(plan.command)
    signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signal.SIGTERM))
    announced = plan.resume_from or 0
    while child.poll() is None:
        announced = _announce_safely(plan, attempt, announced)
        time.sleep(poll_s)
    if child.returncode != 0:
        return child.returncode
    return 0 if finish(plan, attempt, announced, final_wait_s, poll_s, _log) else 1


def record_attempt(plan: Launch, attempt: str, keep: int | None) -> None:
    """attempt.json: the attempt the copiers copy for, how many complete checkpoints rotation keeps, and the
    step this attempt resumes from (rotation never deletes it while the attempt is current)."""
    write_json(plan.run_dir / STATE_DIR / ATTEMPT_FILE,
               {"attempt": attempt, "world_size": plan.world_size, "keep": keep, "resume_from": plan.resume_from})


def finish(plan: Launch, attempt: str, announced: int, deadline_s: float, poll_s: float,
           log: Callable[[str], None]) -> bool:
    """After verl succeeded: announce its last save (its local tracker's step), again while the bucket
    stalls, then wait for that save's model in the bucket; all within `deadline_s`."""
    give_up = time.monotonic() + deadline_s
    try:
        last = int((plan.local_dir / TRACKER).read_text().strip())
    except FileNotFoundError:
        if int(_override(plan.command, "trainer.save_freq") or -1) <= 0:
            return True  # verl saves nothing (its default save_freq is -1)
        nodes = int(_override(plan.command, "trainer.nnodes") or 1)
        found = trainers_last(plan.run_dir, attempt, nodes, deadline_s, poll_s, log)
        if found is None:
            return False
        return found == NO_SAVE or wait_model(plan.run_dir, found, max(give_up - time.monotonic(), 0.0), poll_s,
                                             log)
    while announced < last:
        try:
            announced = announce(plan, attempt, announced, log)
            problem = "its local files are gone"
        except OSError as e:
            problem = str(e)
        left = give_up - time.monotonic()
        if announced >= last:
            break
        if left <= 0:
            log(f"step {last}: verl's last save is still not announced after {deadline_s:.0f} s ({problem})")
            return False
        log(f"step {last}: announcing verl's last save failed ({problem}); retrying, {left:.0f} s left")
        time.sleep(min(poll_s, left))
    return wait_model(plan.run_dir, last, max(give_up - time.monotonic(), 0.0), poll_s, log)


NO_SAVE = -1
"""trainers_last's answer when no node has verl's tracker: verl saved nothing in this attempt."""


def trainers_last(run_dir: Path, attempt: str, nodes: int, deadline_s: float, poll_s: float,
                  log: Callable[[str], None]) -> int | None:
    """verl's trainer did not run on the head: its last save, from the GPU workers' copiers' answers written
    after verl exited (each echoes this exit's nonce: the tracker it read was final), once `nodes` pods
    answered; NO_SAVE when none has a tracker; None when they do not answer within `deadline_s`."""
    nonce = uuid.uuid4().hex[:12]
    give_up = time.monotonic() + deadline_s
    written = False
    while True:
        try:
            if not written:
                write_json(run_dir / STATE_DIR / EXITED_FILE, {"attempt": attempt, "nonce": nonce})
                written = True
            answers = {path.stem: report for path in sorted((run_dir / STATE_DIR / TRAINERS_DIR).glob("*.json"))
                       if (report := read_record(path) or {}).get("attempt") == attempt
                       and report.get("nonce") == nonce}
            if len(answers) >= nodes:
                steps = {pod: r["step"] for pod, r in answers.items() if isinstance(r.get("step"), int)}
                if not steps:
                    log("verl saved nothing in this attempt (no node has its tracker)")
                    return NO_SAVE
                pod = max(steps, key=lambda p: steps[p])
                log(f"step {steps[pod]}: verl's last save (its trainer ran on {pod})")
                return steps[pod]
            problem = f"{len(answers)} of {nodes} GPU workers' copiers answered since verl exited"
        except OSError as e:
            problem = str(e)
        left = give_up - time.monotonic()
        if left <= 0:
            log(f"verl's last save is still unknown after {deadline_s:.0f} s ({problem})")
            return None
        log(f"waiting for the GPU workers' copiers to say where verl's last save is ({problem}); "
            f"{left:.0f} s left")
        time.sleep(min(poll_s, left))


def _announce_safely(plan: Launch, attempt: str, announced: int) -> int:
    try:
        return announce(plan, attempt, announced, _log)
    except OSError as e:  # a stalled bucket: the next pass announces it again
        _log(f"announcing a save failed, retrying: {e}")
        return announced


def _keep(command: Sequence[str]) -> int | None:
    value = _override(command, "trainer.max_actor_ckpt_to_keep")
    return int(value) if value and value.isdigit() else None


def use_bucket(bucket: str, mount: str) -> None:
    """Markers name, and readers check, GCS generations (GENERATIONS) of `bucket`, mounted at `mount`, through
    the JSON API with the pod's identity (gcs.py, shipped beside this file)."""
    global GENERATIONS
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gcs  # the sibling file: this program ships without its package

    client = gcs.Gcs.in_pod(bucket, mount)

    def generations(step_dir: Path) -> dict[str, int]:
        prefix = client.name(step_dir) + "/"
        return {name[len(prefix):]: stat.generation for name, stat in client.generations(prefix).items()}
    GENERATIONS = generations


def _log(message: str) -> None:
    print(f"verl-gke checkpoints: {message}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="checkpoints.py", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("launch", help="run verl (the command after --) for a new attempt")
    run.add_argument("--local-root", type=Path, default=Path(LOCAL_ROOT))
    run.add_argument("verl", nargs=argparse.REMAINDER)
    copy = commands.add_parser("copy", help="copy this pod's announced saves to the bucket, forever")
    copy.add_argument("--local-root", type=Path, default=Path(LOCAL_ROOT))
    copy.add_argument("--bucket-root", type=Path, required=True, help="the checkpoint folder on the bucket mount")
    copy.add_argument("--poll", type=float, default=POLL_S)
    for command in (run, copy):
        command.add_argument("--bucket", default=os.environ.get(BUCKET_ENV, ""),
                             help=f"the bucket's name: markers rest on its object generations (default ${BUCKET_ENV})")
        command.add_argument("--mount", default="/data", help="where the bucket is mounted (default /data)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.bucket:
            use_bucket(args.bucket, args.mount)
        if args.command == "launch":
            verl = args.verl[1:] if args.verl[:1] == ["--"] else args.verl
            return launch(verl, args.local_root)
        copy_forever(args.local_root, args.bucket_root, os.environ.get("HOSTNAME") or socket.gethostname(), args.poll)
    except CheckpointError as e:
        print(f"verl-gke checkpoints: failed: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the bucket mount failed before verl started: the attempt fails, a retry may not
        print(f"verl-gke checkpoints: failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
