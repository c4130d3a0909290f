"""A new user's bad inputs, the way they meet them (a stack file plus `--set`, synth's flags): each one is
refused in one clean line that names its key or flag, never a traceback or a validator's own words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from domain.config import ConfigError, load_config
from domain.stack_files import raw_config
from verl_gke import output_dir, synth

REAL = {"gcp:project": "my-project-123", "verl-gke:reservation": "my-reservation"}
# Words of the libraries under us, which a user should never have to read.
FOREIGN = ("Traceback", "Input should", "input should", "validation error", "type=", "pydantic", "Error(")

CONFIG_CASES = [
    # (key, value, stack[, other keys set with it]): the one line names `key`.
    ("gcp:region", "us-central", "a4-standard"),
    ("gcp:zone", "us-central1", "a4-standard"),
    ("gcp:project", "My_Project", "a4-standard"),
    ("verl-gke:gpuNode", "4", "a4-standard"),
    ("verl-gke:gpuNodes", "0", "a4-standard"),
    ("verl-gke:gpuNodes", "two", "a4-standard"),
    ("verl-gke:gpuNodes", "4.5", "a4-standard"),
    ("verl-gke:gpuNodes", "16", "a4-standard"),
    ("verl-gke:runSupervisor", "yes", "a4-standard"),
    ("verl-gke:gpuSpot", "maybe", "a4"),
    ("verl-gke:cpuMachineType", "c2-standrad-16", "a4-standard"),
    ("verl-gke:reservation", "projects/other-proj/reservations", "a4-standard"),
    ("verl-gke:dataset", "hendrycks/competition_math", "a4-standard", {"verl-gke:datasetRevision": "a" * 40}),
    ("verl-gke:fabricMinBusBandwidthGbps", "1000", "a4-standard"),
    ("verl-gke:runMaxRetries", "1000", "a4-standard"),
    ("verl-gke:runMaxPreemptions", "1000", "a4-standard"),
    ("verl-gke:upgradeExclusionStart", "2999-01-01T00:00:00Z", "a4-standard"),
    ("verl-gke:upgradeExclusionStart", "tomorrow", "a4-standard"),
    ("verl-gke:verl", json.dumps({"trainer": {"experiment_name": "y" * 140_000}}), "a4-standard"),
    ("verl-gke:capacity", "spot", "a4-standard"),
    ("verl-gke:capacity", '["cheap"]', "a4-standard"),
    ("verl-gke:gpuNodeHourlyUsd", '{"reservation": -1}', "a4-standard"),
    ("verl-gke:gpuNodeHourlyUsd", "[1]", "a4-standard"),
    ("verl-gke:runBudgetUsd", "500", "a4-standard"),
    ("verl-gke:clusterMode", "serverless", "a4-standard"),
    ("verl-gke:platform", "h100", "a4-standard"),
    ("verl-gke:clusterName", "UPPER", "a4-standard"),
    ("verl-gke:bucketName", "goog-bucket", "a4-standard"),
    ("verl-gke:namespace", "Bad_NS", "a4-standard"),
    ("verl-gke:volumeCapacity", "768GB", "a4-standard"),
    ("verl-gke:nodeSubnetCidr", "10.0.0.0/33", "a4-standard"),
    ("verl-gke:masterAuthorizedCidrs", '["0.0.0.0/0"]', "a4-standard"),
    ("verl-gke:stagingTimeoutMinutes", "0", "a4-standard"),
    ("verl-gke:jobDashboardUrl", "ftp://head", "a4-standard"),
    ("verl-gke:verlImage", "verlai/verl:latest", "a4-standard"),
    ("verl-gke:kubernetesVersion", "latest", "a4-standard"),
    ("verl-gke:modelRevision", "main", "a4-standard"),
    ("verl-gke:workerCpus", "9999", "a4-standard"),
    ("verl-gke:jobAttempt", "-1", "a4-standard"),
    ("verl-gke:releaseChannel", "FAST", "a4-standard"),
    ("verl-gke:existingCluster", "1", "a4-standard"),
    ("verl-gke:jobReadyTimeoutSeconds", "9223372036854775807", "a4-standard"),
    ("gpuNodes", "4", "a4-standard"),
    # The smoke stack's verl settings are sized for its 2 L4s: a misspelt platform is its line alone.
    ("verl-gke:platform", "g3", "smoke", {"verl-gke:reservation": ""}),
    ("verl-gke:platform", "G2", "smoke", {"verl-gke:reservation": ""}),
]


@pytest.mark.parametrize(("key", "value", "stack", "more"), [(*case, {})[:4] for case in CONFIG_CASES])
def test_each_bad_value_is_one_clean_line_naming_its_key(key: str, value: str, stack: str, more: dict[str, str]):
    raw, secret_keys = raw_config(stack, overrides={**REAL, **more, key: value})
    with pytest.raises(ConfigError) as caught:
        load_config(raw, f"Pulumi.{stack}.yaml", secret_keys)
    [line] = caught.value.problems
    assert line.split(" ", 1)[0].rstrip(":") == key, line
    assert not [word for word in FOREIGN if word in line], line


def _marker_listing_a_folder(tmp_path: Path) -> list[str]:
    out = tmp_path / "out"
    (out / "manifests").mkdir(parents=True)
    (out / output_dir.MARKER).write_text(json.dumps({"files": ["manifests"]}))
    return ["a4", "--out", str(out)]


def _cloud_file(tmp_path: Path, text: str) -> list[str]:
    (tmp_path / "cloud.json").write_text(text)
    return ["a4", "--out", str(tmp_path / "out"), "--cloud", str(tmp_path / "cloud.json")]


FLAG_CASES = [
    ("--out", _marker_listing_a_folder),
    ("--out", lambda tmp: ["a4", "--out", str(tmp / "file.txt" / "sub")]),
    ("--cloud", lambda tmp: ["a4", "--out", str(tmp / "out"), "--cloud", str(tmp / "none.json")]),
    ("--cloud", lambda tmp: _cloud_file(tmp, "[1]")),
    ("--cloud", lambda tmp: _cloud_file(tmp, '{"gcp:compute/getReservation:getReservation": 3}')),
    ("--set", lambda tmp: ["a4", "--out", str(tmp / "out"), "--set", "gpuNodes"]),
    ("--bogus", lambda tmp: ["a4", "--bogus"]),
    ("stack", lambda tmp: ["../a4"]),
]


@pytest.mark.parametrize(("flag", "argv"), FLAG_CASES)
def test_each_bad_flag_is_one_clean_line_naming_it(flag: str, argv, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]):
    (tmp_path / "file.txt").write_text("mine")
    assert synth.main(argv(tmp_path)) == 2
    captured = capsys.readouterr()
    [line] = [line for line in captured.err.splitlines() if not line.startswith("synth: ")]
    assert line.startswith("synth failed: ") and flag in line, line
    assert captured.out == "" and not [word for word in FOREIGN if word in line], line


def test_a_misspelt_platform_lists_the_allowed_ones() -> None:
    raw, _ = raw_config("smoke", overrides={"gcp:project": "my-project-123", "verl-gke:platform": "l4"})
    with pytest.raises(ConfigError) as caught:
        load_config(raw, "Pulumi.smoke.yaml")
    assert caught.value.problems == ["verl-gke:platform = \"l4\": must be one of 'a4', 'a3u', 'a4x' or 'g2'"]


def test_a_model_too_big_for_the_smoke_gpu_is_refused_with_its_memory(capsys: pytest.CaptureFixture[str],
                                                                     tmp_path: Path) -> None:
    argv = ["smoke", "--out", str(tmp_path / "out"), "--set", "verl-gke:model=Qwen/Qwen2.5-32B-Instruct",
            "--set", "verl-gke:modelRevision=5ede1c97bbab6ce5cda5812749b4c0bdf79b18dd"]
    assert synth.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[1:3] == ["synth failed: Pulumi.smoke.yaml has 4 problems:",
                        "  verl-gke:verl.actor_rollout_ref.actor.ppo_max_token_len_per_gpu = 4096: the training phase "
                        "needs ~252 GiB per GPU (actor state 244, checkpointed activations 2, logits and their gradient "
                        "2 GiB) of the 22 GiB nvidia-l4, over the 20 GiB limit (10% margin): lower it or add GPU nodes"]
    assert not [word for line in err for word in FOREIGN if word in line]


def test_a_malformed_measured_file_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from domain import measured

    bad = tmp_path / "smoke.json"
    bad.write_text(json.dumps({"run": "r", "stack": "smoke", "measuredAt": "2026-12-07T12:00:00Z",
                               "rates": {"stepSeconds": 0}}))
    monkeypatch.setattr(measured, "path_of", lambda project_dir, stack: bad)
    assert synth.main(["smoke", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "synth failed: measured/smoke.json: rates.stepSeconds = 0: a number greater than 0"


def _stack_file_problems(tmp_path: Path, lines: str) -> list[str]:
    (tmp_path / "Pulumi.yaml").write_text((Path(__file__).parent.parent / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.mine.yaml").write_text(
        "config:\n  gcp:project: my-project-123\n  gcp:region: us-central1\n  gcp:zone: us-central1-b\n"
        f"  verl-gke:reservation: my-reservation\n{lines}")
    raw, secret_keys = raw_config("mine", tmp_path)
    with pytest.raises(ConfigError) as caught:
        load_config(raw, "Pulumi.mine.yaml", secret_keys)
    return caught.value.problems


def test_gpu_nodes_that_do_not_divide_the_default_batches_is_blamed_on_gpu_nodes_with_the_fix(tmp_path: Path):
    # The user set gpuNodes only: the batch sizes are the platform's defaults, so the line names gpuNodes.
    assert _stack_file_problems(tmp_path, '  verl-gke:gpuNodes: "3"\n') == [
        "verl-gke:gpuNodes = 3: verl's defaults, which the stack does not set, do not fit its 24 GPUs "
        "(data.train_batch_size x actor_rollout_ref.rollout.n (2048) must be divisible by the 24 GPUs (3 nodes x 8); "
        "ppo_mini_batch_size x rollout.n (2048) must be divisible by the data-parallel size (24)): use gpuNodes 1, 2, "
        "4 or 8, or set verl-gke:verl.data.train_batch_size and verl-gke:verl.actor_rollout_ref.actor."
        "ppo_mini_batch_size to sizes that fit."]


def test_a_fractional_run_budget_in_hours_is_refused_with_the_true_reason(tmp_path: Path):
    # Pulumi's config types (project.json simpleConfigType) have integer, no fractional number: `pulumi up`
    # refuses 1.5 for runBudgetHours, so the line says so and offers the whole hours around it.
    assert _stack_file_problems(tmp_path, "  verl-gke:runBudgetHours: 1.5\n") == [
        'verl-gke:runBudgetHours = "1.5": must be a whole number such as 1 or 2 (Pulumi\'s integer type has no '
        'fractions).']


def test_a_verl_path_given_to_set_is_answered_with_what_set_takes(capsys: pytest.CaptureFixture[str], tmp_path: Path):
    assert synth.main(["a4-standard", "--out", str(tmp_path / "out"),
                       "--set", "verl-gke:verl.trainer.total_epochs=3"]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        "synth failed: --set verl-gke:verl.trainer.total_epochs=3: --set takes whole keys, not verl paths: "
        "--set 'verl-gke:verl={\"trainer\": {\"total_epochs\": 3}}' (it replaces the stack file's verl-gke:verl "
        "for this synth), or `pulumi config set --path verl-gke:verl.trainer.total_epochs 3` "
        "(see synth --help)\n")
