"""The modeled step time (domain/run_time.py) as the program hands it over (its export: tests/test_runs.py),
and `verl-gke runs --step-times` and `verl-gke metrics` holding the measured step against it. No Ray: the run
records live in the Kubernetes API stand-in (tests/kube_api.py), the logs in a bucket folder (`--bucket-dir`)
or a saved log file."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from domain.bucket import LOGS_DIR
from tests.kube_api import kube_api
from tests.test_cli import outputs_doc, run, write_outputs
from verl_gke import stack_outputs
from workloads.kube import KubernetesApi
from workloads.run_lifecycle import SUCCEEDED
from workloads.run_record import Attempt, RecordStore, RunRecord

# Round figures, so that each line below is a hand calculation: steps of 50 s and 54 s are a mean of 52 s,
# 52 / 40 = 1.30x the model; the run at that pace 1.30 x 2,400 s = 3,120 s = 52 min, modeled 40 min.
MODEL = {"modeledStepSeconds": 40.0, "modeledRunSeconds": 2400.0}
OLDER = {"modeledStepSeconds": None, "modeledRunSeconds": None}
"""outputs_doc leaves these out: a stack last updated before they were exported."""
NAMESPACE = "ray"
LOG = ("(TaskRunner pid=1) step:1 - critic/score/mean:0.100 - perf/time_per_step:50.000\n"
       "(TaskRunner pid=1) step:2 - critic/score/mean:0.200 - perf/time_per_step:54.000\n")
NO_STEP_TIME = "(TaskRunner pid=1) step:1 - critic/score/mean:0.100\n"
COMPARED = ("measured 52 s (mean of 2 steps), modeled 40 s: 1.30x the model, so the run takes ~52 min at this pace, "
            "not the modeled ~40; the model assumes 30% MFU in training (docs/verl-settings.md)")
NOT_MODELED = ("not modeled: the stack outputs have no modeledStepSeconds (a stack last updated by an older verl-gke, "
               "or a model or GPU platform the step model does not cover)")


def test_the_program_models_no_step_for_a_model_outside_the_table() -> None:
    from components.stack_config import from_pulumi
    from verl_gke import synth

    raw, secret_keys = synth.raw_config("a4-standard")
    got: list[Any] = []
    synth.run_in_mocks(lambda: got.append(from_pulumi()), stack="a4-standard", secret_keys=secret_keys,
                       config={**raw, "verl-gke:model": "example/Unknown-32B", "verl-gke:modelRevision": "0" * 40})
    [(cfg, modeled)] = got
    assert (cfg.model, modeled) == ("example/Unknown-32B", None)


def test_older_stacks_and_unmodeled_ones_read_as_no_model() -> None:
    older = outputs_doc("sid-0", **OLDER)
    assert "modeledStepSeconds" not in older
    for doc in (older, {**older, **OLDER}):  # absent, or null (`pulumi.export` of None)
        loaded = stack_outputs.from_mapping(doc, "stack")
        assert (loaded.modeled_step_s, loaded.modeled_run_s) == (None, None)


@pytest.fixture(scope="module")
def api() -> Iterator[str]:
    """One stand-in for the module: each test writes the same run's record anew."""
    with kube_api() as (url, _state):
        yield url


def _runs(capsys: pytest.CaptureFixture[str], api_url: str, tmp_path: Path, log: str | None,
          **outputs: Any) -> str:
    """`runs --step-times` on one ended run whose attempt 0 logged `log` (None: no copy of it); its Step time."""
    store = RecordStore(KubernetesApi(api_url), NAMESPACE, "b200-ray-cluster")
    store.write(store.get("run-1"), RunRecord("run-1", attempts=(Attempt(0, "sid-0", "pulumi-up", "pulumi-up",
                                                                         submitted=True),), outcome=SUCCEEDED))
    if log is not None:
        folder = tmp_path / "bucket" / LOGS_DIR / "run-1"
        folder.mkdir(parents=True)
        (folder / "attempt-0.log").write_text(log)
    doc = outputs_doc("sid-0", **{"runId": "run-1", "namespace": NAMESPACE, **outputs})
    outputs_file = write_outputs(tmp_path / "outputs.json", doc)
    code, out, err = run(capsys, "runs", "--outputs", str(outputs_file), "--kube-api-url", api_url, "--step-times",
                         "--bucket-dir", str(tmp_path / "bucket"))
    assert code == 0, err
    rows = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines())
    return rows["Step time"]


def test_runs_compares_the_measured_step_with_the_model(capsys: pytest.CaptureFixture[str], api: str,
                                                        tmp_path: Path) -> None:
    assert _runs(capsys, api, tmp_path, LOG, **MODEL) == COMPARED


def test_runs_without_a_step_logged_shows_the_model(capsys: pytest.CaptureFixture[str], api: str,
                                                    tmp_path: Path) -> None:
    assert _runs(capsys, api, tmp_path, NO_STEP_TIME, **MODEL) == (
        "no perf/time_per_step in the copied logs yet, modeled 40 s (the run ~40 min); the model assumes 30% MFU "
        "in training (docs/verl-settings.md)")


def test_runs_without_a_log_copy_shows_the_model(capsys: pytest.CaptureFixture[str], api: str,
                                                 tmp_path: Path) -> None:
    assert _runs(capsys, api, tmp_path, None, **MODEL).startswith("no perf/time_per_step in the copied logs yet, ")


def test_runs_on_a_stack_without_the_model_shows_the_measured_step(
        capsys: pytest.CaptureFixture[str], api: str, tmp_path: Path) -> None:
    assert _runs(capsys, api, tmp_path, LOG, **OLDER) == f"measured 52 s (mean of 2 steps), {NOT_MODELED}"


def test_runs_with_no_step_and_no_model_says_both(capsys: pytest.CaptureFixture[str], api: str,
                                                  tmp_path: Path) -> None:
    assert _runs(capsys, api, tmp_path, NO_STEP_TIME, **OLDER) == (f"no perf/time_per_step in the copied logs yet, "
                                                                  f"{NOT_MODELED}")


def test_the_model_without_a_run_time_still_gives_the_ratio(capsys: pytest.CaptureFixture[str],
                                                            api: str, tmp_path: Path) -> None:
    assert _runs(capsys, api, tmp_path, LOG, modeledStepSeconds=40.0, modeledRunSeconds=None) == (
        "measured 52 s (mean of 2 steps), modeled 40 s: 1.30x the model (run time unknown: steps unknown); the model "
        "assumes 30% MFU in training (docs/verl-settings.md)")


def test_runs_holds_only_the_stacks_own_run_against_its_model(capsys: pytest.CaptureFixture[str], api: str,
                                                              tmp_path: Path) -> None:
    # run-1 is an earlier run: the stack's settings (and its model) are now those of run-2.
    assert _runs(capsys, api, tmp_path, LOG, **MODEL, runId="run-2") == (
        "measured 52 s (mean of 2 steps), not compared: the stack outputs model its run run-2, not run-1")


def _metrics(capsys: pytest.CaptureFixture[str], tmp_path: Path, log: str, *outputs_args: str) -> list[str]:
    (tmp_path / "job.log").write_text(log)
    code, out, err = run(capsys, "metrics", "--log-file", str(tmp_path / "job.log"), *outputs_args)
    assert code == 0, err
    return [line for line in out.splitlines() if line.startswith("Step time")]


def test_metrics_compares_the_logs_step_time_with_the_stacks_model(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path) -> None:
    modeled = str(write_outputs(tmp_path / "outputs.json", outputs_doc("sid-0", runId="run-1", **MODEL)))
    older = str(write_outputs(tmp_path / "older.json", outputs_doc("sid-0", **OLDER)))
    log = tmp_path / "job.log"
    assert _metrics(capsys, tmp_path, LOG, "--outputs", modeled) == [f"Step time: {COMPARED}"]
    assert _metrics(capsys, tmp_path, LOG, "--outputs", modeled, "--run", "run-1") == [f"Step time: {COMPARED}"]
    assert _metrics(capsys, tmp_path, LOG, "--outputs", older) == [f"Step time: measured 52 s (mean of 2 steps), "
                                                                   f"{NOT_MODELED}"]
    assert _metrics(capsys, tmp_path, NO_STEP_TIME, "--outputs", modeled) == [
        f"Step time: no perf/time_per_step in {log} yet, modeled 40 s (the run ~40 min); the model assumes 30% MFU "
        "in training (docs/verl-settings.md)"]
    assert _metrics(capsys, tmp_path, LOG, "--outputs", modeled, "--run", "run-0") == [
        "Step time: measured 52 s (mean of 2 steps), not compared: the stack outputs model its run run-1, not run-0"]
    # A saved log alone names no stack: no model to compare with.
    assert _metrics(capsys, tmp_path, LOG) == []
