"""`verl-gke export` when the head already holds an export job of the same submission id (issue 47, item 7):
a finished one is not reported as this export's outcome; a live one is followed, not submitted twice. The
head is a stand-in for Ray's JobSubmissionClient (ray/dashboard/modules/job/sdk.py: list_jobs, submit_job,
which refuses an id it knows, get_job_status, get_job_logs); the export's own behaviour is in
tests/test_export_model.py and tests/test_export_protocol.py."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from verl_gke import cli

RUN = "run-0123456789ab"


class Head:
    """Jobs by submission id; a submitted export runs for one status read, then succeeds."""

    def __init__(self, jobs: dict[str, str]) -> None:
        self.jobs = dict(jobs)
        self.submitted: list[dict] = []

    def list_jobs(self):
        return [SimpleNamespace(submission_id=sid, status=status) for sid, status in self.jobs.items()]

    def submit_job(self, **kwargs):
        if kwargs["submission_id"] in self.jobs:
            raise RuntimeError(f"Job with submission_id {kwargs['submission_id']} already exists")
        self.submitted.append(kwargs)
        self.jobs[kwargs["submission_id"]] = "PENDING"
        return kwargs["submission_id"]

    def get_job_status(self, sid: str) -> str:
        status = self.jobs[sid]
        if status == "PENDING":
            self.jobs[sid] = "SUCCEEDED"
        return status

    def get_job_logs(self, sid: str) -> str:
        return f"export_model: {sid} failed long ago\n"


@pytest.fixture
def outputs(tmp_path: Path) -> Path:
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps({
        "clusterName": "verl-a4", "clusterLocation": "us-central1", "namespace": "default", "runId": RUN,
        "rayHeadService": "svc", "grpoSubmissionId": "verl-grpo-a4-fedcba987654-1", "grpoJobStatus": "SUCCEEDED",
        "dashboardCommand": "kubectl port-forward ...", "gpuPlatform": "a4", "gpuNodes": 2, "gpusPerNode": 8,
        "checkpointUri": f"gs://verl-data-p/verl/checkpoints/{RUN}"}))
    return path


def export(monkeypatch: pytest.MonkeyPatch, outputs: Path, head: Head, *extra: str) -> int:
    @contextmanager
    def reach(args, outs, timeout_s=None):
        yield "http://127.0.0.1:8265"
    monkeypatch.setattr("verl_gke.reach.head", reach)
    monkeypatch.setattr("verl_gke.reach.job_client", lambda url: head)
    return cli.main(["export", "--outputs", str(outputs), "--poll", "0.01", *extra])


def test_an_ended_export_of_the_same_id_is_not_reported_a_new_one_is_submitted(
        monkeypatch: pytest.MonkeyPatch, outputs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    head = Head({f"verl-export-{RUN}-final": "FAILED"})
    assert export(monkeypatch, outputs, head) == 0, capsys.readouterr().err
    assert [k["submission_id"] for k in head.submitted] == [f"verl-export-{RUN}-final-re2"]
    # The export claims the run and publishes through the bucket's JSON API (workloads/export_model.py).
    assert head.submitted[0]["entrypoint"].endswith(
        f"--bucket verl-data-p --mount /data --export-id verl-export-{RUN}-final-re2")
    assert capsys.readouterr().out == f"gs://verl-data-p/models/{RUN}/model\n"
    # Twice ended: the next free id.
    head = Head({f"verl-export-{RUN}-final": "SUCCEEDED", f"verl-export-{RUN}-final-re2": "STOPPED"})
    assert export(monkeypatch, outputs, head) == 0
    assert [k["submission_id"] for k in head.submitted] == [f"verl-export-{RUN}-final-re3"]


def test_a_live_export_of_the_same_id_is_followed_not_submitted_again(
        monkeypatch: pytest.MonkeyPatch, outputs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    head = Head({f"verl-export-{RUN}-final": "FAILED", f"verl-export-{RUN}-final-re2": "PENDING"})
    assert export(monkeypatch, outputs, head) == 0
    assert head.submitted == []
    assert head.jobs[f"verl-export-{RUN}-final-re2"] == "SUCCEEDED"
