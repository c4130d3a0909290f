"""Where verl-gke keeps what it downloads once (pinned wheels, CRD schemas, Ray test venvs):
$VERL_GKE_CACHE_ROOT, else $XDG_CACHE_HOME/verl-gke, else ~/.cache/verl-gke. The tests set it
before they move HOME to a temp folder, so the downloads stay shared between runs."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ROOT_ENV = "VERL_GKE_CACHE_ROOT"


def cache_root() -> Path:
    if explicit := os.environ.get(CACHE_ROOT_ENV):
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "verl-gke"
