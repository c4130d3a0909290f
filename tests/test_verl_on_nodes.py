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

from components.grpo_spec import VERL_ENTRY_MODULE
from components.platforms import PLATFORMS
from manifests import staging
from manifests.storage import MOUNT_PATH
from workloads import stage_data

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

# The driver resolves verl's entry module, then a Ray task (a worker process) does the same.
_PROBE = f"""
import importlib.util, ray
def where():
    spec = importlib.util.find_spec({VERL_ENTRY_MODULE!r})
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
