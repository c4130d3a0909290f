"""Where verl-gke keeps what it downloads once (pinned wheels, CRD schemas, Ray test venvs):
$XDG_CACHE_HOME/verl-gke, else ~/.cache/verl-gke."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "verl-gke"
