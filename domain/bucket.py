"""The training bucket as every pod sees it, who may write where in it, and where the run's checkpoints
live on it and beside it.

Object-name prefixes (folders under the mount at /data):

    <model dir>/, gsm8k/, verl-<version>/   staged by the staging Job (its own identity): the model, the data
                                            and the code every Ray process runs; read-only to the Ray pods
    verl/                                   your own verl tree (verlSourceInstall): read-only to the Ray pods
    <checkpoint dir>/  (verl/checkpoints/)  a run's checkpoints: the copier's (workloads/checkpoints.py) of
                                            verl's saves on each node's local disk (LOCAL_CHECKPOINTS)
    models/<run id>/                        exported Hugging Face models (the run supervisor, `verl-gke export`)
    logs/<run id>/                          logs that outlive the cluster
    huggingface_cache/                      HF_HOME of the Ray processes (the datasets library's cache)

The Ray pods' identity may read the whole bucket and write only the last four, each a GCS managed
folder with its own grant (components/gcs_fuse_storage.py): a job cannot rewrite the code or the
model that every later pod, the export and later stacks on the bucket load. Whatever else a Ray
process writes must go under one of them.
"""

from __future__ import annotations

import posixpath

from workloads.checkpoints import LOCAL_ROOT
from workloads.export_model import MODELS_DIR

DEFAULT_CAPACITY = "768Gi"
MOUNT_PATH = "/data"
"""Where every pod mounts the bucket (the tutorial's paths all start with /data)."""
LOGS_DIR = "logs"
"""Logs of a run that outlive its cluster, one folder per run id."""
HF_CACHE_DIR = "huggingface_cache"
"""HF_HOME of the Ray processes."""


def bucket_path(mount_path: str) -> str:
    """`/data/verl/checkpoints` -> `verl/checkpoints`: the object-name prefix of a path under the mount."""
    return posixpath.relpath(mount_path, MOUNT_PATH)


def ray_writable_prefixes(checkpoint_dir: str) -> tuple[str, ...]:
    """The managed folders (`prefix/`) the Ray pods may write: the run's checkpoints under
    `checkpoint_dir` (a path under the mount), the exported models and the HF cache. Not LOGS_DIR: the
    run supervisor alone writes the logs and record copies there, so no job can forge them."""
    return tuple(f"{prefix}/" for prefix in (bucket_path(checkpoint_dir), MODELS_DIR, HF_CACHE_DIR))


LOCAL_CHECKPOINTS = LOCAL_ROOT
"""Where verl saves on every Ray pod (the node's local disk); workloads/checkpoints.py copies each save to
the run's checkpoint folder on the bucket."""


def run_checkpoint_dir(checkpoint_dir: str, run_id: str) -> str:
    """The run's checkpoint folder on the bucket mount: `<verl.trainer.default_local_dir>/<run id>` (a checkpoint is
    valid for one run only)."""
    return f"{checkpoint_dir}/{run_id}" if run_id else checkpoint_dir
