"""The training bucket as every pod sees it, who may write where in it, and where the run's checkpoints
live on it and beside it.

Under the mount at /data: `<model dir>/`, `gsm8k/`, `verl-<version>/` (staged; read-only to the Ray
pods), `verl/` (your own verl tree), and the Ray pods' four writable managed folders, each with its own
grant (components/gcs_fuse_storage.py): `<checkpoint dir>/` (verl/checkpoints/), `models/<run id>/`,
`logs/<run id>/`, `huggingface_cache/`. A job cannot rewrite the code or model later pods load.
"""

from __future__ import annotations

import posixpath

DEFAULT_CAPACITY = "768Gi"
MOUNT_PATH = "/data"
"""Where every pod mounts the bucket (the tutorial's paths all start with /data)."""
LOGS_DIR = "logs"
"""Logs of a run that outlive its cluster, one folder per run id."""
HF_CACHE_DIR = "huggingface_cache"
"""HF_HOME of the Ray processes."""
MODELS_DIR = "models"
"""Exported models, one folder per run id (workloads/export_model.py writes them: tests hold the names equal)."""


def bucket_path(mount_path: str) -> str:
    """`/data/verl/checkpoints` -> `verl/checkpoints`: the object-name prefix of a path under the mount."""
    return posixpath.relpath(mount_path, MOUNT_PATH)


def ray_writable_prefixes(checkpoint_dir: str) -> tuple[str, ...]:
    """The managed folders (`prefix/`) the Ray pods may write: the run's checkpoints under
    `checkpoint_dir` (a path under the mount), the exported models and the HF cache. Not LOGS_DIR: the
    run supervisor alone writes the logs and record copies there, so no job can forge them."""
    return tuple(f"{prefix}/" for prefix in (bucket_path(checkpoint_dir), MODELS_DIR, HF_CACHE_DIR))


LOCAL_CHECKPOINTS = "/local-checkpoints"
"""Where verl saves on every Ray pod (the node's local disk); workloads/checkpoints.py copies each save to
the run's checkpoint folder on the bucket (its LOCAL_ROOT: tests hold the two equal)."""


def run_checkpoint_dir(checkpoint_dir: str, run_id: str) -> str:
    """The run's checkpoint folder on the bucket mount: `<verl.trainer.default_local_dir>/<run id>` (a checkpoint is
    valid for one run only)."""
    return f"{checkpoint_dir}/{run_id}" if run_id else checkpoint_dir
