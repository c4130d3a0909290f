"""Preview-time checks of the live project: each check's good and bad provider answers, given to the
real program through synth's `--cloud` answers (the same invokes `pulumi preview` makes through the
gcp provider), and the version pick on its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from domain import gke_versions
from domain.image_mirror import MIRROR_APIS
from domain.preflight import (
    CLUSTER,
    ENGINE_VERSIONS,
    MACHINE_TYPES,
    PROJECT_SERVICE,
    REQUIRED_APIS,
    RESERVATION,
)
from tests.conftest import synth_cli
from verl_gke import synth

STACK = "a4-standard"
REAL = {"gcp:project": "my-project-123", "verl-gke:reservation": "my-reservation"}
VERSIONS = {
    "releaseChannelDefaultVersion": {"RAPID": "1.34.1-gke.1829001", "REGULAR": "1.34.1-gke.1829001",
                                     "STABLE": "1.33.5-gke.1201000"},
    "releaseChannelLatestVersion": {"RAPID": "1.35.0-gke.1500000", "REGULAR": "1.35.0-gke.1500000",
                                    "STABLE": "1.34.0-gke.1000000"},
    "validMasterVersions": ["1.35.0-gke.1500000", "1.34.1-gke.1829001", "1.34.0-gke.1000000",
                            "1.33.5-gke.1201000"],
}


def reservation(**specific: Any) -> dict[str, Any]:
    base = {"count": 4, "inUseCount": 0,
            "instanceProperties": [{"machineType": "a4-highgpu-8g", "guestAccelerators": []}]}
    return {"name": "my-reservation", "zone": "projects/my-project-123/zones/us-central1-b", "status": "READY",
            "specificReservations": [{**base, **specific}]}


MACHINE = {"machineTypes": [{"name": "a4-highgpu-8g", "guestCpus": 224, "memoryMb": 3784704,
                             "bundledLocalSsds": [{"partitionCount": 32, "defaultInterface": "NVME"}]}]}
# A first deploy: the stack's cluster does not exist yet.
NO_CLUSTER = {"error": "googleapi: Error 404: Not found: projects/my-project-123/locations/us-central1/clusters/verl-a4"}
GOOD = {ENGINE_VERSIONS: VERSIONS, MACHINE_TYPES: MACHINE, RESERVATION: reservation(), CLUSTER: NO_CLUSTER}


def synth_with(cloud: dict[str, Any], stack: str = STACK, **config: str) -> synth.SynthResult:
    return synth.run(stack, overrides={**REAL, **config}, cloud=cloud)


def problems_of(cloud: dict[str, Any], stack: str = STACK, **config: str) -> str:
    import pulumi

    with pytest.raises(pulumi.RunError) as caught:
        synth_with(cloud, stack, **config)
    return str(caught.value)


def cluster_version(result: synth.SynthResult) -> str:
    (cluster,) = [r for r in result.registrations if r.type == "gcp:container/cluster:Cluster"]
    return cluster.inputs["minMasterVersion"]


@pytest.fixture(scope="module")
def good() -> tuple[synth.SynthResult, Any]:
    """synth_with(GOOD), once for the tests that read it, with each register request's options kept."""
    from tests.mock_run import OptionsMonitor

    monitor = OptionsMonitor(synth.SynthMocks(GOOD))
    return synth.run(STACK, overrides=REAL, monitor=monitor), monitor


def test_matching_answers_pass_and_the_cluster_gets_the_channels_default(good):
    result, _ = good
    assert result.unchecked == []
    assert cluster_version(result) == "1.34.1-gke.1829001"
    assert "preflight: reservation my-reservation: 4 of 4 a4-highgpu-8g free" in result.log


def test_offline_without_answers_lists_every_check_it_could_not_make(synth_stack):
    result = synth_stack(STACK)
    assert result.unchecked == [ENGINE_VERSIONS, MACHINE_TYPES, CLUSTER, RESERVATION]
    summary = synth.summary(result, Path("dist"))
    assert "Live checks not made (no --cloud answer; `pulumi preview` makes them):" in summary
    assert "gcp:compute/getReservation:getReservation" in summary


@pytest.mark.parametrize("stack", ["a4", "a4-standard"])
def test_offline_synth_shows_no_answer_the_stand_in_invented(stack: str, synth_stack):
    """Offline, the healthy stand-in answers only so that the program runs: no figure of it is printed,
    exported as a check or used as an input (the stand-in's channel version, free machines, quota)."""
    result = synth_stack(stack)
    assert [line for line in result.log if line.startswith("preflight:")] == []
    assert result.outputs["preflightChecks"] == []
    (cluster,) = [r for r in result.registrations if r.type == "gcp:container/cluster:Cluster"]
    assert "minMasterVersion" not in cluster.inputs  # the stand-in's version would be invented
    text = synth.summary(result, Path("dist"))
    for invented in ("of 10 a4-highgpu-8g free", "GPU quota in us-central1", "1.34.1-gke.1829001"):
        assert invented not in text, invented


def test_preflight_checks_hold_what_was_checked_and_stay_the_same_when_only_figures_move(good):
    """The output is part of every `pulumi up`'s diff: the figures that move between runs (machines in
    use, the channel's default) go to the log, the output names the checks that passed."""
    first, _ = good
    later = synth_with({**GOOD, RESERVATION: reservation(inUseCount=1),
                        ENGINE_VERSIONS: {**VERSIONS, "releaseChannelDefaultVersion": {"REGULAR": "1.35.0-gke.1500000"}}})
    assert first.outputs["preflightChecks"] == later.outputs["preflightChecks"] == [
        "GKE version: the REGULAR channel offers one that every feature's floor allows",
        "machine type: us-central1-b offers a4-highgpu-8g at the size the worker requests assume",
        "reservation my-reservation: in us-central1-b, READY, a4-highgpu-8g, at least 2 machines free",
    ]
    assert "preflight: reservation my-reservation: 4 of 4 a4-highgpu-8g free" in first.log
    assert "preflight: reservation my-reservation: 3 of 4 a4-highgpu-8g free" in later.log


# --- reservation ------------------------------------------------------------------------------

def test_reservation_for_another_machine_type():
    bad = reservation(instanceProperties=[{"machineType": "a3-ultragpu-8g"}])
    assert ('verl-gke:reservation = "my-reservation": reserves a3-ultragpu-8g machines; A4 (8x NVIDIA B200) '
            'needs a4-highgpu-8g.') in problems_of({**GOOD, RESERVATION: bad})


def test_reservation_in_another_zone():
    bad = {**reservation(), "zone": "us-central1-c"}
    assert ('verl-gke:reservation = "my-reservation": is in zone us-central1-c; the GPU nodes are in gcp:zone '
            'us-central1-b.') in problems_of({**GOOD, RESERVATION: bad})


def test_reservation_with_too_few_free_machines_names_gpu_nodes():
    text = problems_of({**GOOD, RESERVATION: reservation(count=4, inUseCount=3)})
    assert ('verl-gke:gpuNodes = 2: reservation my-reservation has 1 of its 4 machines free; lower gpuNodes or '
            'free machines.') in text


def test_the_stacks_own_gpu_nodes_count_as_free_on_a_later_up():
    # The pool of an earlier `pulumi up` holds 2 of the 2 reserved machines: not a shortage.
    ours = {"name": "verl-a4", "nodePools": [{"name": "verl-cpu", "nodeCount": 1}, {"name": "gpu-pool", "nodeCount": 2}]}
    result = synth_with({**GOOD, RESERVATION: reservation(count=2, inUseCount=2), CLUSTER: ours})
    assert "preflight: reservation my-reservation: 2 of 2 a4-highgpu-8g free (2 of them this stack's GPU nodes)" in result.log
    # Only our own nodes count as free: another user's machine in use does not.
    text = problems_of({**GOOD, RESERVATION: reservation(count=3, inUseCount=3),
                        CLUSTER: {**ours, "nodePools": [{"name": "gpu-pool", "nodeCount": 1}]}})
    assert ("verl-gke:gpuNodes = 2: reservation my-reservation has 1 of its 3 machines free (counting this "
            "stack's 1 GPU nodes as free); lower gpuNodes or free machines.") in text


def test_reservation_with_other_accelerators():
    bad = reservation(instanceProperties=[{"machineType": "a4-highgpu-8g",
                                           "guestAccelerators": [{"acceleratorType": "nvidia-h200-141gb",
                                                                  "acceleratorCount": 8}]}])
    assert "reserves 8 x nvidia-h200-141gb per machine; A4 (8x NVIDIA B200) needs 8 x nvidia-b200." in problems_of(
        {**GOOD, RESERVATION: bad})


def test_missing_reservation_is_the_providers_error_under_the_key():
    text = problems_of({**GOOD, RESERVATION: {"error": "googleapi: Error 404: The resource 'my-reservation' was not found"}})
    assert ('  verl-gke:reservation = "my-reservation": reservation my-reservation in project my-project-123, zone '
            "us-central1-b: the provider said: googleapi: Error 404: The resource 'my-reservation' was not found\n"
            in text + "\n")
    assert 'verl-gke:reservation = "my-reservation": no such reservation in zone us-central1-b.' in problems_of(
        {**GOOD, RESERVATION: {}})


def test_a_shared_reservation_is_looked_up_in_its_owners_project():
    # Answers for two projects: only the owner's has free machines.
    answers = {**GOOD, RESERVATION: [{**reservation(inUseCount=4), "project": "my-project-123"},
                                     {**reservation(), "project": "owner-project"}]}
    synth_with(answers, **{"verl-gke:reservation": "projects/owner-project/reservations/my-reservation"})
    assert "has 0 of its 4 machines free" in problems_of(answers)


def test_spot_and_autopilot_stacks_check_no_reservation(synth_stack):
    assert RESERVATION in synth_stack(STACK).unchecked
    assert RESERVATION not in synth.run(STACK, overrides={"verl-gke:gpuSpot": "true", "verl-gke:reservation": ""}).unchecked
    assert RESERVATION not in synth_stack("a4").unchecked


# --- GKE version ------------------------------------------------------------------------------

A4X = {MACHINE_TYPES: {"machineTypes": [{"name": "a4x-highgpu-4g", "guestCpus": 140, "memoryMb": 843055}]},
       RESERVATION: {**reservation(instanceProperties=[{"machineType": "a4x-highgpu-4g"}], count=18),
                     "zone": "us-central1-a"},
       ENGINE_VERSIONS: VERSIONS}


def test_a4x_dranet_takes_the_lowest_version_above_its_floor():
    versions = {**VERSIONS, "releaseChannelDefaultVersion": {"RAPID": "1.34.0-gke.1000000"}}
    assert cluster_version(synth_with({**A4X, ENGINE_VERSIONS: versions}, "a4x")) == "1.34.1-gke.1829001"


def test_a_channel_without_a_fitting_version_names_the_key_and_the_floor():
    text = problems_of(A4X, "a4x", **{"verl-gke:releaseChannel": "STABLE"})
    assert ('verl-gke:kubernetesVersion = "": the STABLE channel in us-central1 offers 1.33.5-gke.1201000 (default) '
            'to 1.34.0-gke.1000000 (latest), nothing that matches any version; A4X (4x NVIDIA GB200, arm64) '
            '(DRA resource.k8s.io/v1) needs 1.34 or newer; DRANET needs 1.34.1-gke.1829001 or newer.') in text


def test_a_requested_minor_is_taken_from_the_channel():
    assert cluster_version(synth_with(GOOD, **{"verl-gke:kubernetesVersion": "1.35"})) == "1.35.0-gke.1500000"
    assert "nothing that matches 1.36" in problems_of(GOOD, **{"verl-gke:kubernetesVersion": "1.36"})


@pytest.mark.parametrize(("wanted", "floors", "expected"), [
    ("", [], "1.34.1-gke.1829001"),                                   # the channel's default
    ("", [("f", "1.35")], "1.35.0-gke.1500000"),                       # lowest above the default
    ("1.33", [], None),                                                # below the default: maybe not in the channel
    ("1.35.0-gke.1500000", [], "1.35.0-gke.1500000"),                  # exact
    ("1.34.0-gke.1000000", [], None),                                  # exact, below the default
    ("1.36", [], None),
    ("", [("f", "1.36")], None),
])
def test_version_pick(wanted: str, floors: list[tuple[str, str]], expected: str | None):
    assert gke_versions.choose(wanted, "REGULAR", floors, VERSIONS) == expected


def test_the_pick_never_upgrades_a_running_cluster(good):
    _, monitor = good
    assert monitor.sent["gke-cluster"].ignore_changes == ["minMasterVersion"]


# --- machine type -----------------------------------------------------------------------------

def test_a_zone_without_the_machine_type():
    assert 'gcp:zone = "us-central1-b": offers no a4-highgpu-8g machines (A4 (8x NVIDIA B200)).' in problems_of(
        {**GOOD, MACHINE_TYPES: {"machineTypes": []}})


def test_a_smaller_machine_than_the_table_names_the_worker_keys():
    small = {"machineTypes": [{"name": "a4-highgpu-8g", "guestCpus": 208, "memoryMb": 3000000}]}
    text = problems_of({**GOOD, MACHINE_TYPES: small})
    # 208 vCPUs keep 207.2 allocatable; 3,145 GB keep 2,863Gi (GKE's reserved shares); 1 and 1Gi go to the
    # checkpoint copier.
    assert "verl-gke:workerCpus = 219: a4-highgpu-8g in us-central1-b has 208 vCPUs; at most 206 fit a worker." in text
    assert ("verl-gke:workerMemoryGi = 3432: a4-highgpu-8g in us-central1-b has 3145 GB; at most 2862Gi fit a "
            "worker.") in text


def test_local_ssd_count_is_the_machines():
    other = {"machineTypes": [{**MACHINE["machineTypes"][0], "bundledLocalSsds": [{"partitionCount": 16}]}]}
    assert ('verl-gke:platform = "a4": a4-highgpu-8g bundles 16 Local SSDs in us-central1-b; the platform table '
            'sets 32 for ephemeral storage.') in problems_of({**GOOD, MACHINE_TYPES: other})


# --- APIs -------------------------------------------------------------------------------------

def test_apis_are_enabled_by_the_stack_and_never_disabled(synth_stack):
    result = synth_stack(STACK)
    services = [r for r in result.registrations if r.type == "gcp:projects/service:Service"]
    # With the image mirror (on by default): Artifact Registry and image streaming's API too.
    assert sorted(r.inputs["service"] for r in services) == sorted((*REQUIRED_APIS, *MIRROR_APIS))
    assert all(r.inputs["disableOnDestroy"] is False for r in services)
    (cluster,) = [r for r in result.registrations if r.type == "gcp:container/cluster:Cluster"]
    assert {r.urn for r in services} <= set(cluster.dependencies)


def test_an_api_still_off_defers_a_check_while_the_update_enables_it():
    off = {"error": "googleapi: Error 403: Compute Engine API has not been used in project 1 before or it is disabled"}
    result = synth_with({**GOOD, MACHINE_TYPES: off})
    assert any("not checked yet (machine type a4-highgpu-8g): an API is still off" in line for line in result.log)


def test_without_enable_apis_each_api_must_be_on():
    enabled = [{"service": s, "id": f"my-project-123/{s}"} for s in (*REQUIRED_APIS, *MIRROR_APIS)
               if s != "container.googleapis.com"]
    answers = {**GOOD, PROJECT_SERVICE: [*enabled, {"service": "container.googleapis.com", "id": ""}]}
    text = problems_of(answers, **{"verl-gke:enableApis": "false"})
    assert ("verl-gke:enableApis = false: container.googleapis.com is not enabled; enable it (gcloud services "
            "enable container.googleapis.com) or set enableApis to true.") in text
    assert text.count("is not enabled") == 1
    result = synth_with({**GOOD, PROJECT_SERVICE: enabled + [{"service": "container.googleapis.com",
                                                               "id": "p/container"}]},
                        **{"verl-gke:enableApis": "false"})
    assert not [r for r in result.registrations if r.type == "gcp:projects/service:Service"]
    # The image mirror's APIs are needed (and checked) only with the mirror.
    without_mirror = [a for a in enabled if a["service"] not in MIRROR_APIS]
    synth_with({**GOOD, PROJECT_SERVICE: [*without_mirror, {"service": "container.googleapis.com", "id": "p/c"}]},
               **{"verl-gke:enableApis": "false", "verl-gke:imageMirror": "false"})


def test_problems_of_every_check_come_together():
    text = problems_of({ENGINE_VERSIONS: VERSIONS, MACHINE_TYPES: {"machineTypes": []},
                        RESERVATION: reservation(inUseCount=4)})
    assert text.startswith("Pulumi.a4-standard.yaml, checked against project my-project-123, has 2 problems:")


# --- the command line -------------------------------------------------------------------------

def test_synth_cloud_file_that_disagrees_exits_2_naming_the_key(tmp_path: Path):
    answers = tmp_path / "cloud.json"
    answers.write_text(json.dumps({**GOOD, RESERVATION: reservation(inUseCount=4)}))
    run = synth_cli(STACK, "--out", str(tmp_path / "out"), "--cloud", str(answers),
               "--set", "gcp:project=my-project-123", "--set", "verl-gke:reservation=my-reservation")
    assert run.returncode == 2
    assert "verl-gke:gpuNodes = 2: reservation my-reservation has 0 of its 4 machines free" in run.stderr
    assert "Traceback" not in run.stderr


def test_synth_cloud_file_that_matches_passes_with_no_check_left(tmp_path: Path):
    answers = tmp_path / "cloud.json"
    answers.write_text(json.dumps(GOOD))
    run = synth_cli(STACK, "--out", str(tmp_path / "out"), "--cloud", str(answers),
               "--set", "gcp:project=my-project-123", "--set", "verl-gke:reservation=my-reservation")
    assert run.returncode == 0, run.stderr
    assert "Live checks not made" not in run.stdout


def test_synth_cloud_file_with_an_unknown_token_is_refused(tmp_path: Path):
    answers = tmp_path / "cloud.json"
    answers.write_text(json.dumps({"gcp:compute/getNetwork:getNetwork": {}}))
    run = synth_cli(STACK, "--out", str(tmp_path / "out"), "--cloud", str(answers))
    assert run.returncode == 2
    assert "no live check makes gcp:compute/getNetwork:getNetwork" in run.stderr


# --- a new project's first `up` -----------------------------------------------------------------

def test_a_first_up_on_a_new_project_creates_the_cluster_at_the_stacks_floor():
    """Every invoke answers SERVICE_DISABLED until this update enables the APIs: the checks become
    notes, and the cluster is still never created below A4X's DRA and DRANET floors."""
    from domain.platforms import DRANET_MIN_GKE
    from domain.preflight import new_project_answers

    result = synth.run("a4x", overrides={**REAL}, cloud=new_project_answers("my-project-123"))
    assert cluster_version(result) == DRANET_MIN_GKE
    assert (f"preflight: GKE versions not checked yet (an API is still off): the cluster is created at "
            f"{DRANET_MIN_GKE}, the highest floor of this stack") in result.log
    assert any("not checked yet (reservation my-reservation in project my-project-123, zone us-central1-a)" in line
               for line in result.log)
    # Without floors the channel's default stands; a configured version wins over the floor.
    plain = synth.run(STACK, overrides={**REAL}, cloud=new_project_answers("my-project-123"))
    assert "minMasterVersion" not in [r for r in plain.registrations if r.type == "gcp:container/cluster:Cluster"][0].inputs
    pinned = synth.run("a4x", overrides={**REAL, "verl-gke:kubernetesVersion": "1.35"},
                       cloud=new_project_answers("my-project-123"))
    assert cluster_version(pinned) == "1.35"


def test_a_new_project_without_enable_apis_is_one_problem_per_check():
    from domain.preflight import new_project_answers

    text = problems_of(new_project_answers("my-project-123"), **{"verl-gke:enableApis": "false"})
    assert "SERVICE_DISABLED" in text and "Traceback" not in text


# --- existingCluster on a stack that created its cluster -----------------------------------------

HARDENED_POOL = {"name": "cpu-pool", "nodeConfigs": [{"workloadMetadataConfigs": [{"mode": "GKE_METADATA"}]}]}
HARDENED = {"datapathProvider": "ADVANCED_DATAPATH", "workloadIdentityConfigs": [{"workloadPool": "my-project-123.svc.id.goog"}],
            "nodePools": [HARDENED_POOL]}


def test_existing_cluster_on_the_stacks_own_cluster_is_refused():
    own = {CLUSTER: {"name": "verl-a4", "location": "us-central1", "endpoint": "10.0.0.2",
                     "masterAuths": [{"clusterCaCertificate": synth.MOCK_CA}],
                     "resourceLabels": {"verl-gke-stack": STACK}, **HARDENED}}
    text = problems_of(own, **{"verl-gke:existingCluster": "true"})
    assert ("verl-gke:existingCluster = true: cluster verl-a4 was created by this stack, and `pulumi up` with "
            "existingCluster would delete it;") in text
    other = {CLUSTER: {**own[CLUSTER], "resourceLabels": {"verl-gke-stack": "a4x"}}}
    assert synth_with(other, **{"verl-gke:existingCluster": "true"}).outputs["clusterName"] == "verl-a4"


def test_an_existing_cluster_without_policy_enforcement_workload_identity_or_the_metadata_server_is_refused():
    """Why 4: the lookup read only the endpoint and CA, so such a cluster made every NetworkPolicy
    inert and let Ray pods read the node's token. Each gap is one line with the command that closes it."""
    base = {"name": "verl-a4", "location": "us-central1", "endpoint": "10.0.0.2",
            "masterAuths": [{"clusterCaCertificate": synth.MOCK_CA}]}
    legacy_pool = {"name": "gpu", "nodeConfigs": [{"workloadMetadataConfigs": [{"mode": "GCE_METADATA"}]}]}
    bare_pool = {"name": "old", "nodeConfigs": [{}]}
    cloud = {CLUSTER: {**base, "datapathProvider": "LEGACY_DATAPATH", "networkPolicies": [{"enabled": False}],
                       "workloadIdentityConfigs": [], "nodePools": [HARDENED_POOL, legacy_pool, bare_pool]}}
    lines = [line.strip() for line in problems_of(cloud, **{"verl-gke:existingCluster": "true"}).splitlines()
             if "verl-gke:existingCluster" in line]
    where = "--location us-central1 --project my-project-123"
    assert lines == [
        "verl-gke:existingCluster = true: cluster verl-a4 enforces no NetworkPolicy (neither Dataplane V2 nor "
        "Calico), so the stack's default-deny policies would be inert: `gcloud container clusters update verl-a4 "
        f"{where} --update-addons=NetworkPolicy=ENABLED`, then `gcloud container clusters update verl-a4 {where} "
        "--enable-network-policy` (Dataplane V2 is chosen only at a cluster's creation).",
        "verl-gke:existingCluster = true: cluster verl-a4 has no Workload Identity, so the stack's grants reach no "
        "pod and pods act as the node's service account: `gcloud container clusters update verl-a4 "
        f"{where} --workload-pool=my-project-123.svc.id.goog`.",
        *(f"verl-gke:existingCluster = true: node pool {pool} of cluster verl-a4 runs without the GKE metadata "
          f"server, so its pods can read the node's service account token: `gcloud container node-pools update "
          f"{pool} --cluster verl-a4 {where} --workload-metadata=GKE_METADATA`." for pool in ("gpu", "old")),
    ]
    calico = {CLUSTER: {**base, **HARDENED, "datapathProvider": "LEGACY_DATAPATH",
                        "networkPolicies": [{"enabled": True, "provider": "CALICO"}]}}
    assert synth_with(calico, **{"verl-gke:existingCluster": "true"}).outputs["clusterName"] == "verl-a4"
    autopilot = {CLUSTER: {**base, "enableAutopilot": True}}
    assert synth_with(autopilot, **{"verl-gke:existingCluster": "true"}).outputs["clusterName"] == "verl-a4"


def test_the_cluster_carries_its_stacks_label(synth_stack):
    (cluster,) = [r for r in synth_stack("a4x").registrations if r.type == "gcp:container/cluster:Cluster"]
    assert cluster.inputs["resourceLabels"] == {"verl-gke-stack": "a4x"}


@pytest.mark.parametrize(("token", "answer", "message"), [
    (RESERVATION, "x", 'the answer to gcp:compute/getReservation:getReservation must be a JSON object'),
    (MACHINE_TYPES, [1, 2], 'the answer to gcp:compute/getMachineTypes:getMachineTypes must be a JSON object'),
    (RESERVATION, {"name": "r", "specificReservations": "x"},
     'verl-gke:reservation = "my-reservation": reservation my-reservation: the answer has an unexpected shape '
     '(AttributeError'),
    (MACHINE_TYPES, {"machineTypes": [{"name": "a4-highgpu-8g", "guestCpus": "many"}]},
     'gcp:zone = "us-central1-b": machine type a4-highgpu-8g: the answer has an unexpected shape (ValueError'),
    (ENGINE_VERSIONS, {"releaseChannelDefaultVersion": "x"},
     'verl-gke:releaseChannel = "REGULAR": GKE versions of the release channel: the answer has an unexpected '
     'shape (AttributeError'),
])
def test_cloud_answers_of_the_wrong_shape_are_one_line_each(tmp_path: Path, token: str, answer: Any, message: str):
    answers = tmp_path / "cloud.json"
    answers.write_text(json.dumps({**GOOD, token: answer}))
    run = synth_cli(STACK, "--out", str(tmp_path / "out"), "--cloud", str(answers),
               "--set", "gcp:project=my-project-123", "--set", "verl-gke:reservation=my-reservation")
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert message in run.stderr


# --- a model folder of your own (the critic's, or the actor's): its config.json in the stack's bucket ----------

BUCKET = "verl-dev-my-project-123"
CRITIC = {"verl-gke:verl": json.dumps({"algorithm": {"adv_estimator": "gae"},
                                       "critic": {"model": {"path": "/data/my-critic"}}})}


def model_preview(config: dict[str, str], objects: dict[str, Any]) -> tuple[Any, list[dict]]:
    """run_preflight at preview: the healthy project, the object reads (getBucketObjectContent) answered from
    `objects` (name -> content, or the provider's error text: "googleapi: Error 404: No such object" for a
    missing one, as startFrom's tests take it)."""
    from domain import preflight
    from domain.config import load_config

    cfg = load_config({**REAL, "gcp:region": "us-central1", "gcp:zone": "us-central1-b", **config})
    healthy, asked = preflight.healthy_answers(cfg), []

    def invoke(token: str, args: dict[str, Any]) -> dict[str, Any]:
        if token != preflight.OBJECT:
            return healthy(token, args)
        asked.append(args)
        found = objects.get(args["name"], "googleapi: Error 404: No such object")
        if found.startswith("googleapi:"):
            raise RuntimeError(f"invoke of {token} failed: {found}")
        return {"content": found}
    return preflight.run_preflight(cfg, invoke, "dev"), asked


def test_a_critic_model_folder_without_config_json_is_refused_at_preview_and_one_with_it_passes() -> None:
    result, asked = model_preview(CRITIC, {})
    assert asked == [{"bucket": BUCKET, "name": "my-critic/config.json"}]
    assert result.problems == [
        f'verl-gke:verl.critic.model.path = "/data/my-critic": no gs://{BUCKET}/my-critic/config.json: verl loads the '
        "critic's model, a Hugging Face model folder, from there when the run starts; copy the model there (its "
        "config.json, tokenizer and safetensors), or leave critic.model.path unset for the actor's model."]
    result, _ = model_preview(CRITIC, {"my-critic/config.json": "{}"})
    assert result.problems == [] and "model folders: critic.model.path holds config.json" in result.checks


def test_an_unreadable_model_folder_is_not_checked_and_not_refused() -> None:
    result, _ = model_preview(CRITIC, {"my-critic/config.json": "googleapi: Error 403: forbidden"})
    assert result.problems == [] and result.notes[-1] == (
        f"verl-gke:verl.critic.model.path: NOT CHECKED that gs://{BUCKET}/my-critic/config.json exists: the "
        "provider said: googleapi: Error 403: forbidden")


def test_the_actors_own_model_folder_is_checked_and_the_staged_one_is_not() -> None:
    own = {"verl-gke:verl": json.dumps({"algorithm": {"adv_estimator": "gae"},
                                        "actor_rollout_ref": {"model": {"path": "/data/mine/Qwen-ft"}}})}
    result, asked = model_preview(own, {})  # the critic starts from the actor's model: one folder, one read
    assert asked == [{"bucket": BUCKET, "name": "mine/Qwen-ft/config.json"}]
    assert [p[:77] for p in result.problems] == [
        'verl-gke:verl.actor_rollout_ref.model.path = "/data/mine/Qwen-ft": no gs://ve']
    assert result.problems[0].endswith("or leave actor_rollout_ref.model.path unset for the staged "
                                       "Qwen/Qwen2.5-32B-Instruct.")
    # The staged model (and the critic that starts from it): staging writes it, nothing is read.
    assert model_preview({"verl-gke:verl": json.dumps({"algorithm": {"adv_estimator": "gae"}})}, {})[1] == []


def test_synth_with_cloud_answers_refuses_a_missing_critic_model() -> None:
    from domain.preflight import OBJECT

    line = problems_of({**GOOD, OBJECT: {"error": "googleapi: Error 404: No such object"}}, **CRITIC)
    assert 'verl-gke:verl.critic.model.path = "/data/my-critic": no gs://' in line
    assert synth_with({**GOOD, OBJECT: {"content": "{}"}}, **CRITIC).stack == STACK
