"""Model delivery by the run supervisor: a run that succeeded is merged with verl's own merger (the
pinned wheel) as a real Ray job on a real head, claimed once in the run record (kept through the
Kubernetes API stand-in), bounded, recorded, and only then are the GPU workers released."""

from __future__ import annotations

import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from ray.job_submission import JobSubmissionClient

from domain.platforms import VERL_0_9_0
from domain.verl_wheel import unpacked
from tests.kube_api import kube_api
from tests.ray_head import RayHead
from tests.test_export_model import tiny_checkpoint
from tests.test_run_supervisor import RecordingControl
from workloads.kube import KubernetesApi
from workloads.run_lifecycle import SUCCEEDED, Decider, RayJobs
from workloads.run_record import RecordStore, RunRecord
from workloads.run_supervisor import SupervisorConfig, decider

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]
# The ray_cluster head: the last test leaves a job Ray cannot stop (see there), which ends with the head;
# the modules after this one share the head but never see it (their JobViews list their own jobs).


class CountingJobs(RayJobs):
    """The real REST client, noting each submission it makes."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.submitted: list[tuple[str, dict[str, Any]]] = []

    def submit(self, submission_id: str, *args: Any, **resources: float) -> None:
        self.submitted.append((submission_id, resources))
        super().submit(submission_id, *args, **resources)


@pytest.fixture
def records():
    with kube_api() as (url, _state):
        yield RecordStore(KubernetesApi(url), "ray", "b200-ray-cluster")


def succeeded_run(records: RecordStore) -> str:
    """A run whose attempt succeeded (each test's run on a cluster, and so a Lease, of its own)."""
    run_id = f"verl-grpo-t-{uuid.uuid4().hex[:12]}"  # the session's head is shared: ids of its own
    records.ray_cluster = f"rc-{run_id[-12:]}"
    records.write(records.get(run_id), RunRecord(run_id, outcome=SUCCEEDED))
    return run_id


def supervisor(head: str, records: RecordStore, run_id: str, control: RecordingControl,
               export: dict[str, Any] | None, **config: Any) -> Decider:
    return decider(SupervisorConfig(
        head_url=head, submission_ids=[run_id], entrypoint="unused", runtime_env={}, expected_workers=1,
        expected_gpus=1, run_id=run_id, export=export, poll_s=0.5, **config), records.api, "ray", records.ray_cluster,
        log=lambda _line: None, ray=CountingJobs(head), control=control)


def until_released(sup: Decider, records: RecordStore, run_id: str, timeout_s: float) -> RunRecord:
    deadline = time.monotonic() + timeout_s
    while not (record := records.get(run_id).record).released:
        assert time.monotonic() < deadline, f"not released within {timeout_s} s: {record}"
        sup.step()
        time.sleep(0.5)
    return record


def export_config(bucket: Path, run_id: str, **extra: Any) -> dict[str, Any]:
    # The loopback head's own venv has Ray only; the test venv has verl's dependencies.
    return {"checkpoint_dir": str(bucket / "ck" / run_id), "mount": str(bucket),
            "verl_dir": str(unpacked(VERL_0_9_0)), "python": sys.executable, **extra}


def test_a_succeeded_run_is_exported_once_across_a_restart_then_the_workers_go(ray_cluster: RayHead, records, tmp_path,
                                                                               capsys):
    import torch
    from transformers import AutoModelForCausalLM

    bucket = tmp_path / "bucket"
    run_id = succeeded_run(records)
    model = tiny_checkpoint(bucket / "ck" / run_id, step=3, seed=3)
    export = export_config(bucket, run_id, memory_bytes=10**6)
    control = RecordingControl()
    first = supervisor(ray_cluster.dashboard_url, records, run_id, control, export)
    first.step()  # claims and submits, then "dies" (SIGTERM: the Lease is left free)
    first.lease.release()
    export_id = f"verl-export-{run_id}-final-0"
    record = records.get(run_id).record
    assert (record.export_id, record.export_target, record.export_outcome) == (export_id, f"{bucket}/models/{run_id}/model", "")
    assert first.ray.submitted == [(export_id, {"entrypoint_memory": 10**6, "entrypoint_num_cpus": 1})]
    assert control.calls == [] and not record.released  # the workers stay while the merge runs

    second = supervisor(ray_cluster.dashboard_url, records, run_id, control, export)  # a restarted supervisor
    record = until_released(second, records, run_id, 300)
    assert second.ray.submitted == []  # adopted from the record, not submitted again
    info = JobSubmissionClient(ray_cluster.dashboard_url).get_job_info(export_id)
    # (The job's details show no entrypoint resources; the next-but-one test shows Ray honours them.)
    assert info.status == "SUCCEEDED"
    assert info.runtime_env["working_dir"].startswith("gcs://_ray_pkg_")
    assert record.export_outcome == "SUCCEEDED"
    assert control.calls == [("set_suspended", True)]
    decisions = [d.split(" ", 1)[1] for d in record.decisions]
    assert decisions.index("model export ended: SUCCEEDED") < decisions.index("GPU workers released")
    loaded = AutoModelForCausalLM.from_pretrained(bucket / "models" / run_id / "model", torch_dtype="auto")
    for key, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], tensor.to(torch.bfloat16)), key
    assert not (bucket / "models" / run_id / "model.partial").exists()

    from tests.test_cli import outputs_doc, write_outputs
    from verl_gke import cli

    # An attempt of the run on the head, tagged with its run id as every attempt is: status finds the
    # run's export by it.
    RayJobs(ray_cluster.dashboard_url).submit(run_id, "true", {}, {"verl-gke.run_id": run_id, "verl-gke.attempt": "0"})
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc(run_id))
    assert cli.main(["status", "--outputs", str(outputs), "--dashboard-url", ray_cluster.dashboard_url]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"^Model export +{export_id}  SUCCEEDED  -> {bucket}/models/{run_id}/model$", out, re.M), out


def test_a_failed_export_is_recorded_and_the_workers_are_released(ray_cluster: RayHead, records, tmp_path):
    bucket = tmp_path / "bucket"
    run_id = succeeded_run(records)  # and no checkpoint in its folder
    control = RecordingControl()
    record = until_released(supervisor(ray_cluster.dashboard_url, records, run_id, control, export_config(bucket, run_id)),
                            records, run_id, 120)
    assert record.export_outcome == (f"FAILED: export_model: {bucket}/ck/{run_id}/latest_checkpointed_iteration.txt: "
                                     "no checkpoint yet (verl writes it after its first save)")
    assert control.calls == [("set_suspended", True)]


def test_an_older_generations_success_is_exported_under_its_own_generation(ray_cluster: RayHead, records, tmp_path):
    """A jobAttempt bump's `up` that failed before the new generation began: the new supervisor
    exports the older generation's final model (here none was written) and releases its workers.
    (It runs before the bound test, whose export stays PENDING: a release waits for live jobs.)"""
    run_id = succeeded_run(records)
    control = RecordingControl()
    sup = supervisor(ray_cluster.dashboard_url, records, run_id, control, export_config(tmp_path, run_id), generation=1)
    record = until_released(sup, records, run_id, 120)
    assert (record.generation, record.export_id) == (0, f"verl-export-{run_id}-final-0")
    assert record.export_outcome.startswith("FAILED: export_model: ") and control.calls == [("set_suspended", True)]

# exportModel off (released at once, nothing exported) is a rule of decide() alone:
# test_run_lifecycle::test_with_export_model_off_a_succeeded_run_releases_the_workers_at_once.


def test_an_export_past_its_bound_is_stopped_recorded_and_the_workers_released(ray_cluster: RayHead, records, tmp_path):
    run_id = succeeded_run(records)
    control = RecordingControl()
    # Memory no node has (10 TB; the first test's export, with 1 MB, ran): the export stays PENDING until its bound.
    sup = supervisor(ray_cluster.dashboard_url, records, run_id, control, export_config(tmp_path, run_id, memory_bytes=10**13),
                     export_timeout_s=5.0)
    record = until_released(sup, records, run_id, 120)
    assert record.export_outcome == "FAILED: not done within 5 s"
    # Ray queues the stop for a driver that never got a node: the job stays PENDING until Ray's own
    # start timeout (RAY_JOB_START_TIMEOUT_SECONDS) and is not waited for; it never ran.
    assert JobSubmissionClient(ray_cluster.dashboard_url).get_job_status(record.export_id) in ("PENDING", "STOPPED")
    assert control.calls == [("set_suspended", True)]

