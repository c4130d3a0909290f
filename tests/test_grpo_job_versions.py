"""The provider's Ray 2.60 client against real heads of the Ray versions the clusters run.

The pinned verl images run Ray 2.47 (A4, A3 Ultra, per the tutorial's rayVersion) and 2.49 (A4X).
Each gets its own venv, built once by this module (ray[default] at that version, the rest of the
tree from constraints.txt) and cached in verl-gke's cache (domain.cache).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ray.job_submission import JobSubmissionClient

from components.grpo_job import GrpoJobProvider, log_tail
from tests.ray_head import start_head, stop_head
from domain.cache import cache_root

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parent.parent
CLUSTER_RAY_VERSIONS = ("2.47.0", "2.49.0")
INSTALL_TIMEOUT_S = 480


def ray_venv(version: str) -> Path:
    """A venv with ray[default]==`version`, built on first use; its marker is written last."""
    cache = cache_root() / "ray-venvs"
    venv = cache / f"ray-{version}-py{sys.version_info.major}{sys.version_info.minor}"
    marker = venv / ".installed"
    if marker.exists():
        return venv
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=120)
    constraints = venv / "constraints.txt"
    constraints.write_text("".join(line for line in (REPO / "constraints.txt").read_text().splitlines(True)
                                   if not line.startswith("ray==")))
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
                    f"ray[default]=={version}", "-c", str(constraints)], check=True, timeout=INSTALL_TIMEOUT_S)
    marker.write_text(version)
    return venv


@pytest.fixture(scope="module", params=CLUSTER_RAY_VERSIONS)
def old_head(request: pytest.FixtureRequest) -> Iterator[tuple[str, Path]]:
    venv = ray_venv(request.param)
    head = start_head(venv / "bin" / "ray")
    try:
        version = JobSubmissionClient(head.dashboard_url).get_version()
        assert version  # the job API answers
        yield head.dashboard_url, venv
    finally:
        stop_head(head)


def _py(venv: Path, code: str) -> str:
    return f"{shlex.quote(str(venv / 'bin' / 'python'))} -c {shlex.quote(code)}"


def test_create_adopt_read_and_delete_against_the_clusters_ray(old_head: tuple[str, Path]) -> None:
    url, venv = old_head
    stack = f"v{venv.name.split('-')[1].replace('.', '')}"
    props = {"dashboard_url": url, "entrypoint": _py(venv, "import time; print('up', flush=True); time.sleep(600)"),
             "runtime_env": {"env_vars": {"NCCL_DEBUG": "INFO"}}, "stack": stack, "startup_grace_s": 1.0}
    provider = GrpoJobProvider()
    created = provider.create(props)
    assert created.outs is not None and created.outs["status"] == "RUNNING"
    assert provider.create(props).id == created.id  # adopted, not submitted twice
    assert sum(j.submission_id == created.id for j in JobSubmissionClient(url).list_jobs()) == 1
    read = provider.read(created.id, created.outs)
    assert read.outs is not None and read.outs["status"] == "RUNNING"
    provider.delete(created.id, created.outs)
    assert str(JobSubmissionClient(url).get_job_status(created.id).value) == "STOPPED"


def test_a_failing_run_reports_the_end_of_its_log_from_the_clusters_ray(old_head: tuple[str, Path]) -> None:
    url, venv = old_head
    code = "import sys\nfor i in range(300): print(f'row {i}')\nsys.exit(5)"
    props = {"dashboard_url": url, "entrypoint": _py(venv, code), "runtime_env": {},
             "stack": f"f{venv.name.split('-')[1].replace('.', '')}", "startup_grace_s": 30.0}
    with pytest.raises(RuntimeError) as raised:
        GrpoJobProvider().create(props)
    lines = str(raised.value).splitlines()
    assert "FAILED while starting: Job entrypoint command failed with exit code 5" in lines[0]
    assert lines[-3:] == ["row 297", "row 298", "row 299"]


def test_the_log_tail_is_cut_by_the_head(old_head: tuple[str, Path]) -> None:
    url, venv = old_head
    client = JobSubmissionClient(url)
    job_id = client.submit_job(entrypoint=_py(venv, "for i in range(20000): print(i)"))
    deadline = time.monotonic() + 120
    while str(client.get_job_status(job_id).value) not in ("SUCCEEDED", "FAILED"):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert log_tail(client, client.get_job_info(job_id), 3) == ["19997", "19998", "19999"]
