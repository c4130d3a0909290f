"""The platform's pinned verl release on this machine, unpacked in a local cache.

synth and preview read verl's own Hydra config from it; tests also import verl's validators from
it. The download is the staging Job's own (workloads/stage_data.py): the same URL, the same sha256
check, the same marker, so a cached copy is reused only when it is complete.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from domain.platforms import VerlRelease
from domain.cache import cache_root
from domain.staged import StagingError, stage_wheel

CACHE_ENV = "VERL_GKE_CACHE_DIR"


class VerlUnavailable(Exception):
    """The pinned wheel could not be fetched or checked; `str()` says why, on one line."""


def cache_dir() -> Path:
    """$VERL_GKE_CACHE_DIR, else verl/ in verl-gke's cache."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return cache_root() / "verl"


def unpacked(release: VerlRelease) -> Path:
    """The directory holding `verl/` of `release` (put first on a path, it imports as installed)."""
    return _staged(release, cache_dir() / release.dir_name)


@functools.cache
def _staged(release: VerlRelease, dest: Path) -> Path:
    """Checked against the wheel once per process: each check downloads it again (~0.5 s)."""
    try:
        stage_wheel(url=release.wheel_url, sha256=release.sha256, dest=dest)
    except (StagingError, OSError) as e:
        raise VerlUnavailable(f"verl {release.version} from {release.wheel_url}: {e}") from None
    return dest


def config_dir(release: VerlRelease) -> Path:
    """verl's Hydra config folder (trainer/config, holding ppo_trainer.yaml) of `release`."""
    return unpacked(release) / "verl" / "trainer" / "config"
