"""Shared fixtures: the offline mock engine and whole-stack synth results; the session's own HOME."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import pytest

from domain.cache import CACHE_ROOT_ENV, cache_root

# What a user's environment would change a result by: credentials and config of Ray (RAY_AUTH_*,
# RAY_ADDRESS), Pulumi (PULUMI_CONFIG is the program's config), gcloud, kubectl and Hugging Face.
_USER_ENV_PREFIXES = ("RAY_", "PULUMI_", "CLOUDSDK_", "GOOGLE_", "GCLOUD_", "HF_", "HUGGING_FACE_")
_USER_ENV = ("KUBECONFIG", "PIP_CONFIG_FILE")


def _hermetic_home() -> Path:
    """The session runs in a HOME of its own (Ray's ~/.ray/auth_token, ~/.kube/config, gcloud's and
    pip's config and HF's token of the user are out of sight; the Ray processes the tests start inherit
    it), removed at exit. The download caches stay where they were (domain.cache, pip's cache)."""
    os.environ.setdefault(CACHE_ROOT_ENV, str(cache_root()))
    os.environ.setdefault("PIP_CACHE_DIR", str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pip"))
    for name in [n for n in os.environ if n.startswith(_USER_ENV_PREFIXES) or n in _USER_ENV]:
        del os.environ[name]
    home = Path(tempfile.mkdtemp(prefix="verl-gke-home-"))
    os.environ["HOME"] = str(home)
    for name, sub in (("XDG_CONFIG_HOME", ".config"), ("XDG_CACHE_HOME", ".cache"), ("XDG_DATA_HOME", ".local/share"),
                      ("XDG_STATE_HOME", ".local/state")):
        os.environ[name] = str(home / sub)
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    return home


SESSION_HOME = _hermetic_home()

from verl_gke import synth  # noqa: E402 after HOME moved: nothing may read the user's at import

pytest_plugins = ["tests.ray_head"]


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (make test), the controller fills the download caches the workers share
    (the pinned verl wheels, the vLLM sources, the CRD files) before any worker starts, so that no two workers write
    one cache entry at once. A failure here is left to the tests that need the entry to report."""
    if not config.pluginmanager.hasplugin("xdist") or not config.getoption("numprocesses", None):
        return
    if hasattr(config, "workerinput"):  # a worker: the controller already did it
        return
    from domain.platforms import PLATFORMS
    from domain.verl_wheel import VerlUnavailable, unpacked
    from tests.k8s_schema import crd_paths

    for release in {platform.verl for platform in PLATFORMS.values()}:
        try:
            unpacked(release)
        except VerlUnavailable:
            pass
    from tests import vllm_source
    from workloads.stage_data import StagingError

    for source in {s for p in PLATFORMS.values() for s in (p.image_vllm, p.verl.ci_vllm) if s}:
        try:
            vllm_source.unpacked(source)
        except (StagingError, OSError):
            pass
    try:
        crd_paths()
    except AssertionError:
        pass

STACKS = ("a4", "a4-standard", "a3u-standard", "a4x")

# A valid raw config as the engine would pass it; tests change one key at a time.
BASE_CONFIG = {
    "gcp:project": "my-project-123",
    "gcp:region": "us-central1",
    "gcp:zone": "us-central1-b",
    "verl-gke:reservation": "my-reservation",
}


def verl_value(paths: dict[str, Any]) -> str:
    """verl-gke:verl as the engine hands it over after `pulumi config set --path verl-gke:verl.<path> <value>`
    for each path: JSON of the nested map."""
    root: dict[str, Any] = {}
    for path, value in paths.items():
        *parents, leaf = path.split(".")
        node = root
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return json.dumps(root)


@pytest.fixture(scope="session")
def synth_stack() -> Callable[[str], synth.SynthResult]:
    """Runs the real program for a stack under mocks once per session and caches the result."""
    cache: dict[str, synth.SynthResult] = {}

    def get(stack: str) -> synth.SynthResult:
        if stack not in cache:
            cache[stack] = synth.run(stack)
        return cache[stack]

    return get
