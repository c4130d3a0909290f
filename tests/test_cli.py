"""The `verl-gke` CLI against a real Ray head on loopback (the `ray_head` fixture), plus its error paths.

Jobs are submitted with Ray's own JobSubmissionClient and print lines in verl's console format;
the CLI reaches the head with `--dashboard-url`, as it would a privately reachable dashboard.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import ray
from matplotlib.image import imread
from ray.job_submission import JobStatus, JobSubmissionClient

from tests.ray_head import FlakyLink, free_ports
from verl_gke import cli, cmd_logs, cmd_status, reach, runs, stack_outputs
from verl_gke.stack_outputs import OutputsError


JOB_TIMEOUT_S = 90.0
REPO = Path(__file__).resolve().parent.parent
CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\ntest cluster CA\n-----END CERTIFICATE-----\n").decode()
GKE_CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nthe CA GKE states\n-----END CERTIFICATE-----\n").decode()
GKE_ENDPOINT = "34.9.9.9"


@pytest.fixture
def fake_gcloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `gcloud` first on PATH that records its arguments and answers `container clusters describe`
    with the fields of GKE's Cluster resource the CLI reads (`endpoint`, `masterAuth.clusterCaCertificate`:
    cloud.google.com/kubernetes-engine/docs/reference/rest/v1/projects.locations.clusters#Cluster), or,
    with FAKE_GCLOUD_FAIL, exits 1 with that line as gcloud does for a cluster it cannot find."""
    bin_dir = tmp_path / "gcloud-bin"
    bin_dir.mkdir()
    answer = tmp_path / "gcloud-answer.json"
    answer.write_text(json.dumps({"name": "verl-a4", "endpoint": GKE_ENDPOINT, "status": "RUNNING",
                                  "masterAuth": {"clusterCaCertificate": GKE_CA}}))
    script = bin_dir / "gcloud"
    script.write_text(
        "#!/bin/bash\n"
        'printf "%s\\n" "$@" > "$FAKE_GCLOUD_RECORD"\n'
        'if [[ -n $FAKE_GCLOUD_FAIL ]]; then echo "$FAKE_GCLOUD_FAIL" >&2; exit 1; fi\n'
        f'cat "{answer}"\n'
    )
    script.chmod(0o755)
    record = tmp_path / "gcloud-args"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GCLOUD_RECORD", str(record))
    monkeypatch.delenv("FAKE_GCLOUD_FAIL", raising=False)
    return record

# What the job prints: Ray-style noise, a coloured task prefix, and one verl console line per step
# (aggregate_logger.concat_dict_to_str: `step:N - key:value` with values formatted :.3f).
JOB_SCRIPT = r"""
import sys, time
rewards = [0.1, 0.2, 0.25, 0.35, 0.3, 0.45, 0.5, 0.6]
print("INFO worker.py:1852 -- Connecting to existing Ray cluster", flush=True)
for step, reward in enumerate(rewards, start=1):
    line = " - ".join([f"step:{step}", f"critic/score/mean:{reward:.3f}", f"perf/throughput:{1500 + 10 * step:.3f}",
                       f"perf/time_per_step:{100 - step:.3f}", f"actor/entropy:{0.7 - step / 100:.3f}"])
    prefix = "\x1b[36m(TaskRunner pid=4242)\x1b[0m " if step % 2 else "(TaskRunner pid=4242) "
    print(prefix + line, flush=True)
    print(f"(TaskRunner pid=4242) Training Progress: {step}/8", flush=True)
    time.sleep(float(sys.argv[1]))
"""

EXPECTED_TABLE = [
    "step  critic/score/mean  perf/throughput  perf/time_per_step",
    "   1              0.100         1510.000              99.000",
    "   2              0.200         1520.000              98.000",
    "   3              0.250         1530.000              97.000",
    "   4              0.350         1540.000              96.000",
    "   5              0.300         1550.000              95.000",
    "   6              0.450         1560.000              94.000",
    "   7              0.500         1570.000              93.000",
    "   8              0.600         1580.000              92.000",
]


def submit(url: str, step_sleep_s: float = 0.0, entrypoint: str | None = None) -> str:
    submission_id = f"cli-test-{uuid.uuid4().hex[:8]}"
    command = entrypoint or f"python -c '{JOB_SCRIPT}' {step_sleep_s}"
    JobSubmissionClient(url).submit_job(entrypoint=command, submission_id=submission_id)
    return submission_id


def wait_until_done(url: str, submission_id: str) -> JobStatus:
    client = JobSubmissionClient(url)
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while (status := client.get_job_status(submission_id)) not in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}:
        assert time.monotonic() < deadline, f"job {submission_id} still {status} after {JOB_TIMEOUT_S} s"
        time.sleep(0.5)
    return status


def outputs_doc(submission_id: str, **changes: Any) -> dict[str, Any]:
    """Stack outputs shaped like `pulumi stack output --json` of an A4 stack (secrets masked)."""
    doc: dict[str, Any] = {
        "bucketName": "verl-data-my-project-123",
        "bucketUrl": "gs://verl-data-my-project-123",
        "checkpointUri": "gs://verl-data-my-project-123/verl/checkpoints",
        "clusterLocation": "us-central1",
        "clusterName": "verl-a4",
        "dashboardCommand": "kubectl port-forward svc/b200-ray-cluster-head-svc :8265 -n default --address 127.0.0.1",
        "gpuNodes": 2,
        "gpuPlatform": "a4",
        "gpusPerNode": 8,
        "grpoJobStatus": "RUNNING",
        "grpoSubmissionId": submission_id,
        "kubeconfig": "[secret]",
        "namespace": "default",
        "rayClusterName": "b200-ray-cluster",
        "rayHeadService": "b200-ray-cluster-head-svc",
        "fabricBusBandwidthGbps": 361.5,
        "hourlyCostUsd": 184.94,
        # The a4 plan's model (domain/run_time.py), as `pulumi up` exports it.
        "modeledStepSeconds": 43.8,
        "modeledRunSeconds": 2712.3,
        "preflightChecks": ["GKE 1.34.1-gke.1829001 from the REGULAR channel",
                            "reservation my-reservation: 2 of 2 a4-highgpu-8g free"],
    }
    doc.update(changes)
    return {key: value for key, value in doc.items() if value is not None}


def write_outputs(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="session")  # on the worker's session head: the file's tests then go to any worker
def finished_job(ray_head: str) -> str:
    submission_id = submit(ray_head)
    assert wait_until_done(ray_head, submission_id) == JobStatus.SUCCEEDED
    return submission_id


@pytest.fixture
def outputs_file(tmp_path: Path, finished_job: str) -> Path:
    return write_outputs(tmp_path / "outputs.json", outputs_doc(finished_job))


@pytest.fixture
def no_pulumi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A PATH without the pulumi CLI (none is installed here, but make it certain)."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    yield


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def error_line(err: str) -> str:
    """The CLI's error: exactly one line, and no traceback anywhere."""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("verl-gke: error:")]
    assert len(lines) == 1, err
    return lines[0]


# --- Against the real head ----------------------------------------------------------------------


@pytest.mark.ray
def test_status_shows_cluster_head_workers_gpus_and_job_on_one_screen(
        capsys: pytest.CaptureFixture[str], ray_head: str, finished_job: str, outputs_file: Path) -> None:
    code, out, _ = run(capsys, "status", "--outputs", str(outputs_file), "--dashboard-url", ray_head)
    job = JobSubmissionClient(ray_head).get_job_info(finished_job)
    # The spend: the job's own start and end times in Ray's job info, at hourlyCostUsd.
    spend = round((job.end_time - job.start_time) / 1000 / 3600 * 184.94, 2)
    assert code == 0
    assert out.splitlines() == [
        "Run            checkpoints",  # the outputs' runId: the handle, first
        f"Stack outputs  {outputs_file}",
        "Cluster        verl-a4 in us-central1, platform a4, 2 GPU nodes x 8 GPUs",
        f"Ray head       {ray_head}  Ray {ray.__version__}, svc/b200-ray-cluster-head-svc in namespace default",
        # The loopback head is alone and has no GPU: no worker has joined.
        "Workers        0 of 2 joined",
        "GPUs visible   0 of 16  <- 16 GPUs not joined yet",
        f"GRPO job       {finished_job}  SUCCEEDED (Pulumi last saw RUNNING)",
        "Job message    Job finished successfully.",
        f"Spend          ${spend:.2f} since the first attempt started, at $184.94/h (run ended)",
        "Fabric         361.5 GB/s all-reduce bus bandwidth when the job was created",
        "Preflight      GKE 1.34.1-gke.1829001 from the REGULAR channel",
        "Preflight      reservation my-reservation: 2 of 2 a4-highgpu-8g free",
        "Checkpoints    gs://verl-data-my-project-123/verl/checkpoints",
        "Dashboard      kubectl port-forward svc/b200-ray-cluster-head-svc :8265 -n default --address 127.0.0.1",
    ]


@pytest.mark.ray
def test_logs_prints_the_jobs_output(
        capsys: pytest.CaptureFixture[str], ray_head: str, outputs_file: Path) -> None:
    code, out, _ = run(capsys, "logs", "--outputs", str(outputs_file), "--dashboard-url", ray_head)
    assert code == 0
    assert "\x1b[36m(TaskRunner pid=4242)\x1b[0m step:1 - critic/score/mean:0.100 - perf/throughput:1510.000" in out
    assert "(TaskRunner pid=4242) step:8 - critic/score/mean:0.600 - perf/throughput:1580.000" in out
    assert "(TaskRunner pid=4242) Training Progress: 8/8" in out


HOSTILE_LOG = ("print(chr(27) + \"]52;c;Y3VybCBldmlsfHNo\" + chr(7) + \"clip\"); "
               "print(\"  ::add-mask::x\"); print(\"##[set-env name=A]b\"); print(chr(27) + \"[2Kdone\")")


@pytest.mark.ray
@pytest.mark.filterwarnings("ignore:ssl=None is deprecated:DeprecationWarning")  # inside Ray's log tail
def test_a_jobs_log_reaches_the_terminal_and_ci_inert(
        capsys: pytest.CaptureFixture[str], ray_head: str, no_pulumi: None) -> None:
    submission_id = submit(ray_head, entrypoint=f"python -c '{HOSTILE_LOG}'")
    assert wait_until_done(ray_head, submission_id) == JobStatus.SUCCEEDED
    for follow in ([], ["--follow"]):
        code, out, _ = run(capsys, "logs", *follow, "--dashboard-url", ray_head, "--submission-id", submission_id)
        assert code == 0
        assert out.splitlines()[-4:] == ["clip", "  > ::add-mask::x", "> ##[set-env name=A]b", "done"], follow


@pytest.mark.ray
@pytest.mark.filterwarnings("ignore:ssl=None is deprecated:DeprecationWarning")  # inside Ray's log tail
def test_logs_follow_streams_a_running_job_until_it_ends(
        capsys: pytest.CaptureFixture[str], ray_head: str, no_pulumi: None) -> None:
    submission_id = submit(ray_head, step_sleep_s=0.4)
    # --dashboard-url and --submission-id together need no stack outputs at all.
    code, out, err = run(capsys, "logs", "--follow", "--dashboard-url", ray_head, "--submission-id", submission_id)
    assert code == 0
    assert re.findall(r"step:(\d) - critic/score/mean:", out) == [str(step) for step in range(1, 9)]
    assert out.rstrip().endswith("(TaskRunner pid=4242) Training Progress: 8/8")
    assert f"verl-gke: job {submission_id} is SUCCEEDED: Job finished successfully." in err.splitlines()


@pytest.mark.ray
def test_metrics_from_the_jobs_logs_table_verdict_and_plot(
        capsys: pytest.CaptureFixture[str], ray_head: str, outputs_file: Path, tmp_path: Path) -> None:
    plot = tmp_path / "reward.png"
    code, out, err = run(capsys, "metrics", "--outputs", str(outputs_file), "--dashboard-url", ray_head,
                         "--plot", str(plot))
    assert code == 0
    lines = out.splitlines()
    assert lines[:9] == EXPECTED_TABLE
    assert lines[9] == ("critic/score/mean: RISING over 8 steps (slope +0.06607/step, "
                        "first quarter mean 0.150, last quarter mean 0.550)")
    assert lines[10].startswith("rule: rising = least-squares slope")
    # 95.5 s / 43.8 s = 2.18x the model; 2.18 x 2,712.3 s = 98.6 min at this pace, 45.2 min modeled.
    assert lines[11] == ("Step time: measured 96 s (mean of 8 steps), modeled 44 s: 2.18x the model, so the run takes "
                         "~99 min at this pace, not the modeled ~45; the model assumes 30% MFU in training (docs/verl-settings.md)")
    assert lines[12] == f"plot: {plot}"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert imread(plot).shape == (450, 800, 4)
    assert "error" not in err


@pytest.mark.ray
def test_metrics_extra_keys_and_an_absent_key(
        capsys: pytest.CaptureFixture[str], ray_head: str, outputs_file: Path) -> None:
    code, out, err = run(capsys, "metrics", "--outputs", str(outputs_file), "--dashboard-url", ray_head,
                         "--keys", "actor/entropy,critic/vf_loss")
    assert code == 0
    header, first = out.splitlines()[:2]
    assert header.split() == ["step", "critic/score/mean", "perf/throughput", "perf/time_per_step",
                              "actor/entropy", "critic/vf_loss"]
    assert first.split() == ["1", "0.100", "1510.000", "99.000", "0.690", "-"]
    assert "verl-gke: metric critic/vf_loss appears in no step" in err.splitlines()


@pytest.mark.ray
def test_wait_exits_zero_for_a_job_that_succeeded(
        capsys: pytest.CaptureFixture[str], ray_head: str, finished_job: str, outputs_file: Path) -> None:
    code, out, err = run(capsys, "wait", "--outputs", str(outputs_file), "--dashboard-url", ray_head, "--poll", "0.5")
    assert code == 0
    assert out == f"job {finished_job} SUCCEEDED\n"
    assert f"verl-gke: job {finished_job}: SUCCEEDED after 0m00s" in err.splitlines()


@pytest.mark.ray
def test_wait_fails_with_one_line_for_a_failed_job(
        capsys: pytest.CaptureFixture[str], ray_head: str, tmp_path: Path) -> None:
    submission_id = submit(ray_head, entrypoint="python -c 'import sys; sys.exit(3)'")
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc(submission_id))
    code, _, err = run(capsys, "wait", "--outputs", str(outputs), "--dashboard-url", ray_head, "--poll", "0.5")
    assert code == 4  # failed (docs/runs.md); 1 is the command's own failure
    assert error_line(err).startswith(f"verl-gke: error: job {submission_id} ended FAILED: ")


@pytest.mark.ray
def test_wait_gives_up_after_its_timeout(
        capsys: pytest.CaptureFixture[str], ray_head: str, tmp_path: Path) -> None:
    submission_id = submit(ray_head, entrypoint="sleep 30")
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc(submission_id))
    try:
        code, _, err = run(capsys, "wait", "--outputs", str(outputs), "--dashboard-url", ray_head,
                           "--poll", "1", "--timeout", "1")
        assert code == 8  # the timeout's own status: the job goes on
        assert re.fullmatch(
            rf"verl-gke: error: job {submission_id} is still (PENDING|RUNNING) after 0m0\ds \(--timeout 1 s\)",
            error_line(err))
    finally:
        JobSubmissionClient(ray_head).stop_job(submission_id)


@pytest.mark.ray
def test_an_unknown_job_is_one_line_naming_it_and_the_head(
        capsys: pytest.CaptureFixture[str], ray_head: str, tmp_path: Path) -> None:
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc("raysubmit_doesnotexist"))
    code, _, err = run(capsys, "wait", "--outputs", str(outputs), "--dashboard-url", ray_head)
    assert code == 1
    line = error_line(err)
    assert line.startswith(f"verl-gke: error: reading job raysubmit_doesnotexist at {ray_head} failed: ")
    assert "does not exist" in line


@pytest.mark.ray
def test_status_still_shows_the_cluster_when_the_head_lost_the_job(
        capsys: pytest.CaptureFixture[str], ray_head: str, tmp_path: Path) -> None:
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc("raysubmit_doesnotexist"))
    code, out, _ = run(capsys, "status", "--outputs", str(outputs), "--dashboard-url", ray_head)
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == "Run            checkpoints"
    assert lines[2] == "Cluster        verl-a4 in us-central1, platform a4, 2 GPU nodes x 8 GPUs"
    assert lines[6] == "GRPO job       raysubmit_doesnotexist  UNREADABLE (Pulumi last saw RUNNING)"
    assert lines[7].startswith(f"Job message    reading job raysubmit_doesnotexist at {ray_head} failed: ")
    _assert_status_help_names(out)


def test_status_of_an_ended_run_whose_head_is_gone_comes_from_the_run_record(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The run supervisor suspends the RayCluster when the run is over: no head to ask, so the
    status comes from the run record ConfigMap (here a `kubectl proxy`-like loopback API)."""
    from tests.kube_api import kube_api
    from workloads.kube import KubernetesApi
    from workloads.run_lifecycle import SUCCEEDED
    from workloads.run_record import Attempt, RecordStore, RunRecord

    (closed,) = free_ports(1)
    doc = outputs_doc("verl-gke-0123456789ab-0", checkpointUri="gs://verl-data-my-project-123/verl/checkpoints/run-1")
    outputs = write_outputs(tmp_path / "outputs.json", doc)
    argv = ("status", "--outputs", str(outputs), "--dashboard-url", f"http://127.0.0.1:{closed}", "--head-timeout", "1")
    with kube_api() as (url, _state):
        records = RecordStore(KubernetesApi(url), "default", "b200-ray-cluster")
        ended = RunRecord("run-1", attempts=(Attempt(index=0, submission_id="verl-gke-0123456789ab-0", by="pulumi-up",
                                                     cause="first", submitted=True),),
                          outcome=SUCCEEDED).decided("run ended: succeeded", 1_700_003_600.0)
        stored = records.write(records.get("run-1"), ended)

        # Ended but not yet released: the head should be there, so its error stands.
        code, out, err = run(capsys, *argv, "--kube-api-url", url)
        assert code == 1 and out == ""
        assert error_line(err).startswith(f"verl-gke: error: Ray dashboard at http://127.0.0.1:{closed} did not answer")

        records.write(stored, replace(ended, released=True))
        code, out, err = run(capsys, *argv, "--kube-api-url", url)
        assert code == 0, err
        assert out.splitlines() == [
            "Run            run-1  ended SUCCEEDED",
            f"Stack outputs  {outputs}",
            "Cluster        verl-a4 in us-central1, platform a4, 2 GPU nodes x 8 GPUs",
            "Ray head       none: the run ended and the run supervisor released the GPU workers by suspending the "
            "RayCluster (the head and its logs went with them)",
            "Attempt 0      pulumi-up, first",
            "Last decision  2023-11-14T23:13:20Z run ended: succeeded",
            "Checkpoints    gs://verl-data-my-project-123/verl/checkpoints/run-1",
            "Resume         a new run, or `pulumi config set verl-gke:jobAttempt <n+1>` and `pulumi up`, resumes "
            "the RayCluster",
        ]
        _assert_status_help_names(out)
        # The submission ids only when asked for.
        code, out, err = run(capsys, *argv, "--kube-api-url", url, "--verbose")
        assert "Attempt 0      pulumi-up, first; Ray submission id verl-gke-0123456789ab-0" in out.splitlines()

    # No record to read either: both reasons in one line.
    code, _, err = run(capsys, *argv, "--kube-api-url", f"http://127.0.0.1:{closed}")
    assert code == 1
    line = error_line(err)
    assert line.startswith(f"verl-gke: error: Ray dashboard at http://127.0.0.1:{closed} did not answer")
    assert "; the run record was not readable either: " in line


@pytest.mark.ray
def test_status_never_prints_secrets(
        capsys: pytest.CaptureFixture[str], ray_head: str, finished_job: str, tmp_path: Path) -> None:
    # Even outputs saved with --show-secrets by mistake: the kubeconfig is never read or shown.
    kubeconfig = "apiVersion: v1\nusers:\n- name: u\n  user:\n    token: ya29.super-secret-token\n"
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc(finished_job, kubeconfig=kubeconfig))
    code, out, err = run(capsys, "status", "--outputs", str(outputs), "--dashboard-url", ray_head)
    assert code == 0
    assert "super-secret" not in out + err


@pytest.fixture
def gke_api(ray_head: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    """The cluster's API as the Kubernetes API stand-in, whose head pod's 8265 is the real head: the
    CLI's cluster_api is given (and records) the endpoint and CA it would use on GCP."""
    from tests.kube_api import kube_api
    from workloads.kube import KubernetesApi

    asked: list[tuple[str, str | None]] = []
    with kube_api() as (url, state):
        state.add_head("default", "b200-ray-cluster-head-svc", "b200-ray-cluster-head-x", int(ray_head.rsplit(":", 1)[1]))

        def stand_in(endpoint: str, ca: str | None, timeout_s: float) -> KubernetesApi:
            asked.append((endpoint, ca))
            return KubernetesApi(url, timeout_s=timeout_s)

        monkeypatch.setattr(reach, "cluster_api", stand_in)
        monkeypatch.setattr(runs, "cluster_api", stand_in)
        yield url, asked


@pytest.mark.ray
def test_status_through_a_port_forward_the_way_the_job_provider_reaches_the_head(
        capsys: pytest.CaptureFixture[str], ray_head: str, finished_job: str, tmp_path: Path,
        gke_api: tuple[str, list[tuple[str, str | None]]], fake_gcloud: Path) -> None:
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc(
        finished_job, clusterEndpoint="34.1.2.3", clusterCaCertificate=CA))
    code, out, err = run(capsys, "status", "--outputs", str(outputs))
    assert code == 0, err
    # Through the local proxy (shown without its session's secret) and a stream through the cluster's API.
    assert re.search(rf"^Ray head       http://127\.0\.0\.1:\d+  Ray {re.escape(ray.__version__)}, "
                     "svc/b200-ray-cluster-head-svc in namespace default$", out, re.M), out
    assert f"GRPO job       {finished_job}  SUCCEEDED (Pulumi last saw RUNNING)" in out
    assert ("verl-gke: opening a port-forward to svc/b200-ray-cluster-head-svc in namespace default "
            "of cluster verl-a4") in err.splitlines()
    # GKE's endpoint and CA, not the file's.
    assert set(gke_api[1]) == {(GKE_ENDPOINT, GKE_CA)}
    assert fake_gcloud.read_text().splitlines() == ["container", "clusters", "describe", "verl-a4", "--location",
                                                    "us-central1", "--format", "json"]


def _in_a_terminal() -> None:
    """The child takes Ctrl-C as a foreground command does: a shell that started the suite in the
    background left SIGINT ignored, and Python then installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)

@pytest.mark.ray
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_dashboard_holds_the_port_forward_until_ctrl_c_or_sigterm_and_then_cleans_up(
        ray_head: str, tmp_path: Path, gke_api: tuple[str, list[tuple[str, str | None]]], fake_gcloud: Path,
        sig: signal.Signals) -> None:
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc(
        "raysubmit_1", clusterEndpoint="34.1.2.3", clusterCaCertificate=CA))
    process = subprocess.Popen([sys.executable, "-m", "verl_gke", "dashboard", "--outputs", str(outputs),
                                "--kube-api-url", gke_api[0]],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                               preexec_fn=_in_a_terminal)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert re.fullmatch(r"Ray dashboard: http://127\.0\.0\.1:\d+/[\w-]{43}/\n", line), line
        proxied = line.removeprefix("Ray dashboard: ").strip()
        with urllib.request.urlopen(f"{proxied}api/version", timeout=30) as answer:  # the head, through the proxy
            assert json.load(answer)["ray_version"] == ray.__version__
        process.send_signal(sig)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0
    assert "verl-gke: closing the port-forward" in err.splitlines()
    with pytest.raises(OSError):  # the proxy, the one way in, closed with the command
        urllib.request.urlopen(f"{proxied}api/version", timeout=5)


@pytest.mark.ray
def test_dashboard_closes_its_port_forward_when_its_time_is_up(
        ray_head: str, tmp_path: Path, gke_api: tuple[str, list[tuple[str, str | None]]], fake_gcloud: Path) -> None:
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc("raysubmit_1"))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "verl_gke", "dashboard", "--outputs", str(outputs), "--minutes", "0.02",
                           "--kube-api-url", gke_api[0]], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started >= 1.2
    assert "verl-gke: closing the port-forward after 0.02 min" in done.stderr.splitlines()


@pytest.mark.ray
def test_dashboard_with_a_directly_reachable_head_just_prints_it(
        capsys: pytest.CaptureFixture[str], ray_head: str, no_pulumi: None) -> None:
    code, out, _ = run(capsys, "dashboard", "--dashboard-url", ray_head + "/")
    assert (code, out) == (0, f"Ray dashboard: {ray_head}\n")


# --- Error paths without a head -----------------------------------------------------------------


def test_unreachable_head_is_one_line_naming_the_address(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_ports(1)[0]}"
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc("raysubmit_x"))
    code, out, err = run(capsys, "status", "--outputs", str(outputs), "--dashboard-url", url, "--head-timeout", "1")
    assert code == 1
    assert out == ""
    assert error_line(err).startswith(f"verl-gke: error: Ray dashboard at {url} did not answer GET /api/version within 1 s")


def test_missing_outputs_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    code, _, err = run(capsys, "status", "--outputs", str(missing))
    assert code == 1
    assert error_line(err) == f"verl-gke: error: stack outputs file {missing} does not exist"


def test_outputs_file_that_is_not_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "outputs.json"
    bad.write_text('{"clusterName": "verl-a4",\n  oops}')
    code, _, err = run(capsys, "logs", "--outputs", str(bad))
    assert code == 1
    assert error_line(err) == (f"verl-gke: error: {bad} is not valid JSON "
                               "(line 2, column 3: Expecting property name enclosed in double quotes)")


def test_outputs_lacking_keys_are_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc("x", grpoSubmissionId=None, rayHeadService=None))
    code, _, err = run(capsys, "status", "--outputs", str(outputs))
    assert code == 1
    assert error_line(err) == (f"verl-gke: error: {outputs} lacks stack outputs rayHeadService, grpoSubmissionId "
                               "(is it from `pulumi stack output --json` of a verl-gke stack?)")


def test_no_outputs_file_and_no_pulumi_cli(capsys: pytest.CaptureFixture[str], no_pulumi: None) -> None:
    code, _, err = run(capsys, "status")
    assert code == 1
    assert error_line(err).startswith("verl-gke: error: no stack outputs: the pulumi CLI is not on PATH; pass --outputs FILE")


@pytest.mark.ray
def test_an_outputs_file_never_decides_where_the_users_credentials_go(
        capsys: pytest.CaptureFixture[str], ray_head: str, finished_job: str, tmp_path: Path,
        gke_api: tuple[str, list[tuple[str, str | None]]], fake_gcloud: Path) -> None:
    """A file naming an attacker's endpoint and CA: the API the CLI talks to is GKE's instead."""
    evil_ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nattacker\n-----END CERTIFICATE-----\n").decode()
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc(
        finished_job, clusterEndpoint="attacker.example", clusterCaCertificate=evil_ca))
    code, _, err = run(capsys, "status", "--outputs", str(outputs))
    assert code == 0, err
    assert set(gke_api[1]) == {(GKE_ENDPOINT, GKE_CA)}


def test_a_cluster_gke_does_not_know_stops_before_any_port_forward(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, fake_gcloud: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_GCLOUD_FAIL", "ERROR: (gcloud.container.clusters.describe) ResponseError: code=404, "
                                           "message=Not found: projects/p/locations/us-central1/clusters/verl-a4.")
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc("x", clusterEndpoint="34.1.2.3",
                                                                   clusterCaCertificate=CA))
    code, _, err = run(capsys, "dashboard", "--outputs", str(outputs))
    assert code == 1
    assert error_line(err) == ("verl-gke: error: `gcloud container clusters describe verl-a4 --location us-central1` "
                               "failed (exit 1): ERROR: (gcloud.container.clusters.describe) ResponseError: code=404, "
                               "message=Not found: projects/p/locations/us-central1/clusters/verl-a4.")


def test_gcloud_answers_are_checked(tmp_path: Path, fake_gcloud: Path) -> None:
    from verl_gke import gke_facts

    assert gke_facts.describe("verl-a4", "us-central1") == gke_facts.ClusterFacts(GKE_ENDPOINT, GKE_CA)
    answer = tmp_path / "gcloud-answer.json"
    answer.write_text(json.dumps({"endpoint": GKE_ENDPOINT, "masterAuth": {"clusterCaCertificate": "bm90IGEgUEVN"}}))
    with pytest.raises(gke_facts.GkeLookupError, match="a CA that is not a base64 PEM certificate"):
        gke_facts.describe("verl-a4", "us-central1")
    answer.write_text("[]")
    with pytest.raises(gke_facts.GkeLookupError, match="did not answer a cluster with endpoint"):
        gke_facts.describe("verl-a4", "us-central1")


GKE_DNS_ENDPOINT = "gke-1a2b3c4d5e6f4a5b8c9d0e1f2a3b4c5d6e7f-123456789012.us-central1.gke.goog"


@pytest.mark.parametrize(("endpoints", "expected"), [
    # verl-gke's default: the DNS endpoint takes user traffic, the IP endpoint is closed to outside addresses.
    ({"dnsEndpointConfig": {"endpoint": GKE_DNS_ENDPOINT, "allowExternalTraffic": True},
      "ipEndpointsConfig": {"enabled": True}}, GKE_DNS_ENDPOINT),
    # IP endpoint off: the DNS endpoint is the only way in (gcloud picks it without --dns-endpoint too).
    ({"dnsEndpointConfig": {"endpoint": GKE_DNS_ENDPOINT}, "ipEndpointsConfig": {"enabled": False}},
     GKE_DNS_ENDPOINT),
    # controlPlaneEndpoint: ip (or a cluster made before): GKE lists a DNS endpoint that refuses user traffic.
    ({"dnsEndpointConfig": {"endpoint": GKE_DNS_ENDPOINT}, "ipEndpointsConfig": {"enabled": True}}, GKE_ENDPOINT),
    (None, GKE_ENDPOINT),
])
def test_gcloud_dns_endpoint_is_read_when_it_takes_user_traffic(
        tmp_path: Path, fake_gcloud: Path, endpoints: dict[str, Any] | None, expected: str) -> None:
    from verl_gke import gke_facts

    answer = tmp_path / "gcloud-answer.json"
    cluster = {"name": "verl-a4", "endpoint": GKE_ENDPOINT, "masterAuth": {"clusterCaCertificate": GKE_CA}}
    answer.write_text(json.dumps({**cluster, "controlPlaneEndpointsConfig": endpoints} if endpoints else cluster))
    assert gke_facts.describe("verl-a4", "us-central1") == gke_facts.ClusterFacts(expected, GKE_CA)


def test_gcloud_dns_endpoint_missing_is_refused(tmp_path: Path, fake_gcloud: Path) -> None:
    from verl_gke import gke_facts

    (tmp_path / "gcloud-answer.json").write_text(json.dumps({
        "endpoint": GKE_ENDPOINT, "masterAuth": {"clusterCaCertificate": GKE_CA},
        "controlPlaneEndpointsConfig": {"dnsEndpointConfig": {"allowExternalTraffic": True}}}))
    with pytest.raises(gke_facts.GkeLookupError, match="answered an empty endpoint"):
        gke_facts.describe("verl-a4", "us-central1")


def test_metrics_from_a_log_file_needs_no_stack(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, no_pulumi: None) -> None:
    log = tmp_path / "job.log"
    log.write_text("noise\n(TaskRunner pid=1) step:1 - critic/score/mean:0.250 - perf/throughput:99.500\nstep:2 - crit")
    code, out, err = run(capsys, "metrics", "--log-file", str(log))
    assert code == 0
    assert out.splitlines()[:2] == [
        "step  critic/score/mean  perf/throughput  perf/time_per_step",
        "   1              0.250           99.500                   -",
    ]
    assert out.splitlines()[2] == "critic/score/mean: not enough steps to judge (1 < 4)"
    assert "verl-gke: the last log line is incomplete (still being written) and was left out" in err.splitlines()


def test_metrics_from_a_log_without_metrics(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("Traceback (most recent call last):\nRuntimeError: CUDA out of memory\n")
    code, _, err = run(capsys, "metrics", "--log-file", str(log))
    assert code == 1
    assert error_line(err) == (f"verl-gke: error: no verl metric lines (step:N - key:value ...) in {log}; "
                               "is trainer.logger set to console?")


@pytest.fixture
def fake_pulumi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `pulumi` first on PATH that records its arguments, then prints FAKE_PULUMI_OUT or fails."""
    bin_dir = tmp_path / "pulumi-bin"
    bin_dir.mkdir()
    script = bin_dir / "pulumi"
    script.write_text(
        "#!/bin/bash\n"
        'printf "%s\\n" "$@" > "$FAKE_PULUMI_RECORD"\n'
        'if [[ -n $FAKE_PULUMI_FAIL ]]; then echo "$FAKE_PULUMI_FAIL" >&2; exit 255; fi\n'
        'cat "$FAKE_PULUMI_OUT"\n'
    )
    script.chmod(0o755)
    record = tmp_path / "pulumi-args"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_PULUMI_RECORD", str(record))
    return record


def test_outputs_come_from_the_pulumi_cli_without_secrets(
        fake_pulumi: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_PULUMI_OUT", str(write_outputs(tmp_path / "out.json", outputs_doc("raysubmit_7"))))
    loaded = stack_outputs.load(None, "a4")
    assert fake_pulumi.read_text().splitlines() == ["stack", "output", "--json", "--stack", "a4"]
    assert (loaded.source, loaded.grpo_submission_id) == ("pulumi stack output --json --stack a4", "raysubmit_7")


def test_a_failing_pulumi_cli_is_one_line(
        capsys: pytest.CaptureFixture[str], fake_pulumi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_PULUMI_FAIL", "error: no stack named 'a4x' found")
    code, _, err = run(capsys, "status", "--stack", "a4x")
    assert code == 1
    assert error_line(err) == ("verl-gke: error: `pulumi stack output --json --stack a4x` failed (exit 255): "
                               "error: no stack named 'a4x' found")


@pytest.mark.parametrize("command", [[], ["status"], ["logs"], ["wait"], ["stop"], ["runs"], ["dashboard"], ["metrics"]])
def test_help_everywhere(capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*command, "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: verl-gke {' '.join(command)}".rstrip())


# Exit statuses (the epilog and docs/runs.md): 0 done, 1 the command failed, 2 a
# wrong command line, 3 `wait` lost the head (test_wait_exits_3_not_1_...), 130 interrupted.
@pytest.mark.parametrize(("argv", "line"), [
    ([], "verl-gke: error: the following arguments are required: COMMAND (see verl-gke --help)"),
    (["stat"], "verl-gke: error: argument COMMAND: invalid choice: 'stat' (choose from 'status', 'logs', "
               "'wait', 'stop', 'runs', 'dashboard', 'metrics', 'fabric', 'export', 'verify', 'report') (see verl-gke --help)"),
    (["status", "--nope"], "verl-gke: error: unrecognized arguments: --nope (see verl-gke --help)"),
    (["wait", "--poll", "soon"],
     "verl-gke: error: wait: argument --poll: 'soon' is not a number of seconds (see verl-gke wait --help)"),
    (["wait", "--timeout", "0"], "verl-gke: error: wait: argument --timeout: '0' must be > 0 (see verl-gke wait --help)"),
    (["fabric", "--backend", "mpi"], "verl-gke: error: fabric: argument --backend: invalid choice: 'mpi' "
                                     "(choose from 'nccl', 'gloo') (see verl-gke fabric --help)"),
    (["metrics", "--keys", ","],
     "verl-gke: error: metrics: argument --keys: ',' names no metric key (see verl-gke metrics --help)"),
])
def test_a_wrong_command_line_is_one_line_and_exit_2(
        capsys: pytest.CaptureFixture[str], argv: list[str], line: str) -> None:
    code, out, err = run(capsys, *argv)
    assert (code, out, err) == (2, "", line + "\n")


def test_a_wrong_command_line_exits_2_from_the_installed_command() -> None:
    done = subprocess.run([sys.executable, "-m", "verl_gke", "logs", "--follow=yes"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("verl-gke: error: logs: argument --follow/-f: ignored explicit argument 'yes' "
                           "(see verl-gke logs --help)\n")


def test_an_interrupted_command_exits_130(tmp_path: Path) -> None:
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc("raysubmit_x"))
    url = f"http://127.0.0.1:{free_ports(1)[0]}"  # nothing answers: `wait` waits for the dashboard
    process = subprocess.Popen([sys.executable, "-m", "verl_gke", "wait", "--outputs", str(outputs),
                                "--dashboard-url", url, "--head-timeout", "120"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                               preexec_fn=_in_a_terminal)
    try:
        assert process.stderr is not None
        assert process.stderr.readline() == f"verl-gke: waiting up to 120 s for the Ray dashboard at {url}\n"
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert (process.returncode, out, err) == (130, "", "\n")


def test_the_exit_statuses_are_the_same_in_the_epilog_the_docstring_and_the_docs() -> None:
    epilog = " ".join((cli.build_parser().epilog or "").split())
    assert epilog == ("Errors are one line on stderr. Exit status: 0 done, 1 the command failed, 2 a wrong command "
                      "line, 3 `wait` could not read the run for its outage window, 4 `wait`: the run failed, 5 "
                      "stopped, 6 over its budget, 7 lost, 8 `wait`, `stop` or `export`: its --timeout passed "
                      "(what it waits for goes on), 9 `report`: the run never started, 130 interrupted.")
    statuses = epilog.removeprefix("Errors are one line on stderr. ")
    docs = " ".join(" ".join(path.read_text().split()) for path in [REPO / "README.md", *(REPO / "docs").glob("*.md")])
    assert statuses in " ".join((REPO / "docs" / "runs.md").read_text().split())
    assert "with exit status 1" not in docs
    assert sum(docs.count(status) for status in ("5 stopped", "7 lost")) == 2  # told once, in docs/runs.md


def test_python_dash_m_runs_the_cli() -> None:
    done = subprocess.run([sys.executable, "-m", "verl_gke", "metrics", "--help"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "Verdict rule: rising = least-squares slope" in done.stdout.replace("\n", " ").replace("  ", " ")


# --- Stack outputs, typed -------------------------------------------------------------------------


def test_the_synths_outputs_json_loads(tmp_path: Path) -> None:
    # `make synth` marks what only a deployment knows as "[unknown]"; the job's status is one.
    doc = outputs_doc("verl-grpo-a4-d4b0ab0df167", grpoJobStatus="[unknown]", clusterEndpoint="10.0.0.2",
                      clusterCaCertificate=CA)
    loaded = stack_outputs.from_file(write_outputs(tmp_path / "outputs.json", doc))
    assert loaded.grpo_job_status is None
    assert loaded.grpo_submission_id == "verl-grpo-a4-d4b0ab0df167"
    assert loaded.cluster_endpoint == "10.0.0.2"


def test_outputs_are_typed_and_whole_number_floats_accepted() -> None:
    loaded = stack_outputs.from_mapping(outputs_doc("raysubmit_1", gpuNodes=2.0, clusterCaCertificate="[secret]",
                                                    clusterEndpoint="34.1.2.3"), "test")
    assert (loaded.gpu_nodes, loaded.gpus_per_node) == (2, 8)
    assert loaded.cluster_endpoint == "34.1.2.3"
    assert loaded.cluster_ca_certificate is None
    assert loaded.grpo_submission_id == "raysubmit_1"


@pytest.mark.parametrize(("change", "message"), [
    ({"gpuNodes": True}, "stack output gpuNodes in test must be a whole number >= 0, got True"),
    ({"gpusPerNode": 7.5}, "stack output gpusPerNode in test must be a whole number >= 0, got 7.5"),
    ({"namespace": ""}, "stack output namespace in test must be a non-empty string, got ''"),
    ({"grpoSubmissionId": "[unknown]"}, "stack output grpoSubmissionId in test is not known before deployment; "
                                        "use the outputs of a deployed stack (`pulumi stack output --json`)"),
    ({"rayHeadService": "[secret]"}, "stack output rayHeadService in test is a secret; it must be exported in clear"),
])
def test_bad_output_values_are_named(change: dict[str, Any], message: str) -> None:
    with pytest.raises(OutputsError) as error:
        stack_outputs.from_mapping(outputs_doc("raysubmit_1", **change), "test")
    assert str(error.value) == message


@pytest.mark.ray
def test_wait_rides_out_a_head_outage_shorter_than_its_window(
        capsys: pytest.CaptureFixture[str], ray_head: str, tmp_path: Path) -> None:
    submission_id = submit(ray_head, entrypoint="python -c 'import time; time.sleep(10)'")
    link = FlakyLink(int(ray_head.rsplit(":", 1)[1]))
    link.up.set()
    threading.Timer(2.0, link.up.clear).start()  # lost 2 s in, for 4 s
    threading.Timer(6.0, link.up.set).start()
    try:
        outputs = write_outputs(tmp_path / "outputs.json", outputs_doc(submission_id))
        code, out, err = run(capsys, "wait", "--outputs", str(outputs), "--dashboard-url",
                             f"http://127.0.0.1:{link.port}", "--poll", "0.5", "--outage-window", "30")
    finally:
        link.close()
    assert code == 0, err
    assert out == f"job {submission_id} SUCCEEDED\n"
    assert "head unreachable" in err and "reconnecting for up to" in err


@pytest.mark.ray
def test_wait_exits_3_not_1_when_the_head_stays_unreachable(
        capsys: pytest.CaptureFixture[str], ray_head: str, tmp_path: Path) -> None:
    link = FlakyLink(int(ray_head.rsplit(":", 1)[1]))
    try:
        outputs = write_outputs(tmp_path / "outputs.json", outputs_doc("cli-test-never"))
        started = time.monotonic()
        code, _, err = run(capsys, "wait", "--outputs", str(outputs), "--dashboard-url",
                           f"http://127.0.0.1:{link.port}", "--poll", "0.5", "--outage-window", "2",
                           "--head-timeout", "1")
    finally:
        link.close()
    assert code == 3
    assert error_line(err).startswith("verl-gke: error: lost the Ray head for 0m0")
    assert time.monotonic() - started < 15


@pytest.fixture
def synth_outputs(synth_stack: Any, tmp_path: Path) -> Path:
    """dist/a4-standard/outputs.json as `make synth` writes it."""
    from verl_gke import synth

    synth.write(synth_stack("a4-standard"), tmp_path / "dist")
    return tmp_path / "dist" / "outputs.json"


def test_status_shows_what_synths_outputs_name_and_that_nothing_is_deployed(
        capsys: pytest.CaptureFixture[str], synth_outputs: Path) -> None:
    doc = json.loads(synth_outputs.read_text())
    code, out, err = run(capsys, "status", "--outputs", str(synth_outputs))
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"Run            {doc['runId']}  not started: `pulumi up` submits its attempt 0",
        f"Stack outputs  {synth_outputs}: synth's offline outputs, nothing deployed",
        "Cluster        verl-a4 in us-central1, platform a4, 2 GPU nodes x 8 GPUs",
        "Ray head       none: `pulumi up` creates svc/b200-ray-cluster-head-svc in namespace verl-gke",
        "Price          unknown: the stack outputs have no hourlyCostUsd; set verl-gke:gpuNodeHourlyUsd (USD per GPU "
        "node-hour, by capacity kind) and run `pulumi up`",
        "Preflight      not checked offline (`pulumi preview` checks the live project)",
        f"Checkpoints    {doc['checkpointUri']}",
        f"Dashboard      {doc['dashboardCommand']}",
    ]
    _assert_status_help_names(out)


def test_a_command_that_needs_a_head_says_how_to_try_it_on_synths_outputs(
        capsys: pytest.CaptureFixture[str], synth_outputs: Path) -> None:
    code, _, err = run(capsys, "logs", "--outputs", str(synth_outputs))
    assert code == 1
    assert error_line(err) == (
        f"verl-gke: error: {synth_outputs} holds synth's offline outputs: nothing is deployed to reach. `verl-gke "
        f"status --outputs {synth_outputs}` shows what they name; --dashboard-url URL runs this command against a "
        "Ray head of your own (e.g. `ray start --head`)")


@pytest.mark.parametrize("command", ["stop", "runs"])
def test_a_command_that_needs_the_run_records_says_synths_outputs_started_no_run(
        capsys: pytest.CaptureFixture[str], synth_outputs: Path, command: str) -> None:
    code, _, err = run(capsys, command, "--outputs", str(synth_outputs))
    assert code == 1
    assert error_line(err) == (
        f"verl-gke: error: {synth_outputs} holds synth's offline outputs: no run was started. `verl-gke status "
        f"--outputs {synth_outputs}` shows what they name; {command} reads the run records of a deployed stack")


@pytest.mark.ray
def test_synths_outputs_with_a_dashboard_url_follow_the_job_they_name(
        capsys: pytest.CaptureFixture[str], ray_head: str, synth_outputs: Path) -> None:
    submission_id = json.loads(synth_outputs.read_text())["grpoSubmissionId"]
    client = JobSubmissionClient(ray_head)
    if submission_id not in [j.submission_id for j in client.list_jobs()]:
        client.submit_job(entrypoint="echo trying the CLI on the outputs of synth", submission_id=submission_id)
    assert wait_until_done(ray_head, submission_id) == JobStatus.SUCCEEDED
    code, out, _ = run(capsys, "logs", "--outputs", str(synth_outputs), "--dashboard-url", ray_head)
    assert code == 0 and "trying the CLI on the outputs of synth" in out.splitlines()
    code, out, _ = run(capsys, "wait", "--outputs", str(synth_outputs), "--dashboard-url", ray_head)
    assert (code, out) == (0, f"job {submission_id} SUCCEEDED\n")


def test_version_names_the_installed_package(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"verl-gke {version('verl-gke')}\n"


@pytest.mark.ray
def test_logs_follow_ends_with_one_line_when_the_head_stops_answering(
        capsys: pytest.CaptureFixture[str], ray_head: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from access import head_access

    monkeypatch.setattr(cmd_logs, "FOLLOW_CHECK_S", 1.0)
    monkeypatch.setattr(head_access, "REQUEST_TIMEOUT_S", 2.0)
    submission_id = submit(ray_head, entrypoint="python -c 'import time; print(\"started\", flush=True); time.sleep(60)'")
    # The job has printed before the link's 6 s start: a loaded machine can take longer to start it.
    deadline = time.monotonic() + 60
    while "started" not in JobSubmissionClient(ray_head).get_job_logs(submission_id):
        assert time.monotonic() < deadline, "the job did not print within 60 s"
        time.sleep(0.5)
    link = FlakyLink(int(ray_head.rsplit(":", 1)[1]))
    link.up.set()
    threading.Timer(6.0, link.up.clear).start()  # the open log stream stays, new requests fail
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc(submission_id))
    started = time.monotonic()
    try:
        code, out, err = run(capsys, "logs", "--follow", "--outputs", str(outputs), "--dashboard-url",
                             f"http://127.0.0.1:{link.port}")
    finally:
        link.close()
        JobSubmissionClient(ray_head).stop_job(submission_id)
    assert code == 1
    assert "started" in out
    assert error_line(err).startswith(f"verl-gke: error: Ray head at http://127.0.0.1:{link.port}: GET /api/jobs/")
    assert time.monotonic() - started < 30


def test_spend_runs_from_the_first_attempts_start_to_now_or_the_last_end() -> None:
    from types import SimpleNamespace as Job

    first = Job(start_time=1_000_000, end_time=4_600_000)  # ms, as Ray's job info gives them
    retry = Job(start_time=5_000_000, end_time=None)
    assert cmd_status._spend([first, retry], 100.0, now_s=8_200.0) == \
        "$200.00 since the first attempt started, at $100.00/h"
    retry.end_time = 8_200_000
    assert cmd_status._spend([first, retry], 100.0, now_s=99_999.0) == \
        "$200.00 since the first attempt started, at $100.00/h (run ended)"
    assert cmd_status._spend([], 100.0, now_s=0.0) == "nothing yet ($100.00/h once the run starts)"
    assert cmd_status._spend([first], None, now_s=0.0) == (
        "unknown: the stack outputs have no hourlyCostUsd; set verl-gke:gpuNodeHourlyUsd (USD per GPU node-hour, by "
        "capacity kind) and run `pulumi up`")


@pytest.mark.parametrize("module", ["verl_gke", "verl_gke.cli"])
def test_python_dash_m_either_module_is_the_cli(module: str) -> None:
    from importlib.metadata import version

    done = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, f"verl-gke {version('verl-gke')}\n"), done.stderr


def _reads(handler: Any) -> tuple[set[str], set[str]]:
    """The flags a command's code reads, derived from its source: `args.<name>` (must exist) and
    `getattr(args, "<name>", default)` (read when the command has it), in its handler and every function of
    verl_gke's modules it reaches by name (`reach.head`, `runs.follow`)."""
    import ast

    modules = {f"verl_gke.{path.stem}": path for path in (REPO / "verl_gke").glob("*.py")}
    trees = {name: {node.name: node for node in ast.parse(path.read_text()).body
                    if isinstance(node, ast.FunctionDef)} for name, path in modules.items()}
    aliases = {alias: name for name in modules for alias in (name, name.rsplit(".", 1)[1])}
    must, may, seen = set(), set(), set()
    todo = [(handler.__module__, handler.__name__)]
    while todo:
        module, name = todo.pop()
        if (module, name) in seen or name not in trees[module]:
            continue
        seen.add((module, name))
        for node in ast.walk(trees[module][name]):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "args":
                must.add(node.attr)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                    and isinstance(node.args[0], ast.Name) and node.args[0].id == "args":
                may.add(node.args[1].value)  # type: ignore[attr-defined]
            elif isinstance(node, ast.Name):
                todo.append((module, node.id))
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                todo.append((aliases[node.value.id], node.attr))
    return must, may


def _subcommands() -> dict[str, Any]:
    import argparse

    parser = cli.build_parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(commands.choices)


@pytest.mark.parametrize("command", list(_subcommands()))
def test_each_command_lists_exactly_the_flags_its_code_reads(command: str, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch):
    sub = _subcommands()[command]
    listed = {a.dest for a in sub._actions if a.dest != "help"}
    must, may = _reads(sub.get_default("handler"))
    assert must <= listed, f"{command} reads flags it does not take: {sorted(must - listed)}"
    assert listed <= must | may, f"{command} lists flags it never reads: {sorted(listed - must - may)}"
    # Its help names only flags it takes (another tool's flags are in `backticks`).
    monkeypatch.setenv("COLUMNS", "1000")  # no flag broken across lines
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    own = {option for a in sub._actions for option in a.option_strings}
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", re.sub(r"`[^`]*`", "", capsys.readouterr().out)))
    assert named <= own, f"{command} --help names flags it does not take: {sorted(named - own)}"


def test_a_shared_flag_is_declared_once_and_described_alike_by_every_command() -> None:
    """verify and report take --outputs, --stack, --kube-api-url (and report --run, --bucket-dir) from the
    CLI's one set of flag groups, as every other command: one help text per flag."""
    described: dict[str, set[str]] = {}
    for command, sub in _subcommands().items():
        for action in sub._actions:
            if action.dest in ("outputs", "stack", "kube_api_url", "run", "bucket_dir"):
                described.setdefault(action.dest, set()).add(action.help or "")
        assert command in cli.COMMAND_FLAGS, f"{command}: its flag groups are not in cli.COMMAND_FLAGS"
    assert {dest: len(helps) for dest, helps in described.items()} == {
        "outputs": 1, "stack": 1, "kube_api_url": 1, "run": 1, "bucket_dir": 1}


def test_wait_honours_its_timeout_while_the_head_is_unreachable(capsys: pytest.CaptureFixture[str]) -> None:
    """`wait --timeout 2` during a head outage ends at its timeout (exit 8), not after the outage window."""
    (closed,) = free_ports(1)
    started = time.monotonic()
    code, _, err = run(capsys, "wait", "--dashboard-url", f"http://127.0.0.1:{closed}", "--submission-id", "job-1",
                       "--poll", "0.5", "--timeout", "2", "--head-timeout", "1")
    assert time.monotonic() - started < 6
    assert code == 8
    assert re.fullmatch(r"verl-gke: error: job job-1: the Ray head did not answer for 0m0\ds, and --timeout 2 s has "
                        r"passed \(the job may go on\): .*", error_line(err))


@pytest.fixture
def refusing_server(request: pytest.FixtureRequest) -> Iterator[str]:
    """An HTTP server that answers every request 401 Unauthorized (or the code given as the fixture's param)
    with a JSON Status, as the Kubernetes API does for a token it does not accept (and as a Ray head with
    token authentication does without one)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    code = getattr(request, "param", 401)

    class Refuse(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps({"kind": "Status", "status": "Failure", "message": self.responses[code][0],
                               "reason": self.responses[code][0], "code": code}).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("command", [["runs"], ["stop", "--no-wait"], ["wait", "--poll", "1", "--timeout", "60"]])
def test_an_unreachable_kube_api_url_is_one_line_naming_what_was_read_and_what_to_do(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, command: list[str]) -> None:
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc("raysubmit_x"))
    (closed,) = free_ports(1)
    code, _, err = run(capsys, *command, "--outputs", str(outputs), "--kube-api-url", f"http://127.0.0.1:{closed}",
                       *(["--outage-window", "1"] if command[0] == "wait" else []))
    what = "the run records of RayCluster b200-ray-cluster" if command[0] == "runs" else \
        "run record b200-ray-cluster-run-6c7f546429ec"
    assert code == (3 if command[0] == "wait" else 1)
    assert error_line(err).endswith(
        f"could not reach the Kubernetes API at http://127.0.0.1:{closed} (--kube-api-url) reading {what} in "
        "namespace default: Connection refused; is `kubectl proxy` (or the API you named) running there?")


@pytest.mark.parametrize("command", [["runs"], ["wait", "--poll", "1", "--timeout", "60"]])
def test_a_kube_api_that_refuses_the_credentials_is_said_at_once_with_the_fix(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, command: list[str], refusing_server: str) -> None:
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc("raysubmit_x"))
    started = time.monotonic()
    code, _, err = run(capsys, *command, "--outputs", str(outputs), "--kube-api-url", refusing_server)
    assert time.monotonic() - started < 5  # not retried: no retry mends credentials
    what = "the run records of RayCluster b200-ray-cluster" if command[0] == "runs" else \
        "run record b200-ray-cluster-run-6c7f546429ec"
    assert code == 1
    assert error_line(err) == (
        f"verl-gke: error: the Kubernetes API at {refusing_server} (--kube-api-url) answered 401 Unauthorized "
        f"reading {what} in namespace default: it wants credentials; give --kube-api-url the address of "
        "`kubectl proxy` (which adds yours), or leave it out to use your Google credentials")


def test_a_ray_head_that_refuses_the_request_is_said_at_once_with_the_fix(
        capsys: pytest.CaptureFixture[str], refusing_server: str) -> None:
    started = time.monotonic()
    code, _, err = run(capsys, "wait", "--dashboard-url", refusing_server, "--submission-id", "job-1")
    assert time.monotonic() - started < 5  # not retried for --head-timeout's 30 s
    assert code == 1
    assert error_line(err) == (
        f"verl-gke: error: Ray dashboard at {refusing_server} answered GET /api/version with 401 Unauthorized: the "
        "Ray cluster has token authentication; reach it through the port-forward (no --dashboard-url or "
        "verl-gke:jobDashboardUrl), which adds the cluster's token, with an account that may read the Secret named "
        "after the RayCluster (key auth_token)")


def _assert_status_help_names(out: str) -> None:
    """`status --help` names every row `status` printed (its help describes today's output)."""
    help_text = " ".join(cli.build_parser()._subparsers._group_actions[0].choices["status"].description.split())
    labels = {re.sub(r" \d+$", " N", line[:15].strip()) for line in out.splitlines()}
    assert {label for label in labels if label not in help_text} == set()
    assert help_text.startswith("One screen: Run (the run's id")


def test_status_help_names_every_row_of_a_released_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A released run started from a checkpoint, with a model export: every row `status` shows of it from
    its record is named in `status --help`."""
    from verl_gke.console import print_rows
    from workloads.run_lifecycle import SUCCEEDED
    from workloads.run_record import Attempt, RunRecord

    outputs = stack_outputs.from_file(write_outputs(tmp_path / "outputs.json", outputs_doc("sid-0")))
    record = RunRecord("run-2", attempts=(Attempt(0, "sid-0", "pulumi-up", "pulumi-up", submitted=True),),
                       outcome=SUCCEEDED, start_from="run run-1 step 20", export_id="verl-export-run-2-final",
                       export_outcome="SUCCEEDED", export_target="gs://b/models/run-2/model",
                       released=True).decided("run ended: succeeded", 1_700_003_600.0)
    print_rows(cmd_status._ended_rows(outputs, record, verbose=False))
    out = capsys.readouterr().out
    assert [line[:15].strip() for line in out.splitlines()] == [
        "Run", "Started from", "Stack outputs", "Cluster", "Ray head", "Attempt 0", "Model export", "Last decision",
        "Checkpoints", "Resume"]
    _assert_status_help_names(out)


def _help(command: str) -> str:
    """`verl-gke COMMAND --help`'s description and flag help, as one line of words."""
    sub = _subcommands()[command]
    return " ".join(" ".join([sub.description or "", *(a.help or "" for a in sub._actions)]).split())


def test_logs_copy_wait_also_waits_for_the_copy_read_once_the_head_is_gone(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from tests.kube_api import kube_api
    from workloads.kube import KubernetesApi
    from workloads.run_record import Attempt, RecordStore, RunRecord

    (closed,) = free_ports(1)
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc("sid-0", runId="run-1"))
    record = RunRecord("run-1", attempts=(Attempt(0, "sid-0", "pulumi-up", "pulumi-up", submitted=True),))
    copy = tmp_path / "bucket" / "logs" / "run-1"
    copy.mkdir(parents=True)
    (copy / "record.json").write_text(record.to_json())  # not released: the copy is not final yet
    with kube_api() as (url, _state):
        records = RecordStore(KubernetesApi(url), "default", "b200-ray-cluster")
        records.write(records.get("run-1"), record)
        code, out, err = run(capsys, "logs", "--outputs", str(outputs), "--kube-api-url", url, "--dashboard-url",
                             f"http://127.0.0.1:{closed}", "--head-timeout", "1", "--bucket-dir",
                             str(tmp_path / "bucket"), "--copy-wait", "0.5")
    assert (code, out) == (1, "")
    assert error_line(err) == (f"verl-gke: error: the copy of run run-1 in {copy}/ is not final after 0.5 s "
                               "(the run has not been released yet)")
    assert "when reading the bucket copy (--from-bucket, or the head gone): wait up to S seconds" in _help("logs")


@pytest.mark.parametrize(("command", "told", "shown_by"), [
    ("dashboard", "With --dashboard-url: checks that it answers, prints it and returns",
     "test_dashboard_with_a_directly_reachable_head_just_prints_it"),
    ("wait", "Without the run's record (--submission-id, or --dashboard-url without --kube-api-url) it follows one "
             "Ray job on the head", "test_wait_honours_its_timeout_while_the_head_is_unreachable"),
    ("fabric", "once every worker and GPU joined (waited for up to --head-timeout)", "tests/test_fabric.py"),
    ("metrics", "from the run's logs (all attempts, a repeated step's latest value winning; from the bucket copy "
                "once the head is gone)", "tests/test_runs.py::test_wait_follows_the_run_across_a_killed_attempt"),
])
def test_the_help_tells_what_the_command_does_in_each_of_its_modes(command: str, told: str, shown_by: str) -> None:
    """Modes whose help said nothing of them (0.8.0); `shown_by` is the test that shows the behaviour."""
    assert told in _help(command)


@pytest.mark.parametrize("refusing_server", [503], indirect=True)
def test_a_kube_api_error_answer_is_one_line_naming_what_was_read(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, refusing_server: str) -> None:
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc("raysubmit_x"))
    code, _, err = run(capsys, "runs", "--outputs", str(outputs), "--kube-api-url", refusing_server)
    assert code == 1
    assert error_line(err) == (
        f"verl-gke: error: the Kubernetes API at {refusing_server} (--kube-api-url) answered 503 Service Unavailable "
        "reading the run records of RayCluster b200-ray-cluster in namespace default; try again")
