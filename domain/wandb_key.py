"""Where wandb's API key lives: a Secret Manager secret the user names (verl-gke:wandbApiKeySecret), which
the staging Job copies into one Kubernetes Secret that only the Ray containers read. The key never passes
through Pulumi config or state."""

from __future__ import annotations

import re

from domain.staged import WANDB_SECRET, WANDB_SECRET_KEY

CONFIG_KEY = "verl-gke:wandbApiKeySecret"
ENV = "WANDB_API_KEY"
"""What wandb reads its key from (wandb's environment variables, `WANDB_API_KEY`)."""
_ID = re.compile(r"[A-Za-z0-9_-]{1,255}")


def id_problem(value: str) -> str | None:
    """What is wrong with a secret id (Secret Manager: letters, digits, '_' and '-', at most 255), or None."""
    if _ID.fullmatch(value):
        return None
    return ("the id of a Secret Manager secret in the stack's project (letters, digits, '_' and '-', at most 255), "
            "e.g. wandb-api-key")


def secret_name(project: str, secret_id: str) -> str:
    """`projects/<project>/secrets/<id>`, as the staging Job asks Secret Manager for it."""
    return f"projects/{project}/secrets/{secret_id}"


def env() -> dict[str, object]:
    """The Ray container's WANDB_API_KEY, from the Kubernetes Secret (not optional: a pod without the key
    waits for staging to write it instead of starting a run wandb would stop)."""
    return {"name": ENV, "valueFrom": {"secretKeyRef": {"name": WANDB_SECRET, "key": WANDB_SECRET_KEY}}}


def secret_to_copy(project: str, secret_id: str, loggers: list[str]) -> str | None:
    """The secret staging copies, only when the run logs to wandb (a key no logger uses goes nowhere)."""
    return secret_name(project, secret_id) if secret_id and "wandb" in loggers else None
