"""Where the Hugging Face token lives: a Secret Manager secret per stack, which the stack creates
empty and the user fills with gcloud. The token never passes through Pulumi config or state."""

from __future__ import annotations

import re

_NOT_IN_ID = re.compile(r"[^A-Za-z0-9_-]")


def secret_id(stack: str) -> str:
    """`verl-gke-<stack>-hf-token`: one per stack, so stacks in one project never share or collide
    (Secret Manager ids: letters, digits, '_' and '-', at most 255)."""
    return f"verl-gke-{_NOT_IN_ID.sub('-', stack)}-hf-token"[:255]


def secret_name(project: str, stack: str) -> str:
    """The secret's resource name, as the staging Job asks Secret Manager for it."""
    return f"projects/{project}/secrets/{secret_id(stack)}"


def add_version_command(project: str, stack: str) -> str:
    """What a user runs to store (or rotate) the token; it reads the token from stdin, not argv."""
    return f"gcloud secrets versions add {secret_id(stack)} --project {project} --data-file=-"
