"""What every Ray pod needs for checkpoints on local disk (workloads/checkpoints.py): the program in a
ConfigMap, the local folder verl saves to, and on each GPU worker the copier beside it. Pure builders.
"""

from __future__ import annotations

import hashlib
from typing import Any

from domain.bucket import LOCAL_CHECKPOINTS
from domain.grpo_spec import CHECKPOINT_PROGRAM, CHECKPOINT_PROGRAM_DIR
from domain.platforms import CHECKPOINT_COPIER
from workloads.checkpoints import BUCKET_ENV

CONFIG_MAP = "verl-gke-checkpoints"
PROGRAM_FILE = CHECKPOINT_PROGRAM.rsplit("/", 1)[1]
CLIENT_FILE = "gcs.py"
LOCAL_VOLUME = "local-checkpoints"
PROGRAM_VOLUME = "checkpoint-program"
COPIER = "checkpoint-copier"
DIGEST_ANNOTATION = "verl-gke/checkpoints-sha256"
"""On the pod templates: a new program restarts the pods that run it."""


def program_config_map(*, namespace: str, program: str, client: str) -> dict[str, Any]:
    """workloads/checkpoints.py and the GCS JSON API client it loads beside it (workloads/gcs.py), mounted
    read-only at CHECKPOINT_PROGRAM_DIR in the head and the copiers. Named by its content and immutable: a
    running pod keeps the version it mounted (a new program is a new ConfigMap, created before the old one
    goes), and every pod of one template runs one program."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": config_map_name(digest(program + client)), "namespace": namespace},
            "immutable": True, "data": {PROGRAM_FILE: program, CLIENT_FILE: client}}


def digest(program: str) -> str:
    return hashlib.sha256(program.encode()).hexdigest()


def bucket_env(bucket: str) -> list[dict[str, str]]:
    """The bucket's name for the checkpoint program (its markers rest on the bucket's object generations)."""
    return [{"name": BUCKET_ENV, "value": bucket}] if bucket else []


def config_map_name(program_digest: str) -> str:
    return f"{CONFIG_MAP}-{program_digest[:10]}"


def volumes(program_digest: str) -> list[dict[str, Any]]:
    """The local folder (an emptyDir: the node's ephemeral storage, Local SSD on A4 and A3 Ultra nodes) and
    the program of that digest."""
    return [{"name": LOCAL_VOLUME, "emptyDir": {}},
            {"name": PROGRAM_VOLUME, "configMap": {"name": config_map_name(program_digest), "defaultMode": 0o444}}]


def mounts() -> list[dict[str, Any]]:
    return [{"name": LOCAL_VOLUME, "mountPath": LOCAL_CHECKPOINTS},
            {"name": PROGRAM_VOLUME, "mountPath": CHECKPOINT_PROGRAM_DIR, "readOnly": True}]


def copier(*, image: str, checkpoint_root: str, bucket_mount: dict[str, Any],
           security: dict[str, Any], env: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """The container that copies this worker's announced saves to `checkpoint_root` on the bucket mount."""
    size = {"cpu": str(CHECKPOINT_COPIER.cpu), "memory": f"{CHECKPOINT_COPIER.memory_gi}Gi",
            "ephemeral-storage": f"{CHECKPOINT_COPIER.ephemeral_gi}Gi"}
    return {
        "name": COPIER,
        "image": image,
        "command": ["python3", CHECKPOINT_PROGRAM, "copy", "--local-root", LOCAL_CHECKPOINTS,
                    "--bucket-root", checkpoint_root],
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}, {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
                *(env or [])],
        "resources": {"requests": dict(size), "limits": dict(size)},
        "securityContext": security,
        "volumeMounts": [*mounts(), bucket_mount],
    }
