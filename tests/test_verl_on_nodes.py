"""verl reaches the job's driver and its workers through what the program stages, on a real Ray head.

The staging Job's own arguments (from the a4 stack's synth) stage the pinned verl wheel from PyPI
into a temporary folder standing in for the bucket mount; the job is then submitted with the
stack's own runtime env, its /data paths pointed at that folder. The head's Python has verl's
dependencies (torch, as the image has them) but not verl, as verl's images do.
"""

from __future__ import annotations

import shlex
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from ray.job_submission import JobSubmissionClient

from domain.grpo_spec import VERL_ENTRY_MODULE
from domain.platforms import PLATFORMS
from manifests import staging
from domain.bucket import MOUNT_PATH
from workloads import stage_data

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

# The driver resolves verl's entry module, then a Ray task (a worker process) does the same: found on sys.path as
# the import system finds it, without running verl's package (it imports torch: seconds of CPU in each process).
_PROBE = f"""
import importlib.machinery, ray
def where():
    spec, name = None, ""
    for part in {VERL_ENTRY_MODULE!r}.split("."):
        name = f"{{name}}.{{part}}" if name else part
        spec = importlib.machinery.PathFinder.find_spec(name, spec and spec.submodule_search_locations)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {{name!r}}")
    return spec.origin
ray.init()
print("driver", where())
print("worker", ray.get(ray.remote(where).remote()))
"""


def _inputs(result: Any, type_: str) -> dict[str, Any]:
    return next(r.inputs for r in result.registrations if r.type == type_)


def _staging_args(result: Any) -> list[str]:
    job = next(m for m in result.manifests() if m["kind"] == "Job" and m["metadata"]["name"] == staging.JOB_NAME)
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    return command[4:]  # /bin/sh -c SCRIPT NAME ARGS...


def _on(root: Path, value: str) -> str:
    return value.replace(MOUNT_PATH, str(root))


def _submit(dashboard: str, runtime_env: dict[str, Any]) -> tuple[str, str]:
    client = JobSubmissionClient(dashboard)
    job_id = client.submit_job(entrypoint=f"{shlex.quote(sys.executable)} -c {shlex.quote(_PROBE)}",
                               runtime_env=runtime_env, submission_id=f"verl-{uuid.uuid4().hex[:8]}")
    deadline = time.monotonic() + 240
    while (status := str(client.get_job_status(job_id).value)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        assert time.monotonic() < deadline, f"job {job_id} still {status}"
        time.sleep(0.5)
    return status, client.get_job_logs(job_id)


@pytest.fixture(scope="module")
def bucket(tmp_path_factory: pytest.TempPathFactory, synth_stack: Any) -> Path:
    """A stand-in for the bucket mount, staged by the a4 staging Job's own arguments."""
    root = tmp_path_factory.mktemp("bucket")
    args = _staging_args(synth_stack("a4"))
    args[args.index("--data-root") + 1] = str(root)
    settings = stage_data.parse_args(args)
    assert settings.verl_dir == PLATFORMS["a4"].verl.dir_name
    assert stage_data.stage_wheel(url=str(settings.verl_wheel_url), sha256=str(settings.verl_wheel_sha256),
                                  dest=root / str(settings.verl_dir))
    return root


def test_the_head_has_no_verl_of_its_own() -> None:
    import importlib.util

    assert importlib.util.find_spec("verl") is None


def test_staged_verl_resolves_on_the_driver_and_in_a_ray_task(ray_head: str, bucket: Path, synth_stack: Any) -> None:
    env = _inputs(synth_stack("a4"), "pulumi-python:dynamic:GrpoJob")["runtime_env"]
    assert env["env_vars"]["PYTHONPATH"] == f"{MOUNT_PATH}/verl-0.6.1"
    local = {**env, "env_vars": {k: _on(bucket, v) for k, v in env["env_vars"].items()}}
    status, logs = _submit(ray_head, local)
    origin = str(bucket / "verl-0.6.1" / "verl" / "trainer" / "main_ppo.py")
    assert status == "SUCCEEDED", logs
    assert f"driver {origin}" in logs and f"worker {origin}" in logs


def test_without_the_staged_verl_the_same_job_fails(ray_head: str, bucket: Path, synth_stack: Any) -> None:
    env = _inputs(synth_stack("a4"), "pulumi-python:dynamic:GrpoJob")["runtime_env"]
    bare = {k: _on(bucket, v) for k, v in env["env_vars"].items() if k != "PYTHONPATH"}
    status, logs = _submit(ray_head, {**env, "env_vars": bare})
    assert status == "FAILED"
    assert "ModuleNotFoundError: No module named 'verl'" in logs


def test_a_second_staging_finds_verl_in_place_and_skips(bucket: Path) -> None:
    release = PLATFORMS["a4"].verl
    assert not stage_data.stage_wheel(url=release.wheel_url, sha256=release.sha256, dest=bucket / release.dir_name)


def _verl_wiring(result: Any) -> tuple[list[str], str | None, list[dict[str, str]]]:
    """What a synth puts in place for verl: staging flags, the job's PYTHONPATH, the Ray head's PYTHONPATH."""
    args = _staging_args(result)
    flags = [a for a in args if a.startswith("--verl")]
    job_path = _inputs(result, "pulumi-python:dynamic:GrpoJob")["runtime_env"]["env_vars"].get("PYTHONPATH")
    ray = next(m for m in result.manifests() if m["kind"] == "RayCluster")
    head_env = ray["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0].get("env", [])
    return flags, job_path, [e for e in head_env if e["name"] == "PYTHONPATH"]


@pytest.mark.parametrize(("stack", "version"), [("a4-standard", "0.6.1"), ("a3u-standard", "0.6.1"), ("a4x", "0.9.0")])
def test_each_stack_stages_the_verl_its_image_was_built_for(synth_stack: Any, stack: str, version: str) -> None:
    flags, job_path, head_env = _verl_wiring(synth_stack(stack))
    assert flags == ["--verl-wheel-url", "--verl-wheel-sha256", "--verl-dir"]
    assert job_path == f"/data/verl-{version}"
    assert {"name": "PYTHONPATH", "value": f"/data/verl-{version}"} in head_env


def test_an_image_with_verl_gets_no_second_copy() -> None:
    from verl_gke import synth

    flags, job_path, head_env = _verl_wiring(synth.run("a4", overrides={"verl-gke:verlInImage": "true",
                                                                       "verl-gke:verlImage": "me/verl@sha256:" + "e" * 64}))
    assert (flags, job_path, head_env) == ([], None, [])


def test_a_users_own_tree_on_the_bucket_is_used_instead_of_the_release() -> None:
    from verl_gke import synth

    flags, job_path, head_env = _verl_wiring(synth.run("a4", overrides={"verl-gke:verlSourceInstall": "true"}))
    assert flags == [] and job_path == "/data/verl"
    assert {"name": "PYTHONPATH", "value": "/data/verl"} in head_env


def test_bringing_verl_twice_is_a_config_error() -> None:
    from domain.config import ConfigError, load_config
    from tests.conftest import BASE_CONFIG

    with pytest.raises(ConfigError, match="verl-gke:verlInImage = true: verlInImage and verlSourceInstall"):
        load_config({**BASE_CONFIG, "verl-gke:verlInImage": "true", "verl-gke:verlSourceInstall": "true"})
