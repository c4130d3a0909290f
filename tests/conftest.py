"""Shared fixtures: the offline mock engine and whole-stack synth results; the session's own HOME."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import gc
import inspect
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

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

if TYPE_CHECKING:
    from verl_gke import synth

pytest_plugins = ["tests.ray_head", "tests.gcs_emulator"]


_FROZEN_AT = [0]
"""How many modules were imported at the last gc.freeze()."""


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Out of the cyclic GC's sight once imported: the modules' own objects (the first synth imports some
    360,000, pulumi_gcp's types). Each full collection otherwise scans them all again, some 0.2 CPU s,
    about once per synth; frozen, it scans what the tests made."""
    if len(sys.modules) >= _FROZEN_AT[0] + 200:
        gc.collect()
        gc.freeze()
        _FROZEN_AT[0] = len(sys.modules)


def pytest_configure(config: pytest.Config) -> None:
    for tier, what in TIERS.items():
        config.addinivalue_line("markers", f"{tier}: {what}")
    _fill_download_caches(config)


def _fill_download_caches(config: pytest.Config) -> None:
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

STACKS = ("a4", "a4-standard", "a3u-standard", "a4x", "smoke")

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
def synth_stack(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], synth.SynthResult]:
    """Runs the real program for a stack under mocks once per run: the first pytest worker that needs a
    stack synthesizes it and leaves the result (pickled) in the run's temp folder the workers share; the
    others wait for it and read it."""
    from verl_gke import synth  # here, not at the top: a pytest process that synthesizes nothing skips its import

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    cache: dict[str, synth.SynthResult] = {}

    def get(stack: str) -> synth.SynthResult:
        if stack not in cache:
            done = shared / f"synth-{stack}.pickle"
            with open(shared / f"synth-{stack}.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # another worker synthesizing it: at most one synth's time
                try:
                    if done.is_file():
                        cache[stack] = pickle.loads(done.read_bytes())
                    else:
                        cache[stack] = synth.run(stack)
                        done.with_suffix(".tmp").write_bytes(pickle.dumps(cache[stack]))
                        done.with_suffix(".tmp").rename(done)
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
        return cache[stack]

    return get


def synth_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m verl_gke.synth ARGS` as its main runs it, in this process: a child imports the program
    anew (some 3 CPU s). tests/test_synth_deterministic.py runs the module itself as a child."""
    from verl_gke import synth

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = synth.main(list(args))
        except SystemExit as exited:  # argparse's usage errors
            code = exited.code if isinstance(exited.code, int) else 1
    return subprocess.CompletedProcess(["verl_gke.synth", *args], code, out.getvalue(), err.getvalue())


# The tiers (docs/development.md): `make test-fast` runs the units alone.
TIERS = {
    "unit": "pure code: no real Ray head, no whole-stack synth",
    "synth": "runs the whole program under the mock engine (synth.run, the synth_stack fixture)",
    "integration": "starts or uses real processes: a Ray head on 127.0.0.1, nodes, a venv of another Ray",
}
_RAY_FIXTURES = {"ray_head", "ray_cluster"}


def _synthesizes(item: pytest.Function) -> bool:
    """Whether the test, or a fixture it uses, runs the whole program (read from their source)."""
    if "synth_stack" in item.fixturenames:
        return True
    functions = [item.function, *(d.func for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs
                                  if d.baseid)]  # the tests' own fixtures, not pytest's
    if any(_calls_synth(function) for function in functions):
        return True
    source = _source(item.function)
    return any(f"{helper}(" in source for helper in _synth_helpers(item.module))


_SYNTH_CALLS = ("synth.run(", "synth.main(", '"verl_gke.synth"', "synth_cli(")
"""The program synthesized in this process, through synth's CLI, or in a child process."""


@functools.cache
def _source(function: Callable[..., Any]) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


def _calls_synth(function: Callable[..., Any]) -> bool:
    return any(call in _source(function) for call in _SYNTH_CALLS)


@functools.cache
def _synth_helpers(module: Any) -> tuple[str, ...]:
    """The test module's own helper functions that synthesize."""
    return tuple(name for name, value in vars(module).items() if inspect.isfunction(value)
                 and value.__module__ == module.__name__ and not name.startswith("test_") and _calls_synth(value))


def tier_of(item: pytest.Function) -> str:
    if item.get_closest_marker("ray") or _RAY_FIXTURES & set(item.fixturenames):
        return "integration"
    return "synth" if _synthesizes(item) else "unit"


def _shares_a_module_fixture(item: pytest.Function) -> bool:
    """Whether the test uses a fixture set up once per module or class (a head of its own, a finished job)."""
    return any(defs[-1].scope in ("module", "class") for defs in item._fixtureinfo.name2fixturedefs.values())


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test gets the marker of its tier, from what it uses: `-m unit` selects the inner loop. Under
    `--dist loadgroup` (make test), a file whose tests share a module fixture runs on one worker (set up
    once), as do the tests of one `xdist_group` mark (a child process they share) and the files that share
    ray_cluster's head, one after another; every other test goes to whichever worker is free, so no long
    file bounds the run."""
    for item in items:
        if isinstance(item, pytest.Function):
            item.add_marker(tier_of(item))
            marked = item.get_closest_marker("xdist_group")  # tests that share a process of their own
            group = marked.args[0] if marked else None
            if not marked and _shares_a_module_fixture(item):
                # The modules that use ray_cluster share its head: one group, one after another.
                group = "ray_cluster" if "ray_cluster" in item.fixturenames else item.path.name
                item.add_marker(pytest.mark.xdist_group(group))
            if group and getattr(config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup
                _name_the_group(item, group)


def _name_the_group(item: pytest.Function, group: str) -> None:
    """The group in the test's id, where `--dist loadgroup` reads it: pytest-xdist 3.8 writes it to
    `item._nodeid`, which pytest 9 no longer reads (its ids are `item._id`), so every group was split
    over both workers and each set its module's Ray head and nodes up twice."""
    from _pytest.nodeid import NodeId

    if "@" not in item.nodeid.rsplit("]", 1)[-1]:
        item._id = NodeId.parse(f"{item.nodeid}@{group}")
