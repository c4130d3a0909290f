"""The training bucket as every pod sees it, and where the run's checkpoints live on it and beside it."""

from workloads.checkpoints import LOCAL_ROOT

DEFAULT_CAPACITY = "768Gi"
MOUNT_PATH = "/data"
"""Where every pod mounts the bucket (the tutorial's paths all start with /data)."""
LOCAL_CHECKPOINTS = LOCAL_ROOT
"""Where verl saves on every Ray pod (the node's local disk); workloads/checkpoints.py copies each save to
the run's checkpoint folder on the bucket."""


def run_checkpoint_dir(checkpoint_dir: str, run_id: str) -> str:
    """The run's checkpoint folder on the bucket mount: `<verl.trainer.default_local_dir>/<run id>` (a checkpoint is
    valid for one run only)."""
    return f"{checkpoint_dir}/{run_id}" if run_id else checkpoint_dir
