"""The run's timeline in the bucket: the writer the supervisor's log copy adds (workloads/run_logs.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from workloads.run_logs import DirectorySink, LogCopier
from workloads.run_record import Attempt, RunRecord

# Ray's job table entry (GET /api/jobs/: JobDetails, start_time/end_time in ms since the epoch).
JOB = {"submission_id": "verl-grpo-1", "status": "RUNNING", "start_time": 1_796_644_800_000, "end_time": None,
       "driver_node_id": "n1"}


class Ray:
    """The head's two answers the copy reads: the job table and a job's log tail (RayJobs' shapes)."""

    def __init__(self) -> None:
        self.job: dict[str, Any] = dict(JOB)
        self.lines = ["INFO worker.py:1852 -- Connecting to existing Ray cluster"]

    def jobs(self) -> dict[str, dict[str, Any]]:
        return {self.job["submission_id"]: self.job}

    def log_tail(self, job: Any, lines: int) -> list[str]:
        return list(self.lines)


def test_the_copy_records_the_jobs_start_and_end_and_when_each_verl_step_was_first_seen(tmp_path: Path) -> None:
    ray, now, wall = Ray(), [0.0], [1_796_645_000.0]
    record = RunRecord("run-1", attempts=(Attempt(0, "verl-grpo-1", "pulumi-up", "pulumi-up"),))
    copier = LogCopier(ray, DirectorySink(tmp_path), lambda: {"run-1": record}, clock=lambda: now[0],
                       log=lambda _line: None, wall=lambda: wall[0])
    timeline = tmp_path / "logs" / "run-1" / "timeline.jsonl"
    copier.tick()
    ray.lines.append("\x1b[36m(TaskRunner pid=42)\x1b[0m step:1 - timing_s/step:310.5 - critic/score/mean:0.1")
    now[0], wall[0] = 60.0, 1_796_645_300.0
    copier.tick()
    ray.lines.append("(TaskRunner pid=42) step:2 - timing_s/step:120.0")
    ray.job.update(status="SUCCEEDED", end_time=1_796_645_400_500)
    now[0], wall[0] = 120.0, 1_796_645_420.0
    copier.tick()
    assert [json.loads(line) for line in timeline.read_text().splitlines()] == [
        {"attempt": 0, "event": "job-start", "at": 1_796_644_800.0, "clock": "head"},
        {"attempt": 0, "event": "step", "step": 1, "at": 1_796_645_300.0, "clock": "supervisor"},
        {"attempt": 0, "event": "job-end", "at": 1_796_645_400.5, "clock": "head", "status": "SUCCEEDED"},
        {"attempt": 0, "event": "step", "step": 2, "at": 1_796_645_420.0, "clock": "supervisor"},
    ]
    # A restarted supervisor keeps what the bucket has: a step's first sighting is not moved.
    again = LogCopier(ray, DirectorySink(tmp_path), lambda: {"run-1": record}, clock=lambda: 0.0,
                      log=lambda _line: None, wall=lambda: 1_796_646_000.0)
    again.flush()
    assert len(timeline.read_text().splitlines()) == 4


# --- the measured twins, from a recorded run -------------------------------------------------------------

import base64  # noqa: E402
import os  # noqa: E402
import struct  # noqa: E402

import pytest  # noqa: E402

from verl_gke import cli, report  # noqa: E402
from verl_gke.measured import Recorded, measure  # noqa: E402
from workloads.run_logs import merged_timeline, timeline_events  # noqa: E402

T0 = 1_796_637_600  # 2026-12-07T10:00:00Z


def stamp(offset_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(T0 + offset_s))


def step_line(step: int, step_s: float, save_s: float | None = None) -> str:
    """verl's console logger line (aggregate_logger.concat_dict_to_str, `pprint.pformat` values: numpy 2 scalars
    for the data metrics, Python floats for timing_raw), as Ray prefixes it."""
    fields = [f"step:{step}", "global_seqlen/mean:np.float64(51234.5)", "critic/score/mean:np.float64(0.3125)",
              "timing_s/gen:35.25", "timing_s/reward:0.75", "timing_s/old_log_prob:9.5", "timing_s/ref:8.0",
              "timing_s/adv:0.25", "timing_s/update_actor:41.25",
              *([f"timing_s/save_checkpoint:{save_s}"] if save_s is not None else []),
              f"timing_s/step:{step_s}", f"perf/time_per_step:{step_s}", "perf/throughput:np.float64(1520.5)"]
    return "\x1b[36m(TaskRunner pid=2351)\x1b[0m " + " - ".join(fields)


STEPS = [(1, 100.0, None), (2, 120.0, 10.0), (3, 110.0, None), (4, 130.0, 15.0)]
LOG = "\n".join(["INFO worker.py:1852 -- Connecting to existing Ray cluster at address: 10.0.0.5:6379...",
                 *(step_line(*s) for s in STEPS),
                 "verl-gke checkpoints: step 4: verl's last save (its trainer ran on b200-ray-cluster-head-x7k2p)"]) + "\n"
RANKS = 16


def report_listing() -> list[tuple[int, float, str]]:
    """Two saves' objects (16 ranks, two GPU nodes and the head's part): size, epoch time, URL."""
    out = []
    for step, saved_at in ((2, 2160), (4, 3000)):
        base = f"gs://verl-data/verl/checkpoints/run-1/global_step_{step}"
        out.append((80, saved_at, f"{base}/.verl-gke/saved.json"))
        for rank in range(RANKS):
            out.append((1_000_000_000, saved_at + 5, f"{base}/actor/model_world_size_{RANKS}_rank_{rank}.pt"))
            out.append((2_000_000_000, saved_at + 20, f"{base}/actor/optim_world_size_{RANKS}_rank_{rank}.pt"))
        out.append((1000, saved_at + 1, f"{base}/data.pt"))
        out += [(300, saved_at + 21, f"{base}/.verl-gke/parts/{p}.json") for p in ("head", "node0", "node1")]
        out.append((90, saved_at + 22, f"{base}/.verl-gke-complete.json"))
    return [(size, T0 + at, url) for size, at, url in out]


def listing() -> str:
    """`gcloud storage ls -l -r gs://.../run-1/**` of report_listing's objects, as gcloud prints them."""
    return "".join(f"{size:>12}  {stamp(at - T0)}  {url}\n" for size, at, url in report_listing()) + \
        "TOTAL: 110 objects, 96000002740 bytes (89.41GiB)\n"


def timeline() -> str:
    events = timeline_events(0, {"start_time": (T0 + 1500) * 1000, "status": "RUNNING"}, [], T0 + 1500)
    events += timeline_events(0, {}, [LOG.splitlines()[1]], T0 + 1900)  # step 1 seen 400 s after the start
    events += timeline_events(0, {"end_time": (T0 + 5100) * 1000, "status": "SUCCEEDED"}, LOG.splitlines(), T0 + 5110)
    return merged_timeline(None, events)


# GKE's Cluster.createTime; NodeList with Ready conditions; an EventList with the kubelet's Pulled message
# (pkg/kubelet/images/image_manager.go); the staging Job's JobStatus.startTime/completionTime.
LIVE: dict[str, Any] = {
    "cluster": {"createTime": "2026-12-07T10:00:00+00:00".replace("+00:00", "Z"), "autopilot": {}},
    "nodes": {"items": [
        {"metadata": {"name": f"gke-gpu-{i}", "creationTimestamp": stamp(540 + 30 * i),
                      "labels": {"cloud.google.com/gke-accelerator": "nvidia-b200"}},
         "status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": stamp(1140 + 60 * i)}]}}
        for i in range(2)] + [
        {"metadata": {"name": "gke-cpu-0", "creationTimestamp": stamp(300), "labels": {}},
         "status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": stamp(400)}]}}]},
    "events": {"items": [{"reason": "Pulled", "lastTimestamp": stamp(1320), "message":
                          'Successfully pulled image "us-central1-docker.pkg.dev/p/docker-hub/verlai/verl:vllm011" in '
                          "1m30.5s (1m31s including waiting). Image size: 21474836480 bytes."},
                         {"reason": "Scheduled", "message": "Successfully assigned default/x to gke-gpu-0"}]},
    "staging": {"metadata": {"name": "stage-data-1a2b"},
                "status": {"startTime": stamp(300), "completionTime": stamp(1050)}},
    # KubeRay 1.6's RayCluster status condition once every pod is ready.
    "ray_cluster": {"metadata": {"name": "b200-ray-cluster", "creationTimestamp": stamp(1200)},
                    "status": {"conditions": [{"type": "HeadPodReady", "status": "True",
                                               "lastTransitionTime": stamp(1300)},
                                              {"type": "RayClusterProvisioned", "status": "True",
                                               "lastTransitionTime": stamp(1380)}]}},
    # Staging's markers (workloads/stage_data.py make_marker: the identity and each file's bytes).
    "staged": ({"repo": "Qwen/Qwen2.5-32B-Instruct", "files": {"model-00001-of-00002.safetensors": 3_000_000_000,
                                                              "config.json": 1000}},
               {"repo": "openai/gsm8k", "files": {"train.parquet": 4_000_000, "test.parquet": 700_000}}),
}
DECISIONS = (f"{stamp(1490)} attempt 0 (verl-grpo-1) claimed by pulumi-up\n"
             f"{stamp(5110)} run ended: succeeded\n{stamp(5140)} GPU workers released\n")


def recorded_run() -> Recorded:
    return Recorded(run_id="run-1", logs=LOG, timeline=timeline(), decisions=DECISIONS, export_s=240.0,
                    listing=listing(), **LIVE)


def test_each_phase_is_measured_from_what_the_run_recorded() -> None:
    measured = measure(recorded_run())
    assert [(p.name, p.seconds, p.bytes) for p in measured.phases] == [
        ("cluster and GPU nodes", 1200.0, None),
        ("GPU nodes", 660.0, None),
        ("image pull", 90.5, 21474836480),
        ("staging", 750.0, 3_004_701_000),
        ("RayCluster ready", 180.0, None),
        ("verl start-up", 300.0, None),
        ("step", 115.0, None),
        ("checkpoint local save", 12.5, 48000001000),
        ("checkpoint bucket copy", 20.0, 48000001000),
        ("run", 3600.0, None),
        ("export", 240.0, None),
        ("release", 30.0, None),
    ]
    assert measured.step_phases == {"gen": 35.25, "reward": 0.75, "old_log_prob": 9.5, "ref": 8.0, "adv": 0.25,
                                    "update_actor": 41.25}
    assert measured.steps == ((1, 100.0), (2, 120.0), (3, 110.0), (4, 130.0))
    assert measured.rates == {"verlStartupSeconds": 300.0, "stepSeconds": 115.0, "localSaveGBpsPerRank": 0.25,
                              "bucketWriteGBps": 1.2}


CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nx\n").decode()
OUTPUTS = {"bucketName": "verl-data", "checkpointUri": "gs://verl-data/verl/checkpoints/run-1",
           "clusterLocation": "us-central1-b", "clusterName": "verl-a4", "clusterEndpoint": "34.9.9.9",
           "clusterCaCertificate": CA, "dashboardCommand": "kubectl ...", "gpuNodes": 2, "gpuPlatform": "a4",
           "gpusPerNode": 8, "grpoJobStatus": "SUCCEEDED", "grpoSubmissionId": "verl-grpo-1", "namespace": "default",
           "rayHeadService": "b200-ray-cluster-head-svc", "runId": "run-1", "modeledStepSeconds": 100.0,
           "modeledRunSeconds": 3000.0, "modeledVerlStartupSeconds": 240.0}

EXPECTED = [
    "Run run-1: measured against the stack's model",
    'phase                    modeled  measured  ratio    bytes  measured from',
    'cluster and GPU nodes   19.0 min  20.0 min  1.05x        -  GKE createTime to the last GPU node Ready',
    'GPU nodes               10.0 min  11.0 min  1.10x        -  first GPU node created to the last Ready',
    'image pull                90.0 s    90.5 s  1.01x  21.5 GB  kubelet Pulled event of '
    'us-central1-docker.pkg.dev/p/docker-hub/verlai/verl:vllm011',
    "staging                 10.0 min  12.5 min  1.25x   3.0 GB  the staging Job's startTime to "
    'completionTime; bytes from its markers',
    'RayCluster ready          90.0 s   180.0 s  2.00x        -  the RayCluster created to '
    'RayClusterProvisioned (KubeRay)',
    "verl start-up            240.0 s   300.0 s  1.25x        -  job start to its first step's start "
    '(the step seen at most 60 s late)',
    "step                     100.0 s   115.0 s  1.15x        -  mean of verl's timing_s/step over 4 steps",
    "checkpoint local save      1.5 s    12.5 s  8.33x  48.0 GB  verl's timing_s/save_checkpoint, mean of 2 saves",
    'checkpoint bucket copy    12.0 s    20.0 s  1.67x  48.0 GB  saved.json to the last file in the '
    'bucket, mean of 2 saves',
    "run                     50.0 min  60.0 min  1.20x        -  the first attempt's job start to the "
    "last one's end (the head's clock)",
    "export                         -   240.0 s      -        -  the record's export_s",
    "release                   15.0 s    30.0 s  2.00x        -  decisions 'run ended' to 'GPU workers released'",
    'checkpoint step 2: 48.0 GB, local save 10.0 s (0.30 GB/s per rank), bucket copy 20.0 s (1.20 GB/s '
    'per node, 2 nodes)',
    'checkpoint step 4: 48.0 GB, local save 15.0 s (0.20 GB/s per rank), bucket copy 20.0 s (1.20 GB/s '
    'per node, 2 nodes)',
    "verl's timers per step (mean): gen 35.2 s, reward 0.8 s, old_log_prob 9.5 s, ref 8.0 s, adv 0.2 s, "
    'update_actor 41.2 s',
    'measured rates: localSaveGBpsPerRank 0.25, bucketWriteGBps 1.2, verlStartupSeconds 300, stepSeconds 115',
]


def test_report_text_shows_each_phase_modeled_measured_and_the_ratio() -> None:
    from verl_gke.stack_outputs import from_mapping

    measured = measure(recorded_run())
    table = report.rows(measured, from_mapping(OUTPUTS, "outputs.json"), False,
                        "us-central1-docker.pkg.dev/p/docker-hub/verlai/verl:vllm011")
    assert report.text(measured, table, "measured against the stack's model") == EXPECTED


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def bucket_dir(root: Path) -> Path:
    """A local copy of the bucket: the run's logs folder, and its checkpoints as the listing names them (sparse
    files of those sizes, with those times)."""
    for size, at, url in report_listing():
        path = root / url.removeprefix("gs://verl-data/")
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as file:
            file.truncate(size)
        os.utime(path, (at, at))
    folder = root / "logs" / "run-1"
    folder.mkdir(parents=True)
    record = {"version": 2, "run_id": "run-1", "export_s": 240.0, "attempts": [
        {"index": 0, "submission_id": "verl-grpo-1", "by": "pulumi-up", "cause": "pulumi-up"}]}
    (folder / "record.json").write_text(json.dumps(record))
    (folder / "attempt-0.log").write_text(LOG)
    (folder / "timeline.jsonl").write_text(timeline())
    (folder / "decisions.log").write_text(DECISIONS)
    return root


def test_report_command_prints_draws_and_saves_the_measured_rates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(OUTPUTS))
    root = bucket_dir(tmp_path / "bucket")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(report.time, "time", lambda: T0 + 7200.0)
    png = tmp_path / "report.png"
    code = cli.main(["report", "--outputs", str(outputs), "--bucket-dir", str(root), "--plot", str(png), "--save",
                     "--stack", "a4-standard"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0] == "Run run-1: measured against the stack's model"
    # With a copy of the bucket, the live cluster is not asked: its phases are left out.
    assert out[1:] == [line for line in EXPECTED[1:] if not line.startswith(("cluster", "GPU nodes", "image",
                                                                             "staging", "RayCluster"))]
    assert png_size(png) == (1200, 700)
    assert json.loads((tmp_path / "measured" / "a4-standard.json").read_text()) == {
        "run": "run-1", "stack": "a4-standard", "measuredAt": "2026-12-07T12:00:00Z",
        "rates": {"localSaveGBpsPerRank": 0.25, "bucketWriteGBps": 1.2, "verlStartupSeconds": 300.0,
                  "stepSeconds": 115.0}}


def test_an_earlier_run_is_not_compared_with_the_current_model(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({**OUTPUTS, "runId": "run-2",
                                   "checkpointUri": "gs://verl-data/verl/checkpoints/run-2"}))
    root = bucket_dir(tmp_path / "bucket")
    assert cli.main(["report", "--outputs", str(outputs), "--bucket-dir", str(root), "--run", "run-1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "Run run-1: measured only: not compared, the stack outputs model its run run-2, not run-1"
    assert out[3] == "step                          -   115.0 s      -        -  mean of verl's timing_s/step over 4 steps"


def test_a_run_that_never_started_is_one_line_and_exit_8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(OUTPUTS))
    (tmp_path / "bucket").mkdir()
    assert cli.main(["report", "--outputs", str(outputs), "--bucket-dir", str(tmp_path / "bucket"),
                     "--run", "run-9"]) == report.EXIT_NEVER_STARTED == 9
    assert capsys.readouterr().err == (f"verl-gke: error: run run-9 never started: nothing recorded in "
                                       f"{tmp_path / 'bucket'}/logs/run-9/ (no record, timeline or step), nor in "
                                       "the cluster\n")


def test_report_of_synths_offline_outputs_is_one_line_and_exit_8(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({**OUTPUTS, "clusterCaCertificate": "c3ludGgtY2E=", "bucketName": "[unknown]"}))
    assert cli.main(["report", "--outputs", str(outputs)]) == 9
    assert capsys.readouterr().err == (f"verl-gke: error: nothing to report: {outputs} holds synth's offline "
                                       "outputs (clusterCaCertificate is a stand-in)\n")


def test_save_needs_the_stack_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", "--outputs", str(tmp_path / "x.json"), "--save"]) == 1
    assert capsys.readouterr().err == ("verl-gke: error: report --save writes measured/<stack>.json: name the stack "
                                       "with --stack NAME\n")


def test_report_help_lists_only_its_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["report", "--help"])
    out = capsys.readouterr().out
    flags = sorted({w.rstrip(",") for w in out.split() if w.startswith("--") and w.rstrip(",")[2:].replace("-", "").isalpha()})
    assert flags == ["--bucket-dir", "--help", "--kube-api-url", "--outputs", "--plot", "--run", "--save", "--stack"]



class Api:
    """The Kubernetes API's answers report reads (NodeList, EventList, JobList by label, the RayCluster)."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers, self.asked = answers, []

    def request(self, method: str, path: str) -> Any:
        self.asked.append(path)
        return self.answers.get(path)


def test_report_reads_the_bucket_gke_and_the_live_cluster(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --bucket-dir: `gcloud storage cat/ls` (a stand-in answering as gcloud does: an object's text,
    `ls -l` lines, exit 1 with "One or more URLs matched no objects."), GKE's Cluster and the cluster's API."""
    root = bucket_dir(tmp_path / "bucket")
    for i, marker in enumerate(LIVE["staged"]):
        (root / "data" / f"m{i}").mkdir(parents=True)
        (root / "data" / f"m{i}" / ".verl-gke-staged.json").write_text(json.dumps(marker))
    (tmp_path / "cluster.json").write_text(json.dumps(LIVE["cluster"]))
    (tmp_path / "listing").write_text(listing())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(
        "#!/bin/bash\n"
        f'echo "$*" >> "{tmp_path}/calls"\n'
        'case "$1 $2 $3" in\n'
        f'  "container clusters describe") cat "{tmp_path}/cluster.json";;\n'
        f'  "storage ls -l") cat "{tmp_path}/listing";;\n'
        f'  "storage ls gs://verl-data/**/.verl-gke-staged.json") cd "{root}" && '
        'for f in data/*/.verl-gke-staged.json; do echo "gs://verl-data/$f"; done;;\n'
        f'  "storage cat "*) p="{root}/${{3#gs://verl-data/}}"; if [[ -f $p ]]; then cat "$p"; else '
        'echo "ERROR: (gcloud.storage.cat) One or more URLs matched no objects." >&2; exit 1; fi;;\n'
        '  *) echo "ERROR: unexpected $*" >&2; exit 1;;\n'
        'esac\n')
    gcloud.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    api = Api({"/api/v1/nodes": LIVE["nodes"], "/api/v1/namespaces/default/events": LIVE["events"],
               "/apis/batch/v1/namespaces/default/jobs?labelSelector=app.kubernetes.io/component%3Ddata-staging":
                   {"items": [LIVE["staging"]]},
               "/apis/ray.io/v1/namespaces/default/rayclusters/b200-ray-cluster": LIVE["ray_cluster"]})
    monkeypatch.setattr(report.gke_facts, "describe", lambda name, location: report.gke_facts.ClusterFacts("e", CA))
    monkeypatch.setattr("access.cluster_api.cluster_api", lambda endpoint, ca, timeout_s: api)
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(OUTPUTS))
    assert cli.main(["report", "--outputs", str(outputs)]) == 0
    assert capsys.readouterr().out.splitlines() == EXPECTED
    calls = set((tmp_path / "calls").read_text().splitlines())
    assert {"container clusters describe verl-a4 --location us-central1-b --format json",
            "storage ls gs://verl-data/**/.verl-gke-staged.json",
            "storage ls -l -r gs://verl-data/verl/checkpoints/run-1/**",
            "storage cat gs://verl-data/logs/run-1/timeline.jsonl",
            "storage cat gs://verl-data/data/m0/.verl-gke-staged.json"} <= calls
