"""The synth output format users and CI rely on, read back from disk."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pulumi
import pytest
import yaml

from tests.conftest import STACKS, synth_cli
from verl_gke import synth

RESOURCE_KEYS = {"urn", "type", "name", "parent", "custom", "provider", "dependencies", "inputs"}


@pytest.mark.parametrize("stack", STACKS)
def test_dist_layout_reads_back(stack: str, synth_stack, tmp_path: Path):
    result = synth_stack(stack)
    synth.write(result, tmp_path)
    resources = json.loads((tmp_path / "resources.json").read_text())
    assert [r["urn"] for r in resources] == [r.urn for r in result.registrations]
    urns = {r["urn"] for r in resources}
    for r in resources:
        assert set(r) == RESOURCE_KEYS
        assert r["urn"].startswith(f"urn:pulumi:{stack}::verl-gke::")
        assert r["parent"] is None or r["parent"].startswith("urn:pulumi:")
        assert set(r["dependencies"]) <= urns | {r["parent"]}
    outputs = json.loads((tmp_path / "outputs.json").read_text())
    assert outputs == result.outputs
    files = sorted((tmp_path / "manifests").iterdir())
    assert len(files) == len(result.manifests())
    for i, (path, obj) in enumerate(zip(files, result.manifests()), start=1):
        assert re.fullmatch(rf"{i:02d}-[a-z0-9]+-[a-z0-9.-]+\.yaml", path.name), path.name
        assert yaml.safe_load(path.read_text()) == obj


@pytest.mark.parametrize("stack", STACKS)
def test_outputs_name_the_platform(stack: str, synth_stack):
    outputs = synth_stack(stack).outputs
    expected = {"a4": ("a4", 8), "a4-standard": ("a4", 8), "a3u-standard": ("a3u", 8), "a4x": ("a4x", 4),
                "smoke": ("g2", 1)}[stack]
    assert (outputs["gpuPlatform"], outputs["gpusPerNode"]) == expected


def test_placeholders_are_listed_in_the_summary(synth_stack):
    result = synth_stack("a4-standard")
    text = synth.summary(result, Path("dist/a4-standard"))
    assert text.endswith("Set these before `pulumi up` (they still hold placeholders):\n"
                         "  gcp:project\n  verl-gke:reservation")


def test_wire_values_mask_secrets_and_unknowns():
    sig = {pulumi.runtime.rpc._special_sig_key: pulumi.runtime.rpc._special_secret_sig}
    secret, secret_map = {**sig, "value": "hf_abc"}, {**sig, "value": {"token": "hf_abc", "n": [1]}}
    assert synth.wire_to_json({"a": [secret], "b": pulumi.runtime.rpc.UNKNOWN, "c": 1, "d": secret_map}) == {
        "a": ["[secret]"], "b": "[unknown]", "c": 1, "d": {"token": "[secret]", "n": ["[secret]"]}}


def test_bad_config_registers_nothing():
    monitor = synth.RecordingMonitor(synth.SynthMocks())
    with pytest.raises(pulumi.RunError, match="verl-gke:clusterMode"):
        synth.run("a4x", overrides={"verl-gke:clusterMode": "autopilot"}, monitor=monitor)
    assert monitor.registrations == []


def test_cli_rejects_bad_config_without_traceback(tmp_path: Path):
    out = tmp_path / "a4x"
    run = synth_cli("a4x", "--out", str(out), "--set", "verl-gke:clusterMode=autopilot",
                     "--set", 'verl-gke:verl={"data": {"train_batch_size": 255}}')
    assert run.returncode != 0
    assert "Traceback" not in run.stderr + run.stdout
    assert run.stderr.split("\n", 1)[1].startswith("synth failed: Pulumi.a4x.yaml has 3 problems:\n")
    assert '  verl-gke:rayOperator = "helm": Autopilot clusters use' in run.stderr
    assert '  verl-gke:clusterMode = "autopilot": A4X' in run.stderr
    assert "  verl-gke:verl.data.train_batch_size = 255: data.train_batch_size x actor_rollout_ref.rollout.n (2040)" in run.stderr
    assert not out.exists()


def test_cli_writes_dist_and_summary(tmp_path: Path):
    run = synth_cli("a4", "--out", str(tmp_path / "a4"))
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("verl-gke synth: stack a4: ")
    assert len(run.stdout.splitlines()) <= SCREEN
    assert (tmp_path / "a4" / "resources.json").exists()


SCREEN = 40
"""Lines synth's default output may take: one terminal screen."""
_DETAILS = ("  critical path: ", "  assumptions (domain/run_time.py): ", "  checkpoint time: ",
            "    data.train_batch_size=", "    1  gcp:container/cluster:Cluster")


@pytest.mark.parametrize("stack", STACKS)
def test_the_default_output_fits_one_screen_and_says_what_a_deployer_needs(stack: str, synth_stack):
    lines = synth.summary(synth_stack(stack), Path("dist") / stack).splitlines()
    assert len(lines) <= SCREEN, "\n".join(lines)
    # The smoke stack sizes its run for two L4s in its stack file.
    settings = "verl settings: 38, 9 of them" if stack == "smoke" else "verl settings: 37, 0 of them"
    starts = ("`pulumi up` would create ", "GRPO run with verl ", "Modeled run: step ~", settings,
              "price per hour, GPU nodes on ", "run estimate: ", "GPU memory estimate per GPU: ",
              "Time to first training step (modeled): ", "From `pulumi up` to released GPUs (modeled): ",
              "Images (every one pulled by digest", "Live checks not made", "Set these before `pulumi up`")
    assert [s for s in starts if not any(line.startswith(s) for line in lines)] == []
    assert [line for line in lines if line.startswith(_DETAILS)] == []


def test_verbose_adds_the_types_every_setting_the_critical_path_and_the_assumptions(synth_stack):
    brief = synth.summary(synth_stack("a4-standard"), Path("dist/a4-standard")).splitlines()
    full = synth.summary(synth_stack("a4-standard"), Path("dist/a4-standard"), verbose=True).splitlines()
    assert [d for d in _DETAILS if not any(line.startswith(d) for line in full)] == []
    assert len([line for line in full if line.startswith("    ") and "=" in line]) == 37
    assert set(brief) - set(full) == {
        brief[1], "verl settings: 37, 0 of them set in verl-gke:verl (the platform's defaults; --verbose lists them)",
        "(--verbose: every resource type, every verl setting, the critical path, the models' assumptions)"}
    assert brief[1] == ("`pulumi up` would create 110 resources: 1 GKE cluster, 2 node pools, 3 VPCs, 1 bucket, "
                        "1 RayCluster, 1 GRPO job, 45 Kubernetes objects in all; 29 stack outputs")


def test_the_default_output_lists_the_verl_settings_the_user_set():
    result = synth.run("a4-standard", overrides={"verl-gke:verl": '{"trainer": {"total_epochs": 3}}'})
    lines = synth.summary(result, Path("dist")).splitlines()
    at = lines.index("verl settings: 37, 1 of them set in verl-gke:verl:")
    assert lines[at + 1] == "  * trainer.total_epochs=3"
    assert not lines[at + 2].startswith("  ")


def test_the_cli_takes_verbose(tmp_path: Path, capsys: pytest.CaptureFixture[str], synth_stack, monkeypatch):
    result = synth_stack("a4x")  # before synth.run is replaced: the fixture's first call runs it (a deadlock after)
    monkeypatch.setattr(synth, "run", lambda stack, **_: result)
    assert synth.main(["a4x", "--out", str(tmp_path / "a"), "--verbose"]) == 0
    assert "  critical path: " in capsys.readouterr().out
    assert synth.main(["a4x", "--out", str(tmp_path / "b")]) == 0
    assert "  critical path: " not in capsys.readouterr().out


def test_unknown_stack_lists_the_stacks():
    run = synth_cli("a5")
    assert run.returncode != 0
    assert "no stack file Pulumi.a5.yaml; stacks: a3u-standard, a4, a4-standard, a4x, smoke" in run.stderr


def test_a_real_run_stops_at_once_on_placeholders():
    from components.stack_config import from_pulumi

    raw, secret_keys = synth.raw_config("a4-standard")
    monitor = synth.RecordingMonitor(synth.SynthMocks())
    with pytest.raises(pulumi.RunError) as caught:
        synth.run_in_mocks(lambda: from_pulumi(allow_placeholders=False), stack="a4-standard",
                           config=raw, secret_keys=secret_keys, monitor=monitor)
    assert str(caught.value) == ("Pulumi.a4-standard.yaml still has placeholders; set them before `pulumi up`:\n"
                                 "  gcp:project\n  verl-gke:reservation")
    assert monitor.registrations == []


def _real_run(stack: str, raw: dict, preview: bool, log: list[str]) -> list:
    from components.stack_config import from_pulumi

    monitor = synth.RecordingMonitor(synth.SynthMocks())
    synth.run_in_mocks(lambda: from_pulumi(allow_placeholders=False), stack=stack, config=raw, preview=preview,
                       monitor=monitor, log=log)
    return monitor.registrations


def test_preview_and_up_need_no_token_in_config():
    raw = {**synth.raw_config("a4-standard")[0], "gcp:project": "my-project-123", "verl-gke:reservation": "r"}
    for preview in (True, False):
        log: list[str] = []
        _real_run("a4-standard", raw, preview=preview, log=log)  # raises on any problem
        assert log and not [line for line in log if "hfToken" in line]
    # Placeholders stop a preview.
    with pytest.raises(pulumi.RunError):
        _real_run("a4-standard", {**raw, "verl-gke:reservation": "replace-me"}, preview=True, log=[])


def test_registration_order_is_the_same_on_every_run(synth_stack):
    first = [r.urn for r in synth_stack("a4x").registrations]
    assert [r.urn for r in synth.run("a4x").registrations] == first


def test_manifests_start_with_api_version_kind_metadata(synth_stack):
    for obj in synth_stack("a4").manifests():
        assert list(obj)[:3] == ["apiVersion", "kind", "metadata"]


def test_the_cluster_ca_is_public_though_master_auth_is_secret(synth_stack):
    """pulumi-gcp returns masterAuth with secret leaves (the stand-in too); the CA must stay public:
    every command that port-forwards reads it from `pulumi stack output --json`."""
    for stack in STACKS:
        result = synth_stack(stack)
        assert result.outputs["clusterCaCertificate"] == synth.MOCK_CA, stack
        job = next(r for r in result.registrations if r.type == synth.GRPO_JOB_TYPE)
        assert job.inputs["cluster_ca_certificate"] == synth.MOCK_CA, stack
        assert result.outputs["kubeconfig"] == "[secret]"


def test_every_stack_reaches_its_control_plane_on_the_dns_endpoint_and_closes_the_ip_one(synth_stack):
    for stack in STACKS:
        result = synth_stack(stack)
        cluster = next(r for r in result.registrations if r.type == "gcp:container/cluster:Cluster")
        assert cluster.inputs["controlPlaneEndpointsConfig"] == {"dnsEndpointConfig": {"allowExternalTraffic": True}}
        assert cluster.inputs["masterAuthorizedNetworksConfig"] == {"cidrBlocks": [],
                                                                    "gcpPublicCidrsAccessEnabled": False}, stack
        assert result.outputs["clusterEndpoint"] == synth.MOCK_DNS_ENDPOINT, stack
        job = next(r for r in result.registrations if r.type == synth.GRPO_JOB_TYPE)
        assert job.inputs["cluster_endpoint"] == synth.MOCK_DNS_ENDPOINT, stack


def test_control_plane_endpoint_ip_keeps_the_earlier_cluster():
    result = synth.run("a4-standard", overrides={"verl-gke:controlPlaneEndpoint": "ip"})
    cluster = next(r for r in result.registrations if r.type == "gcp:container/cluster:Cluster")
    assert "controlPlaneEndpointsConfig" not in cluster.inputs
    assert "masterAuthorizedNetworksConfig" not in cluster.inputs
    assert result.outputs["clusterEndpoint"] == synth.MOCK_ENDPOINT


def test_the_stand_in_marks_master_auth_secret_as_the_provider_does():
    def program() -> None:
        import pulumi_gcp as gcp

        cluster = gcp.container.Cluster("c", name="c", location="us-central1", project="p")
        pulumi.export("auth", cluster.master_auth)
        pulumi.export("ca", cluster.master_auth.apply(lambda a: a.cluster_ca_certificate))
        pulumi.export("public", pulumi.Output.unsecret(cluster.master_auth.apply(lambda a: a.cluster_ca_certificate)))

    _, outputs = synth.run_in_mocks(program)
    assert outputs == {"auth": "[secret]", "ca": "[secret]", "public": synth.MOCK_CA}


@pytest.mark.parametrize("stack", STACKS)
def test_a_first_preview_leaves_every_computed_output_unknown(stack: str):
    result = synth.run(stack, preview=True)
    assert any(r.type == synth.GRPO_JOB_TYPE for r in result.registrations)
    for key in ("clusterEndpoint", "clusterCaCertificate", "grpoSubmissionId", "grpoJobStatus", "bucketUrl"):
        assert result.outputs[key] == "[unknown]", key
    assert result.outputs["gpuPlatform"] == {"a4": "a4", "a4-standard": "a4", "a3u-standard": "a3u", "a4x": "a4x",
                                            "smoke": "g2"}[stack]


def test_the_job_provider_gets_numbers_as_floats():
    assert synth.engine_numbers({"a": 1, "b": [2, True], "c": "3"}) == {"a": 1.0, "b": [2.0, True], "c": "3"}


def test_an_existing_clusters_ca_is_public_too():
    result = synth.run("a4-standard", overrides={"verl-gke:existingCluster": "true"})
    assert result.outputs["clusterCaCertificate"] == synth.MOCK_CA


def test_synth_says_what_it_is_doing_while_it_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "a4"
    assert synth.main(["a4", "--out", str(out)]) == 0
    written = len(json.loads((out / ".verl-gke-synth.json").read_text())["files"])
    assert capsys.readouterr().err.splitlines() == [
        "synth: a4: reading Pulumi.a4.yaml and running the program under Pulumi's mock engine (offline: no cloud "
        "call, no credential)",
        f"synth: a4: writing {written} files to {out}",
    ]


def test_measured_rates_replace_the_models_and_synth_says_on_which_run(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from domain import measured

    path = tmp_path / "smoke.json"
    path.write_text(json.dumps({"run": "run-0123456789ab", "stack": "smoke", "measuredAt": "2026-12-07T12:00:00Z",
                                "rates": {"verlStartupSeconds": 300.0, "stepSeconds": 30.0,
                                          "localSaveGBpsPerRank": 1.0}}))
    monkeypatch.setattr(measured, "path_of", lambda project_dir, stack: path)
    result = synth.run("smoke")
    lines = result.log + result.modeled
    [run] = [line for line in lines if line.startswith("Modeled run: ")]
    assert run.startswith("Modeled run: step ~30 s (measured on run run-0123456789ab) (modeled 17: ")
    assert "; 6 steps, 2 validation passes (12 s each) and checkpoints (6 s) ~4 min, " in run  # 186 + 25 + 6 s
    [first] = [line for line in lines if line.startswith("Time to first training step (modeled): ")]
    assert first.endswith("then verl start-up 5.0 min (measured on run run-0123456789ab) (modeled 3.0)")
    [saves] = [line for line in lines if line.startswith("  checkpoint time: ")]
    assert saves.endswith("1 GB/s per rank into the page cache (measured on run run-0123456789ab), assumed 2 GB/s "
                          "per node to the bucket")
    # The exported model stays the model's own step (what a measured step is held against); the run uses the measured.
    from domain.config import load_config
    from domain.stack_files import raw_config
    from domain.verl_config import verl_run_check

    _, plan = verl_run_check(load_config(raw_config("smoke")[0]), measured.load(Path("."), "smoke"))
    assert result.outputs["modeledStepSeconds"] == round(plan.time.modeled_step_s, 1) == 17.2
    # 5.93 GB over 2 nodes: each save 2.96 GB at 1 GB/s measured, the last model (a third) at 2 GB/s assumed.
    assert plan.checkpoint_time.total_s == pytest.approx(2 * 2.964 + 2.964 / 3 / 2, abs=0.01)
    assert result.outputs["modeledRunSeconds"] == round(6 * 30.0 + 2 * plan.time.validation_s
                                                        + plan.checkpoint_time.total_s, 1)
