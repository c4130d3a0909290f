"""The provider's Ray 2.60 client against real heads of the Ray versions the clusters run, and the model
export as the run supervisor (REST, a gcs:// working_dir it uploads) and `verl-gke export` (the SDK, a local
working_dir) submit it there.

The pinned verl images run Ray 2.47 (A4, A3 Ultra, per the tutorial's rayVersion) and 2.49 (A4X).
Each gets its own venv, built once by this module (ray[default] at that version, the rest of the
tree from constraints.txt) and cached in verl-gke's cache (domain.cache). The venvs have no verl:
the exports run export_model.py to one of its own failures, before it would start verl's merger.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from ray.dashboard.modules.job.common import JOB_ACTOR_NAME_TEMPLATE
from ray.job_submission import JobSubmissionClient

from components.grpo_job import GrpoJobProvider
from components.job_head import log_tail
from domain.cache import cache_root
from tests.kube_api import kube_api
from tests.ray_head import start_head, stop_head
from tests.test_cli import outputs_doc, write_outputs
from tests.test_run_export import succeeded_run, supervisor, until_released
from tests.test_run_supervisor import RecordingControl
from verl_gke import cli
from workloads import export_model
from workloads.kube import KubernetesApi
from workloads.run_lifecycle import RayJobs
from workloads.run_record import RecordStore

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


def test_a_failing_run_reports_the_end_of_its_log_cut_by_the_clusters_ray(old_head: tuple[str, Path]) -> None:
    """One failing job of a long log: create's error ends with its tail, and the tail is what the head cut."""
    url, venv = old_head
    code = "import sys\nfor i in range(20000): print(f'row {i}')\nsys.exit(5)"
    stack = f"f{venv.name.split('-')[1].replace('.', '')}"
    props = {"dashboard_url": url, "entrypoint": _py(venv, code), "runtime_env": {}, "stack": stack,
             "startup_grace_s": 30.0}
    with pytest.raises(RuntimeError) as raised:
        GrpoJobProvider().create(props)
    lines = str(raised.value).splitlines()
    assert "FAILED while starting: Job entrypoint command failed with exit code 5" in lines[0]
    assert lines[-3:] == ["row 19997", "row 19998", "row 19999"]
    client = JobSubmissionClient(url)
    (job,) = [j for j in client.list_jobs() if (j.submission_id or "").startswith(f"verl-grpo-{stack}-")]
    assert log_tail(client, job, 3) == ["row 19997", "row 19998", "row 19999"]


# --- the model export (workloads/export_model.py), as the run supervisor and `verl-gke export` submit it ---


def driver_resources(url: str, submission_id: str) -> dict[str, float]:
    """What the head reserved for a job's driver: its JobSupervisor actor's resources, from the state
    API (the job's details do not show entrypoint resources)."""
    with urllib.request.urlopen(f"{url}/api/v0/actors?detail=true&limit=10000", timeout=30) as reply:
        actors = json.load(reply)["data"]["result"]["result"]
    name = JOB_ACTOR_NAME_TEMPLATE.format(job_id=submission_id)  # the same in 2.47, 2.49 and 2.60
    found = [a["required_resources"] for a in actors if a.get("name") == name]
    assert len(found) == 1, f"{submission_id}: {len(found)} JobSupervisor actors"
    return found[0]


def await_reader(fifo: Path, timeout_s: float) -> int:
    """A write end of `fifo` once a process has it open for reading (a non-blocking open fails until then)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as error:
            assert error.errno == errno.ENXIO and time.monotonic() < deadline, f"nothing read {fifo}: {error}"
            time.sleep(0.2)


def test_the_supervisors_model_export_runs_and_fails_as_recorded_on_the_clusters_ray(
        old_head: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, venv = old_head
    version = venv.name.split("-")[1]
    python = str(venv / "bin" / "python")  # Ray only, no verl: the export fails before it would merge
    with kube_api() as (kube, _state):
        records = RecordStore(KubernetesApi(kube), "ray", "b200-ray-cluster")
        run_id = succeeded_run(records)
        checkpoints = tmp_path / "ck" / run_id
        checkpoints.mkdir(parents=True)
        # verl's tracker as a pipe: export_model's read of it waits for the test, so the job stays RUNNING
        # until the test writes the step (7, of which the folder has nothing).
        tracker = checkpoints / export_model.TRACKER
        os.mkfifo(tracker)
        target = f"{tmp_path}/models/{run_id}/model"
        # As __main__ configures it (checkpoint_dir, mount, memory_bytes, verl_dir), and the venv's python.
        export = {"checkpoint_dir": str(checkpoints), "mount": str(tmp_path), "memory_bytes": 10**6,
                  "verl_dir": "/data/verl", "python": python}
        control = RecordingControl()
        sup = supervisor(url, records, run_id, control, export)
        export_id = f"verl-export-{run_id}-final-0"
        writer = None
        try:
            sup.step()
            assert sup.ray.submitted == [(export_id, {"entrypoint_memory": 10**6, "entrypoint_num_cpus": 1})]
            writer = await_reader(tracker, 120)  # the entrypoint runs under the old head
            info = JobSubmissionClient(url).get_job_info(export_id)
            assert str(info.status.value) == "RUNNING"
            assert info.entrypoint == (f"{python} export_model.py --checkpoint-dir {checkpoints} --target-dir {target} "
                                       "--verl-dir /data/verl")
            assert info.metadata == {"verl_gke_export": target, "verl-gke.run_id": run_id}
            assert info.runtime_env == {"working_dir": f"gcs://{export_model.working_dir_package()[0]}"}
            assert driver_resources(url, export_id) == {"CPU": 1.0, "memory": 1e6}

            # A deploy of another run is refused while the export holds the head.
            stack = f"e{version.replace('.', '')}"
            with pytest.raises(RuntimeError, match=rf"model export of stack {stack} is live on .*: {export_id}\. "):
                GrpoJobProvider().create({"dashboard_url": url, "entrypoint": "true", "runtime_env": {},
                                          "stack": stack, "startup_grace_s": 1.0})
            assert not [j for j in JobSubmissionClient(url).list_jobs() if stack in (j.submission_id or "")]

            # `verl-gke status` finds the run's export by its metadata, as the supervisor tags its attempts.
            RayJobs(url).submit(run_id, "true", {}, {"verl-gke.run_id": run_id, "verl-gke.attempt": "0"})
            outputs = write_outputs(tmp_path / "outputs.json", outputs_doc(run_id))
            assert cli.main(["status", "--outputs", str(outputs), "--dashboard-url", url]) == 0
            out = capsys.readouterr().out
            assert re.search(rf"^Ray head +{re.escape(url)}  Ray {version},", out, re.M), out
            assert re.search(rf"^Model export +{export_id}  RUNNING  -> {target}$", out, re.M), out

            os.write(writer, b"7\n")
        finally:
            # On a failure above, a reader still waiting gets end-of-file: the job ends, the head is free.
            os.close(os.open(tracker, os.O_RDWR) if writer is None else writer)
        record = until_released(sup, records, run_id, 120)
    # verl's tracker alone names no model (0.7.0: a step is exported only once its model is whole in the bucket).
    assert record.export_outcome == (f"FAILED: export_model: {checkpoints}: no step whose model is whole in the "
                                     "bucket yet (the tracker's step 7 is not)")
    assert control.calls == [("set_suspended", True)]


def test_cli_export_reports_the_exports_failure_from_the_clusters_ray(
        old_head: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], gcs_emulator: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.gcs_emulator import exports_on_the_emulator, make_bucket

    url, venv = old_head
    python = str(venv / "bin" / "python")
    run_id = f"verl-grpo-c-{uuid.uuid4().hex[:12]}"
    bucket = tmp_path / "bucket"
    make_bucket(gcs_emulator, "verl-data-my-project-123", bucket)  # the export claims the run through its JSON API
    exports_on_the_emulator(monkeypatch, gcs_emulator)
    checkpoints = bucket / "verl" / "checkpoints" / run_id
    checkpoints.mkdir(parents=True)  # the run's folder, before verl's first save
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc(
        run_id, checkpointUri=f"gs://verl-data-my-project-123/verl/checkpoints/{run_id}"))
    code = cli.main(["export", "--outputs", str(outputs), "--dashboard-url", url, "--bucket-mount", str(bucket),
                     "--memory-gb", "0.001", "--python", python, "--poll", "0.5", "--timeout", "120"])
    out, err = capsys.readouterr()
    export_id = f"verl-export-{run_id}-final"
    assert (code, out) == (1, ""), err
    last = err.splitlines()[-1]
    assert last.startswith(f"verl-gke: error: export {export_id} FAILED: "), err
    assert last.endswith(f" | export_model: {checkpoints}/{export_model.TRACKER}: no checkpoint yet "
                         "(verl writes it after its first save)"), err
    info = JobSubmissionClient(url).get_job_info(export_id)
    target = f"{bucket}/models/{run_id}/model"
    assert info.entrypoint == (f"{python} export_model.py --checkpoint-dir {checkpoints} --target-dir {target} "
                               f"--bucket verl-data-my-project-123 --mount {bucket} --export-id {export_id}")
    assert info.metadata == {"verl_gke_export": target}
    assert info.runtime_env["working_dir"].startswith("gcs://_ray_pkg_")  # the SDK uploaded workloads/
    assert driver_resources(url, export_id) == {"CPU": 1.0, "memory": 1e6}
