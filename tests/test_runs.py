"""The run as the user's handle (`verl-gke wait`, `logs`, `metrics`, `stop`, `runs` by run id, across
attempts) and its logs in the bucket (workloads/run_logs.py), against the suite's real Ray head on
127.0.0.1 (the session `ray_head`), the Kubernetes API stand-in (tests/kube_api.py) that keeps the run
records, and the run supervisor's own decider (real `decide`, real steps). The RayCluster's suspend is
recorded, not done: the head stays for the next test; "the head gone" is a closed port."""

from __future__ import annotations

import json
import re
import shlex
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from ray.job_submission import JobSubmissionClient

from components.grpo_job import GrpoJobProvider
from components.job_spec import JobSpec
from domain.bucket import LOGS_DIR
from tests.kube_api import kube_api
from tests.ray_head import free_ports
from tests.test_run_faults import supervising, wait_for
from tests.test_run_supervisor import RecordingControl
from tests.test_cli import error_line, outputs_doc, run, write_outputs
from verl_gke import runs, stack_outputs
from workloads import run_lifecycle, run_logs
from workloads.gcs import Gcs
from workloads.kube import KubernetesApi
from workloads.run_lifecycle import USER_STOPPED, Decider, RayJobs, View, decide
from workloads.run_logs import DirectorySink, LogCopier
from workloads.run_record import Attempt, Ended, Outcome, RecordStore, RunRecord, record_name
from workloads.run_supervisor import SupervisorConfig, decider, step

NAMESPACE = "ray"

# Attempt 0 logs a step and is killed (SIGKILL of its driver, as the OOM killer or a lost pod does);
# attempt 1 finds its marker (its checkpoint), logs steps 2 and 3 and succeeds.
TRAIN = r"""
import os, pathlib, signal, sys, time
marker = pathlib.Path(sys.argv[1])
if not marker.exists():
    time.sleep(2)  # RUNNING when `pulumi up`'s create returns
    print("step:1 - critic/score/mean:0.100 - perf/time_per_step:90.000", flush=True)
    marker.write_text("1")
    print("attempt", 0, "killed", flush=True)  # not the source's text: Ray logs the entrypoint
    os.kill(os.getpid(), signal.SIGKILL)
for step in (2, 3):
    print(f"step:{step} - critic/score/mean:0.{step}00 - perf/time_per_step:{88 + step}.000", flush=True)
print("attempt", 1, "done", flush=True)
"""
LONG = r"""
import time
for step in range(1, 600):
    print(f"step:{step} - critic/score/mean:0.100 - perf/time_per_step:1.000", flush=True)
    time.sleep(0.5)
"""


@pytest.fixture
def api() -> Iterator[str]:
    with kube_api() as (url, _state):
        yield url


def start(head: str, api_url: str, script: str, *args: str) -> JobSpec:
    """`pulumi up`'s create, as the GrpoJob provider does it: the run's record, attempt 0 claimed and submitted.
    The release waits for a head with no live job, so a job an earlier test of this worker left running on
    the shared head is stopped first."""
    client = JobSubmissionClient(head)
    for job in client.list_jobs():
        if job.status in ("PENDING", "RUNNING"):
            client.stop_job(job.submission_id)
    stack = f"t{uuid.uuid4().hex[:8]}"
    entry = " ".join(shlex.quote(a) for a in [sys.executable, "-c", script, *args])
    props = {"dashboard_url": head, "kube_api_url": api_url, "namespace": NAMESPACE, "stack": stack,
             "head_service": f"rc-{stack}-head-svc", "run_record": f"rc-{stack}-run", "entrypoint": entry,
             "runtime_env": {}, "startup_grace_s": 0, "ready_timeout_s": 60, "supervised_attempts": 2}
    GrpoJobProvider().create(props)
    return JobSpec.from_props(props)


def supervisor(head: str, api_url: str, spec: JobSpec, control: RecordingControl, bucket: Path) -> Decider:
    config = SupervisorConfig(head_url=head, submission_ids=spec.attempt_ids, entrypoint=spec.entrypoint,
                              runtime_env=spec.runtime_env, expected_workers=0, expected_gpus=0, run_id=spec.run_key,
                              generation=spec.attempt, settle_s=0.0, backoff_s=0.0, poll_s=0.2, replace_window_s=0.0,
                              max_retries=1)
    return decider(config, KubernetesApi(api_url), NAMESPACE, spec.ray_cluster, log=lambda _line: None,
                   control=control, sink=DirectorySink(bucket))


class WithLogCopy:
    """The supervisor's loop step (run_forever's: decide, then copy the logs) for test_run_faults.supervising."""

    def __init__(self, running: Decider) -> None:
        self.running = running

    def step(self) -> None:
        step(self.running)


def outputs_for(tmp_path: Path, spec: JobSpec) -> Path:
    return write_outputs(tmp_path / "outputs.json", outputs_doc(
        spec.submission_id, runId=spec.run_key, runRecord=record_name(spec.ray_cluster, spec.run_key),
        rayClusterName=spec.ray_cluster, namespace=NAMESPACE))


def record_of(api_url: str, spec: JobSpec) -> RunRecord:
    found = RecordStore(KubernetesApi(api_url), NAMESPACE, spec.ray_cluster).get(spec.run_key).record
    assert found is not None
    return found


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_wait_follows_the_run_across_a_killed_attempt_to_success_and_logs_outlive_the_head(
        capsys: pytest.CaptureFixture[str], ray_head: str, api: str, tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    spec = start(ray_head, api, TRAIN, str(tmp_path / "marker"))
    outputs = outputs_for(tmp_path, spec)
    where = ("--outputs", str(outputs), "--kube-api-url", api)
    control = RecordingControl()
    with supervising(WithLogCopy(supervisor(ray_head, api, spec, control, bucket))):
        code, out, err = run(capsys, "wait", *where, "--dashboard-url", ray_head, "--poll", "0.3")
        assert code == 0, err
        assert out == f"run {spec.run_key} SUCCEEDED after 2 attempt(s)\n"
        first, second = spec.attempt_ids[:2]
        assert f"verl-gke: run {spec.run_key}: attempt 0 (pulumi-up, pulumi-up)\n" in err
        assert f"verl-gke: run {spec.run_key}: attempt 1 (supervisor, run-failed: after {first}: " in err

        # What following the first attempt's submission id (grpoSubmissionId, all 0.5.1 had) says of it.
        code, _, err = run(capsys, "wait", "--outputs", str(outputs), "--dashboard-url", ray_head, "--submission-id",
                           first)
        assert code == runs.EXIT_FAILED and error_line(err).startswith(f"verl-gke: error: job {first} ended FAILED")

        # On the head: the current attempt, one by number, and all of them.
        code, out, err = run(capsys, "logs", *where, "--dashboard-url", ray_head)
        assert code == 0, err
        assert "attempt 1 done" in out and "attempt 0 killed" not in out
        code, out, err = run(capsys, "logs", *where, "--dashboard-url", ray_head, "--attempt", "0")
        assert code == 0 and "attempt 0 killed" in out and "attempt 1 done" not in out
        code, out, err = run(capsys, "logs", *where, "--dashboard-url", ray_head, "--all")
        assert code == 0, err
        headers = [line for line in out.splitlines() if line.startswith("==> ")]
        assert headers == ["==> attempt 0 (pulumi-up, pulumi-up) <==",
                           f"==> attempt 1 (supervisor, run-failed: after {first}: "
                           f"{record_of(api, spec).attempts[1].reason.split(': ', 1)[1]}) <=="]
        assert out.index("attempt 0 killed") < out.index(headers[1]) < out.index("attempt 1 done")
        # The release: the copy is flushed before the suspend.
        wait_for(lambda: record_of(api, spec).released and control.suspended, 60, "the release")
    assert control.suspended
    folder = bucket / LOGS_DIR / spec.run_key
    assert sorted(p.name for p in folder.iterdir()) == ["attempt-0.log", "attempt-1.log", "decisions.log",
                                                       "record.json", "timeline.jsonl"]
    assert RunRecord.from_json((folder / "record.json").read_text()).released
    assert "run ended: succeeded" in (folder / "decisions.log").read_text()

    # The head gone: the same commands read the bucket's copy.
    (closed,) = free_ports(1)
    gone = ("--dashboard-url", f"http://127.0.0.1:{closed}", "--head-timeout", "1", "--bucket-dir", str(bucket))
    code, out, err = run(capsys, "logs", *where, *gone, "--all")
    assert code == 0, err
    assert f"reading the run's log copy in {bucket}/{LOGS_DIR}/{spec.run_key}/" in err
    assert out.index("attempt 0 killed") < out.index("==> attempt 1 ") < out.index("attempt 1 done")
    code, out, err = run(capsys, "logs", "--outputs", str(outputs), "--dashboard-url", ray_head, "--bucket-dir",
                         str(bucket), "--from-bucket", "--copy-wait", "5", "--attempt", "1")
    assert code == 0, err
    assert "attempt 1 done" in out and "==>" not in out
    code, out, err = run(capsys, "metrics", *where, *gone)
    assert code == 0, err
    assert [line.split()[:2] for line in out.splitlines()[1:4]] == [["1", "0.100"], ["2", "0.200"], ["3", "0.300"]]
    # Steps of 90, 90 and 91 s: 90.33 s, 2.06x the outputs' 43.8 s; 2.06 x 2,712.3 s = 93.2 min, 45.2 modeled.
    assert ("Step time: measured 90 s (mean of 3 steps), modeled 44 s: 2.06x the model, so the run takes ~93 min at "
            "this pace, not the modeled ~45; the model assumes 30% MFU in training (docs/verl-settings.md)") in out.splitlines()


@pytest.mark.ray
@pytest.mark.timeout(120)
def test_stop_ends_the_run_through_its_record_and_runs_lists_it_stopped(
        capsys: pytest.CaptureFixture[str], ray_head: str, api: str, tmp_path: Path) -> None:
    spec = start(ray_head, api, LONG)
    client = JobSubmissionClient(ray_head)
    wait_for(lambda: "step:2 " in client.get_job_logs(spec.submission_id), 60, "two training steps")
    outputs = outputs_for(tmp_path, spec)
    where = ("--outputs", str(outputs), "--kube-api-url", api)
    control = RecordingControl()
    with supervising(WithLogCopy(supervisor(ray_head, api, spec, control, tmp_path / "bucket"))):
        code, out, err = run(capsys, "stop", *where, "--poll", "0.2", "--timeout", "60")
        assert code == 0, err
        assert out == f"run {spec.run_key} ended: {USER_STOPPED}; GPU workers released\n"
        assert ("waiting up to 1m00s for the run's decider (the run supervisor) to stop attempt 0, "
                "keep the checkpoints and release the GPU workers") in err
    assert client.get_job_status(spec.submission_id) == "STOPPED"
    assert control.suspended
    # Again: nothing more to do.
    code, out, _ = run(capsys, "stop", *where, "--no-wait")
    assert (code, out) == (0, f"run {spec.run_key} already ended: {USER_STOPPED}\n")
    code, out, err = run(capsys, "wait", *where)
    assert code == runs.EXIT_STOPPED
    assert error_line(err) == f"verl-gke: error: run {spec.run_key} ended STOPPED: {USER_STOPPED}"

    code, out, err = run(capsys, "runs", *where, "--step-times", "--bucket-dir", str(tmp_path / "bucket"))
    assert code == 0, err
    rows = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines())
    assert rows["Run"] == f"{spec.run_key}  STOPPED: stopped by verl-gke stop"  # the state, then the message
    assert rows["Attempts"] == "0 (pulumi-up)"
    assert rows["Checkpoints"] == f"gs://verl-data-my-project-123/verl/checkpoints/{spec.run_key}"
    assert rows["Model"] == "none (not exported)"
    assert re.fullmatch(r"0\.\d GPU-hours \(0\.0\d h x 16 GPUs\), \$\d\.\d\d at \$184\.94/h", rows["Usage"])
    # Steps of 1 s against the 43.8 s the outputs model: 0.02x the model.
    assert re.fullmatch(r"measured 1 s \(mean of \d+ steps\), modeled 44 s: 0\.02x the model, so the run takes ~1 min "
                        r"at this pace, not the modeled ~45; the model assumes 30% MFU in training \(docs/verl-settings\.md\)",
                        rows["Step time"])


# --- without Ray: the record alone decides what `wait` says ------------------------------------


@pytest.mark.parametrize(("outcome", "shown", "code"), [
    (run_lifecycle.SUCCEEDED, "", 0),
    (Outcome(Ended.FAILED, "RetriesSpent", "failed by itself 3 times: exit 1"),
     "FAILED: failed by itself 3 times: exit 1", runs.EXIT_FAILED),
    (run_lifecycle.DEPLOY_FAILED, "FAILED: deploy failed before any attempt ran", runs.EXIT_FAILED),
    (Outcome(Ended.FAILED, "PreemptionsSpent", "lost nodes 10 times"), "FAILED: lost nodes 10 times", runs.EXIT_FAILED),
    (USER_STOPPED, "STOPPED: stopped by verl-gke stop", runs.EXIT_STOPPED),
    (run_lifecycle.DELETED, "STOPPED: stopped by pulumi (delete or replace)", runs.EXIT_STOPPED),
    (run_lifecycle.stopped_outside("verl-grpo-a4-0123456789ab"), "STOPPED: verl-grpo-a4-0123456789ab was stopped",
     runs.EXIT_STOPPED),
    (run_lifecycle.budget_spent(3600), "OVER BUDGET: budget of 3600 s spent", runs.EXIT_OVER_BUDGET),
    (run_lifecycle.head_outage(1800), "LOST: the Ray head did not answer for 1800 s", runs.EXIT_LOST),
])
def test_wait_exits_by_the_runs_outcome(capsys: pytest.CaptureFixture[str], api: str, tmp_path: Path,
                                        outcome: Outcome, shown: str, code: int) -> None:
    """By the state the run ended in, never by its message's words; the error shows both."""
    store = RecordStore(KubernetesApi(api), NAMESPACE, "b200-ray-cluster")
    store.write(store.get("run-1"), RunRecord("run-1", attempts=(Attempt(0, "sid-0", "pulumi-up", "pulumi-up",
                                                                         submitted=True),), outcome=outcome))
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc("sid-0", runId="run-1", namespace=NAMESPACE))
    got, out, err = run(capsys, "wait", "--outputs", str(outputs), "--kube-api-url", api)
    assert got == code
    if code:
        assert error_line(err) == f"verl-gke: error: run run-1 ended {shown}"
    else:
        assert out == "run run-1 SUCCEEDED after 1 attempt(s)\n"
    # The same message under another state is classified by the state alone.
    store.write(store.get("run-1"), replace(store.get("run-1").record, outcome=replace(outcome, state=Ended.LOST)))
    assert run(capsys, "wait", "--outputs", str(outputs), "--kube-api-url", api)[0] == runs.EXIT_LOST


def test_wait_on_a_run_that_never_started_names_its_record(capsys: pytest.CaptureFixture[str], api: str,
                                                          tmp_path: Path) -> None:
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc("sid-0", runId="run-9", namespace=NAMESPACE))
    code, _, err = run(capsys, "wait", "--outputs", str(outputs), "--kube-api-url", api)
    assert code == 1
    assert error_line(err) == (f"verl-gke: error: run run-9 has no record ({record_name('b200-ray-cluster', 'run-9')} "
                               f"in namespace {NAMESPACE}): it was never started on this stack (`pulumi up` starts "
                               "it), or its record was deleted or is unreadable: if its GPU workers are up, the run "
                               "supervisor records it again within verl-gke:runReplaceWindowSeconds; run this again "
                               "then")


def test_a_stop_asked_in_the_record_ends_the_run_and_stops_its_live_attempt() -> None:
    record = RunRecord("run-1", attempts=(Attempt(0, "sid-0", "pulumi-up", "pulumi-up", submitted=True),))
    asked = run_lifecycle.stop_asked(record)
    assert asked is not None and asked.desired == "stopped" and not asked.outcome
    assert run_lifecycle.stop_asked(asked) is None  # idempotent
    policy = run_lifecycle.Policy(run_id="run-1", generation=0, submission_ids=("sid-0", "sid-1"))
    changed, effects = decide(View(records={"run-1": asked}, policy=policy, jobs={"sid-0": {"status": "RUNNING"}},
                                   capacity=None, cluster="running"))
    assert changed["run-1"].outcome == USER_STOPPED
    assert effects == [run_lifecycle.Effect("stop", "run-1", "sid-0")]
    # Never resubmitted: the next step, the attempt stopped, releases.
    changed, effects = decide(View(records={"run-1": changed["run-1"]}, policy=policy,
                                   jobs={"sid-0": {"status": "STOPPED"}}, capacity=None, cluster="running"))
    assert changed["run-1"].released and effects == [run_lifecycle.Effect("suspend")]


def test_the_release_goes_on_when_the_log_copy_is_cut_and_the_record_says_so(api: str, tmp_path: Path) -> None:
    (closed,) = free_ports(1)  # a head that no longer answers: nothing can be copied
    config = SupervisorConfig(head_url=f"http://127.0.0.1:{closed}", submission_ids=["sid-0"], entrypoint="x",
                              runtime_env={}, expected_workers=0, expected_gpus=0, run_id="run-1")
    control = RecordingControl()
    running = decider(config, KubernetesApi(api), NAMESPACE, "rc", log=lambda _line: None, control=control,
                      sink=DirectorySink(tmp_path), ray=RayJobs(f"http://127.0.0.1:{closed}", timeout_s=1))
    store = RecordStore(KubernetesApi(api), NAMESPACE, "rc")
    store.write(store.get("run-1"), RunRecord("run-1", attempts=(Attempt(0, "sid-0", "pulumi-up", "pulumi-up",
                                                                         submitted=True),), outcome=run_lifecycle.SUCCEEDED,
                                              released=True))
    assert running.lease.hold()
    running.hands.set_suspended(True)
    assert control.suspended
    assert "log copy cut after 0 s: " in record_of_run(api, "rc", "run-1").decisions[-1]


def record_of_run(api_url: str, cluster: str, run_id: str) -> RunRecord:
    found = RecordStore(KubernetesApi(api_url), NAMESPACE, cluster).get(run_id).record
    assert found is not None
    return found


def test_the_copy_is_at_most_a_minute_behind_and_keeps_every_decision(tmp_path: Path) -> None:
    now = [0.0]
    records: dict[str, RunRecord] = {"run-1": RunRecord("run-1").decided("one", 0.0)}
    (closed,) = free_ports(1)
    copier = LogCopier(RayJobs(f"http://127.0.0.1:{closed}", timeout_s=1), DirectorySink(tmp_path),
                       lambda: records, clock=lambda: now[0], log=lambda _line: None)
    copier.tick()  # no attempt: the head is not asked
    decisions = tmp_path / LOGS_DIR / "run-1" / "decisions.log"
    assert decisions.read_text() == "1970-01-01T00:00:00Z one\n"
    records["run-1"] = replace(records["run-1"].decided("two", 1.0), decisions=("1970-01-01T00:00:01Z two",))
    now[0] = 59.0
    copier.tick()
    assert decisions.read_text() == "1970-01-01T00:00:00Z one\n"  # not due yet
    now[0] = 60.0
    copier.tick()
    assert decisions.read_text() == "1970-01-01T00:00:00Z one\n1970-01-01T00:00:01Z two\n"
    assert run_logs.LOGS_DIR == LOGS_DIR


# --- the stack: outputs that name the run, the supervisor's right to write logs/ and nothing else -------


def test_the_stack_outputs_name_the_run_and_the_supervisor_may_write_only_its_logs(synth_stack: Any) -> None:
    from components.gcs_fuse_storage import ksa_principal
    from domain.config import load_config
    from domain.stack_files import raw_config
    from domain.stack_run import stack_run
    from verl_gke import synth

    result = synth_stack("a4-standard")
    cfg = load_config(raw_config("a4-standard")[0])
    run_id, _ = stack_run(cfg)
    out = result.outputs
    assert (out["runId"], out["runRecord"]) == (run_id, record_name(cfg.ray_cluster_name, run_id))
    assert out["runLogsUri"] == f"gs://{out['bucketName']}/{LOGS_DIR}/{run_id}/"
    assert out["grpoSubmissionId"].startswith("verl-grpo-a4-standard-")  # kept: the first attempt's id
    loaded = stack_outputs.from_mapping(out, "synth")
    assert (loaded.run_id, loaded.ray_cluster, loaded.bucket_name) == (run_id, cfg.ray_cluster_name,
                                                                     out["bucketName"])
    (config_map,) = [m for m in result.manifests() if m["kind"] == "ConfigMap"
                     and m["metadata"]["name"] == f"{cfg.ray_cluster_name}-supervisor"]
    assert json.loads(config_map["data"]["config.json"])["log_bucket"] == out["bucketName"]
    account = next(r for r in result.registrations if r.name == "supervisor-account")
    meta = account.inputs["metadata"]
    supervisor_principal = ksa_principal(project_number=synth.MOCK_PROJECT_NUMBER, project=cfg.project,
                                         uid=synth.mock_uid("ServiceAccount", meta["namespace"], meta["name"]))
    grants = [(r.type.rsplit(":", 1)[-1], r.inputs.get("managedFolder"), r.inputs["role"])
              for r in result.registrations
              if r.type.endswith(("IAMMember", "IamMember")) and r.inputs.get("member") == supervisor_principal]
    assert grants == [("ManagedFolderIamMember", f"{LOGS_DIR}/", "roles/storage.objectUser")]


def test_the_stack_exports_the_step_and_run_time_its_plan_models(synth_stack: Any) -> None:
    """What `runs --step-times` and `metrics` hold the measured step against (tests/test_step_time.py)."""
    from domain.config import load_config
    from domain.stack_files import raw_config
    from domain.verl_config import verl_run_check

    out = synth_stack("a4-standard").outputs
    _, plan = verl_run_check(load_config(raw_config("a4-standard")[0]))
    assert plan is not None and plan.time is not None
    # By hand, 2 x A4 (16 B200 at 2.25 PFLOP/s bf16, 30% MFU: 1.08e16 FLOP/s), Qwen2.5-32B (32,762,757,120
    # parameters), 2,048 sequences of 448 tokens (917,504 tokens): update 8 x P x T / 1.08e16 = 22.27 s,
    # log-probs (no reference policy) 2 x P x T / 1.08e16 = 5.57 s, rollout 2,048 x 320 tokens at
    # 16 x 6,867.6 tokens/s (2.25e15 x 20% / 2P a GPU) = 5.96 s and its tail (512 - 320 tokens at 20 ms: 3.84 s),
    # plus 10 s: 47.64 s a step.
    assert out["modeledStepSeconds"] == round(plan.time.step_s, 1) == 47.6
    # 58 steps, 6 validation passes (1,319 x 320 tokens at 16 x 6,867.6 tokens/s + the tail: 7.68 s each) and the
    # checkpoints' GPU time (domain/checkpoint_time.py's model, read from the plan).
    assert plan.time.validation_s == pytest.approx(1319 * 320 / (16 * 6867.6) + 3.84, abs=0.01)
    assert out["modeledRunSeconds"] == round(plan.time.run_s, 1) == pytest.approx(
        58 * 47.64 + 6 * 7.68 + plan.time.shape.checkpoint_s, abs=1.0)
    loaded = stack_outputs.from_mapping(out, "synth")
    assert (loaded.modeled_step_s, loaded.modeled_run_s) == (round(plan.time.step_s, 1), round(plan.time.run_s, 1))
    # verl's start-up, what `report` holds its measured twin against (the same figure synth prints).
    assert out["modeledVerlStartupSeconds"] == loaded.modeled_verl_startup_s == round(plan.time.startup_s, 1) > 0


@pytest.mark.parametrize(("outcome", "status"), [
    (USER_STOPPED, "STOPPED"), (run_lifecycle.DELETED, "STOPPED"), (run_lifecycle.stopped_outside("sid-0"), "STOPPED"),
    (run_lifecycle.budget_spent(60), "FAILED"), (run_lifecycle.SUCCEEDED, "SUCCEEDED"),
    (run_lifecycle.head_outage(9), "FAILED"), (replace(run_lifecycle.DEPLOY_FAILED, state=Ended.STOPPED), "STOPPED"),
])
def test_refresh_of_a_released_run_reports_grpo_job_status_by_its_outcome_state(api: str, outcome: Outcome,
                                                                                 status: str) -> None:
    """`pulumi refresh` once the run was released (no head): grpoJobStatus from the record's state alone."""
    (closed,) = free_ports(1)
    props = {"dashboard_url": f"http://127.0.0.1:{closed}", "kube_api_url": api, "namespace": NAMESPACE,
             "stack": "t0", "head_service": "rc-t0-head-svc", "run_record": "rc-t0-run", "entrypoint": "python -c 1",
             "runtime_env": {}}
    spec = JobSpec.from_props(props)
    store = RecordStore(KubernetesApi(api), NAMESPACE, spec.ray_cluster)
    store.write(store.get(spec.run_key), RunRecord(spec.run_key, attempts=(Attempt(0, "sid-0", "pulumi-up", "pulumi-up",
                                                                                   submitted=True),),
                                                   outcome=outcome, released=True))
    read = GrpoJobProvider().read("sid-0", {**props, "submission_id": "sid-0", "status": "RUNNING"})
    assert read.outs is not None and (read.outs["submission_id"], read.outs["status"]) == ("sid-0", status)


def test_logs_follow_streams_the_current_attempt_only(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc("sid-0", runId="run-1"))
    code, out, err = run(capsys, "logs", "--outputs", str(outputs), "--follow", "--all")
    assert (code, out) == (2, "")
    assert error_line(err) == ("verl-gke: error: logs: --follow streams the current attempt from the head: not with "
                               "--all, --attempt or --from-bucket (see verl-gke logs --help)")


def test_logs_of_an_attempt_the_run_does_not_have_names_the_ones_it_has(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    record = RunRecord("run-1", attempts=(Attempt(0, "sid-0", "pulumi-up", "pulumi-up", submitted=True),),
                       outcome=run_lifecycle.SUCCEEDED, released=True)
    DirectorySink(tmp_path).write(f"{LOGS_DIR}/run-1/record.json", record.to_json())
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc("sid-0", runId="run-1"))
    code, _, err = run(capsys, "logs", "--outputs", str(outputs), "--dashboard-url", "http://127.0.0.1:9",
                       "--bucket-dir", str(tmp_path), "--from-bucket", "--attempt", "3")
    assert code == 1
    assert error_line(err) == "verl-gke: error: run run-1 has attempts 0 to 0, not 3"
    code, _, err = run(capsys, "logs", "--outputs", str(outputs), "--dashboard-url", "http://127.0.0.1:9",
                       "--bucket-dir", str(tmp_path), "--from-bucket")
    assert code == 1
    assert error_line(err) == (f"verl-gke: error: {tmp_path}/{LOGS_DIR}/run-1/attempt-0.log does not exist: "
                               "attempt 0 was never copied")


class _Gcs(BaseHTTPRequestHandler):
    """The two GCS JSON API calls the copy makes, as cloud.google.com/storage/docs/json_api/v1 states them:
    objects.insert as a simple upload (`POST /upload/storage/v1/b/<bucket>/o?uploadType=media&name=<name>`,
    the body the object), objects.get of the data (`GET /storage/v1/b/<bucket>/o/<url-encoded name>?alt=media`,
    404 when there is none); each needs `Authorization: Bearer <token>` (401 without). And the GKE metadata
    server's token endpoint, which answers only with `Metadata-Flavor: Google` (403 otherwise;
    cloud.google.com/kubernetes-engine/docs/concepts/workload-identity#metadata_server)."""

    objects: dict[str, bytes] = {}
    TOKEN = "ya29.test"

    def log_message(self, *_args: Any) -> None:
        pass

    def _answer(self, code: int, body: bytes = b"") -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/token":
            if self.headers.get("Metadata-Flavor") != "Google":
                return self._answer(403)
            return self._answer(200, json.dumps({"access_token": self.TOKEN, "expires_in": 3599,
                                                 "token_type": "Bearer"}).encode())
        if self.headers.get("Authorization") != f"Bearer {self.TOKEN}":
            return self._answer(401)
        prefix = "/storage/v1/b/bkt/o/"
        if not url.path.startswith(prefix) or urllib.parse.parse_qs(url.query).get("alt") != ["media"]:
            return self._answer(400)
        name = urllib.parse.unquote(url.path.removeprefix(prefix))
        found = self.objects.get(name)
        return self._answer(404) if found is None else self._answer(200, found)

    def do_POST(self) -> None:  # noqa: N802
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        if self.headers.get("Authorization") != f"Bearer {self.TOKEN}":
            return self._answer(401)
        if url.path != "/upload/storage/v1/b/bkt/o" or query.get("uploadType") != ["media"] or "name" not in query:
            return self._answer(400)
        self.objects[query["name"][0]] = self.rfile.read(int(self.headers["Content-Length"]))
        return self._answer(200, b"{}")


def test_the_copy_through_the_gcs_json_api_with_the_pods_token() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Gcs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        sink = run_logs.GcsSink(Gcs("bkt", timeout_s=5, storage_url=base, token_url=f"{base}/token"))
        assert sink.read("logs/run-1/decisions.log") is None
        sink.write("logs/run-1/decisions.log", "2026-12-06T00:00:00Z one\n")
        assert _Gcs.objects == {"logs/run-1/decisions.log": b"2026-12-06T00:00:00Z one\n"}
        assert sink.read("logs/run-1/decisions.log") == "2026-12-06T00:00:00Z one\n"
    finally:
        server.shutdown()
        server.server_close()


def test_each_run_has_its_checkpoint_folder_beside_the_stacks_own() -> None:
    from dataclasses import replace

    from tests.run_world import OUTPUTS

    stack = replace(OUTPUTS, checkpoint_uri="gs://b/verl/checkpoints/run-a", run_id="run-a")
    assert stack.run_checkpoint_uri("run-a") == "gs://b/verl/checkpoints/run-a"
    assert stack.run_checkpoint_uri("run-0") == "gs://b/verl/checkpoints/run-0"


# --- what CI reads after the run: the final outcome and modelUri from the record, not the stale outputs --


def _json_line(out: str) -> dict[str, Any]:
    """The one JSON object `--json` prints on stdout (progress goes to stderr)."""
    lines = out.splitlines()
    assert len(lines) == 1, out
    return json.loads(lines[0])


def test_wait_json_waits_for_the_claimed_export_and_gives_the_model_uri(capsys: pytest.CaptureFixture[str],
                                                                        api: str, tmp_path: Path) -> None:
    """`pulumi stack output` after the run still says grpoJobStatus RUNNING and modelUri '' (the outputs
    are those of the last `up` or refresh); `wait --json` answers from the record once the export is over."""
    from workloads.export_model import model_path

    store = RecordStore(KubernetesApi(api), NAMESPACE, "b200-ray-cluster")
    attempts = (Attempt(0, "sid-0", "pulumi-up", "pulumi-up", submitted=True),
                Attempt(1, "sid-1", "supervisor", "preempted", submitted=True))
    store.write(store.get("run-1"), RunRecord("run-1", attempts=attempts, outcome=run_lifecycle.SUCCEEDED,
                                              export_id="verl-export-run-1-0", export_target="models/run-1"))

    def export_ends() -> None:
        time.sleep(0.6)
        stored = store.get("run-1")
        assert stored.record is not None
        store.write(stored, replace(stored.record, export_outcome="SUCCEEDED"))

    ender = threading.Thread(target=export_ends)
    ender.start()
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc("sid-0", runId="run-1", namespace=NAMESPACE))
    code, out, _ = run(capsys, "wait", "--json", "--poll", "0.1", "--outputs", str(outputs), "--kube-api-url", api)
    ender.join()
    assert code == 0
    assert _json_line(out) == {
        "runId": "run-1", "outcome": "succeeded", "status": "SUCCEEDED", "state": "SUCCEEDED", "reason": "Succeeded",
        "message": "succeeded", "attempts": 2, "submissionId": "sid-1",
        "released": False, "exportOutcome": "SUCCEEDED",
        "modelUri": f"gs://verl-data-my-project-123/{model_path('run-1')}", "startFrom": ""}


def test_wait_json_of_a_failed_run_keeps_its_exit_code_and_names_no_model(capsys: pytest.CaptureFixture[str],
                                                                          api: str, tmp_path: Path) -> None:
    store = RecordStore(KubernetesApi(api), NAMESPACE, "b200-ray-cluster")
    store.write(store.get("run-1"), RunRecord("run-1", attempts=(Attempt(0, "sid-0", "pulumi-up", "pulumi-up",
                                                                         submitted=True),),
                                              outcome=Outcome(Ended.FAILED, "RetriesSpent",
                                                              "failed by itself 3 times: exit 1"), released=True))
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc("sid-0", runId="run-1", namespace=NAMESPACE))
    code, out, err = run(capsys, "wait", "--json", "--outputs", str(outputs), "--kube-api-url", api)
    assert code == runs.EXIT_FAILED
    assert error_line(err) == "verl-gke: error: run run-1 ended FAILED: failed by itself 3 times: exit 1"
    assert _json_line(out) == {"runId": "run-1", "outcome": "failed by itself 3 times: exit 1", "status": "FAILED",
                               "state": "FAILED", "reason": "RetriesSpent",
                               "message": "failed by itself 3 times: exit 1", "attempts": 1, "submissionId": "sid-0", "released": True, "exportOutcome": "",
                               "modelUri": "", "startFrom": ""}


def test_runs_json_lists_every_run_with_its_outcome_and_model(capsys: pytest.CaptureFixture[str], api: str,
                                                              tmp_path: Path) -> None:
    from workloads.export_model import model_path

    store = RecordStore(KubernetesApi(api), NAMESPACE, "b200-ray-cluster")
    store.write(store.get("run-1"), RunRecord("run-1", outcome=run_lifecycle.SUCCEEDED, export_outcome="SUCCEEDED",
                                              attempts=(Attempt(0, "sid-0", "pulumi-up", "pulumi-up",
                                                                submitted=True),), released=True))
    store.write(store.get("run-2"), RunRecord("run-2", attempts=(Attempt(0, "sid-9", "pulumi-up", "pulumi-up",
                                                                         submitted=True),),
                                              start_from="run run-1 step 20"))
    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc("sid-9", runId="run-2", namespace=NAMESPACE))
    code, out, _ = run(capsys, "runs", "--json", "--outputs", str(outputs), "--kube-api-url", api)
    assert code == 0
    assert {r["runId"]: (r["status"], r["state"], r["reason"], r["modelUri"], r["startFrom"]) for r in json.loads(out)} == {
        "run-1": ("SUCCEEDED", "SUCCEEDED", "Succeeded", f"gs://verl-data-my-project-123/{model_path('run-1')}", ""),
        "run-2": ("RUNNING", "RUNNING", "", "", "run run-1 step 20")}
    code, out, _ = run(capsys, "runs", "--outputs", str(outputs), "--kube-api-url", api)
    assert code == 0 and "Started from  run run-1 step 20" in out


def test_wait_honours_its_timeout_while_the_run_record_is_unreadable(monkeypatch: pytest.MonkeyPatch) -> None:
    """`wait --timeout 30` during an API outage ends at 30 s with the timeout's own exit status (8), not
    after the 600 s outage window."""
    from tests.run_world import OUTPUTS

    now = [1000.0]
    monkeypatch.setattr(runs.time, "monotonic", lambda: now[0])

    def unreadable() -> Any:
        raise ConnectionRefusedError("connection refused")

    def time_passes(seconds: float) -> None:
        now[0] += seconds

    run = runs.Run("run-a", OUTPUTS, runs.BucketCopy("run-a", "", None), lambda: None)
    monkeypatch.setattr(run, "record", unreadable)
    with pytest.raises(runs.CliError) as caught:
        runs.follow(run, timeout_s=30.0, poll_s=10.0, outage_window_s=600.0, sleep=time_passes)
    assert getattr(caught.value, "exit_code", 1) == 8
    assert now[0] - 1000.0 <= 30.0
    assert str(caught.value) == ("run run-a: its record was not readable for 0m30s, and --timeout 30 s has passed "
                                 "(the run may go on): connection refused")
