"""`verl-gke:startFrom`: a warm start from an earlier run's checkpoint or from a model verl-gke exported.

`{run: <run id>, step: N}` resumes that checkpoint (model, optimizer state, verl's step count and data
position): verl's `trainer.resume_mode=resume_path` with `trainer.resume_from_path`, which the checkpoint
launcher uses while the run has no complete checkpoint of its own. `{model: gs://<bucket>/models/<run>/model}`
starts from an exported model: verl's `actor_rollout_ref.model.path`, a fresh optimizer. Either is part of the
run's id (domain/run_identity.py). The form is checked offline; that the checkpoint or model exists and is
resumable, at preview (domain/preflight.py). Pure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from domain.bucket import MODELS_DIR, MOUNT_PATH, bucket_path

# The bucket's names the in-cluster programs write (workloads/checkpoints.py, workloads/export_model.py; the
# domain imports no workload: tests/test_start_from.py holds them equal).
MARKER, SAVED = ".verl-gke-complete.json", ".verl-gke/saved.json"
POINTER_SUFFIX = ".json"

KEY = "verl-gke:startFrom"
RESUME_PATH = "trainer.resume_from_path"
MODEL_PATH = "actor_rollout_ref.model.path"
_RUN = re.compile(r"^run-[0-9a-f]{12}$")
_MODEL = re.compile(rf"^gs://(?P<bucket>[a-z0-9][a-z0-9._-]{{1,220}})/(?P<folder>{MODELS_DIR}/(?P<run>run-[0-9a-f]{{12}})"
                    r"/model(?:-step-[1-9][0-9]*)?)$")
FORMS = ("{\"run\": \"run-<12 hex>\", \"step\": N} (a complete checkpoint of an earlier run on this bucket) or "
         "{\"model\": \"gs://<bucket>/models/<run id>/model\"} (a model verl-gke exported)")


def problems(value: Mapping[str, Any]) -> list[str]:
    """What is wrong with the value's form (offline): one line, or none."""
    if not value:
        return []
    keys = set(value)
    run, step, model = value.get("run"), value.get("step"), value.get("model")
    ok = (keys == {"run", "step"} and isinstance(run, str) and bool(_RUN.match(run))
          and isinstance(step, int) and not isinstance(step, bool) and step >= 1) or (
        keys == {"model"} and isinstance(model, str) and bool(_MODEL.match(model)))
    return [] if ok else [f"{KEY} = {_shown(value)}: must be {FORMS}."]


def _shown(value: Mapping[str, Any]) -> str:
    return json.dumps(dict(value), default=str)


def overrides(value: Mapping[str, Any], checkpoint_dir: str) -> dict[str, Any]:
    """The verl settings a well-formed start sets (`checkpoint_dir`: trainer.default_local_dir); {} for none or a
    malformed one (problems names it)."""
    if problems(value) or not value:
        return {}
    if "model" in value:
        return {MODEL_PATH: f"{MOUNT_PATH}/{_MODEL.match(value['model'])['folder']}"}  # type: ignore[index]
    return {RESUME_PATH: f"{checkpoint_dir}/{value['run']}/global_step_{value['step']}"}


def objects_to_read(value: Mapping[str, Any], checkpoint_dir: str) -> dict[str, str]:
    """What preview reads of the bucket to know the start exists and is resumable: {role: object name}."""
    found = overrides(value, checkpoint_dir)
    if RESUME_PATH in found:
        step = bucket_path(found[RESUME_PATH])
        return {"marker": f"{step}/{MARKER}", "saved": f"{step}/{SAVED}"}
    if MODEL_PATH in found:
        return {"pointer": bucket_path(found[MODEL_PATH]) + POINTER_SUFFIX}
    return {}


def model_bucket(value: Mapping[str, Any]) -> str | None:
    """The bucket a `{model: gs://...}` start names."""
    match = _MODEL.match(str(value.get("model", ""))) if value else None
    return match["bucket"] if match else None


def resumable_problem(value: Mapping[str, Any], world_size: int, read: Mapping[str, dict[str, Any] | None]) -> str | None:
    """Why the start cannot be used, from the objects objects_to_read names as read (None: absent); None if it can.

    A checkpoint is resumable when its complete marker (workloads/checkpoints.py, written last, after every rank's
    model and optimizer shard was copied) is its current attempt's (saved.json) and names this run's world size
    (FSDP shards are per world size). An exported model is there once its pointer (model.json) is and does not
    say `replacing`: the export writes that before it touches the folder, the rest after (workloads/export_model.py)."""
    shown = f"{KEY} = {_shown(value)}"
    if "model" in value:
        pointer = read.get("pointer")
        if pointer is None:
            return f"{shown}: no model exported there (its model.json is missing): `verl-gke runs` lists your runs."
        if pointer.get("replacing"):
            return (f"{shown}: its export was cut while replacing the model (model.json says so): export the run "
                    "again with `verl-gke export`.")
        return None
    where = f"run {value['run']} has no complete checkpoint at step {value['step']}"
    marker, saved = read.get("marker"), read.get("saved")
    if marker is None or saved is None:
        return (f"{shown}: {where} (not saved, still copying, or rotated away; a step with its model alone can be "
                f"exported with `verl-gke export --step {value['step']}` and started from as a model).")
    if marker.get("attempt") != saved.get("attempt"):
        return f"{shown}: {where} (step {value['step']} is being saved again by a later attempt)."
    if marker.get("world_size") != world_size:
        return (f"{shown}: step {value['step']} was saved by {marker.get('world_size')} GPUs and this stack has "
                f"{world_size}: verl's FSDP checkpoints resume at their own world size; set gpuNodes to match, or "
                "start from its exported model ({\"model\": \"gs://...\"}).")
    return None


def lineage(value: Mapping[str, Any]) -> str:
    """The start as the run's plan and record show it ("" for none)."""
    if not value or problems(value):
        return ""
    if "model" in value:
        return f"model {value['model']}"
    return f"run {value['run']} step {value['step']}"
