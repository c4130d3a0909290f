"""manifests.ray_cluster against the tutorial's RayCluster manifests and the tutorial bugs it fixes."""

from __future__ import annotations

import copy
import json
from pathlib import Path
import subprocess
from dataclasses import replace
from typing import Any

import pytest

from domain.platforms import PLATFORMS, Platform
from manifests import dra
from manifests.storage import cache_volume, sidecar_annotations
from manifests.ray_cluster import (
    ARM_TOLERATION,
    RayClusterSpec,
    head_service_name,
    interfaces,
    ray_cluster,
)
from tests.k8s_schema import validate_core, validate_custom
from tests.seed_manifests import tutorial_named

KSA = "verl-ksa"
PVC = "training-bucket-pvc"
TUTORIAL_X86_IMAGE = "verlai/verl:vllm011.latest"
TUTORIAL_A4X_IMAGE = "verlai/verl:vllm023.aarch64.dev1"

# The tutorial's own inputs (its sizes included, 2800Gi too: sizing is the caller's job).
TUTORIAL_X86 = RayClusterSpec(
    name="b200-ray-cluster",
    namespace="default",
    ray_version="2.47.0",
    image=TUTORIAL_X86_IMAGE,
    service_account=KSA,
    claim_name=PVC,
    mode="autopilot",
    accelerator="nvidia-b200",
    gpus_per_node=8,
    worker_replicas=2,
    worker_cpus=220,
    worker_memory_gi=2800,
    worker_ephemeral_gi=1000,
    shm_gi=250,
    ld_library_path="/usr/local/nvidia/lib64",
    rdma_nics=8,
    worker_spot=True,
)
TUTORIAL_A4X = RayClusterSpec(
    name="gb200-ray-cluster",
    namespace="verl",
    ray_version="2.49.0",
    image=TUTORIAL_A4X_IMAGE,
    service_account=KSA,
    claim_name=PVC,
    mode="standard",
    accelerator="nvidia-gb200",
    gpus_per_node=4,
    worker_replicas=4,
    worker_cpus=120,
    worker_memory_gi=600,
    worker_ephemeral_gi=500,
    shm_gi=200,
    ld_library_path="/usr/local/nvidia/lib64",
    rdma_nics=4,
    arm64=True,
    a4x=True,
    dra_nics=True,
)


def _tutorial_x86(mode: str) -> dict[str, Any]:
    auto, standard = tutorial_named("RayCluster", "b200-ray-cluster", {"KSA_NAME": KSA, "GPU_TYPE": "nvidia-b200"})
    return copy.deepcopy(auto if mode == "autopilot" else standard)


def _worker(obj: dict[str, Any]) -> dict[str, Any]:
    group: dict[str, Any] = obj["spec"]["workerGroupSpecs"][0]
    return group


def _head_pod(obj: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = obj["spec"]["headGroupSpec"]["template"]["spec"]
    return pod


def _worker_pod(obj: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = _worker(obj)["template"]["spec"]
    return pod


def _corrected(tutorial: dict[str, Any], namespace: str, autopilot: bool = False) -> dict[str, Any]:
    """The tutorial's RayCluster with every intended difference applied, each with its reason."""
    out = copy.deepcopy(tutorial)
    for group in (out["spec"]["headGroupSpec"], *out["spec"]["workerGroupSpecs"]):
        # The gcsfuse sidecar sized per GKE's guidance, its file cache on a volume of its own,
        # and no Kubernetes API token in pods that never call the API.
        group["template"]["metadata"]["annotations"].update(sidecar_annotations(autopilot))
        group["template"]["spec"]["volumes"].append(cache_volume())
        group["template"]["spec"]["automountServiceAccountToken"] = False
        # The runtime's default seccomp filter, no privilege escalation, no capabilities but IPC_LOCK
        # on GPU workers (RDMA memory registration).
        group["template"]["spec"]["securityContext"] = {"seccompProfile": {"type": "RuntimeDefault"}}
        caps = {"drop": ["ALL"]}
        if group is not out["spec"]["headGroupSpec"]:
            caps["add"] = ["IPC_LOCK"]
        group["template"]["spec"]["containers"][0]["securityContext"] = {
            "allowPrivilegeEscalation": False, "capabilities": caps}
        lifecycle = group["template"]["spec"]["containers"][0].get("lifecycle")
        if lifecycle:  # A4X: TransferQueue by hash, without pulling anything else
            lifecycle["postStart"]["exec"]["command"] = HASHED_TRANSFER_QUEUE
    # Namespaced explicitly; not awaited by pulumi-kubernetes (the job provider's gate waits).
    out["metadata"] = {"name": out["metadata"]["name"], "namespace": namespace}
    # A new spec rolls every pod, so all run one checkpoint program (KubeRay recreates only so).
    out["spec"]["upgradeStrategy"] = {"type": "Recreate"}
    head_selector = _head_pod(out)["nodeSelector"]
    head_selector.pop("cloud.google.com/gke-spot", None)  # bug 6: never a Spot head
    if head_selector.get("cloud.google.com/gke-nodepool") == "default-pool":
        # A CPU pool of its own name: the provider deletes a `default-pool` when remove_default_node_pool flips.
        head_selector["cloud.google.com/gke-nodepool"] = "verl-cpu"
    worker = _worker_pod(out)
    worker.pop("initContainers", None)  # opt-in (verl_dir), see its own test
    if "cloud.google.com/gke-accelerator-count" in worker["nodeSelector"]:
        worker["nodeSelector"]["cloud.google.com/gke-accelerator-count"] = "8"  # bug 3
    # Host paths no container mounts are dropped; the driver and gIB mounts are read-only.
    worker["volumes"] = [v for v in worker["volumes"] if v["name"] not in ("lib64", "sys", "proc-sys")]
    for mount in worker["containers"][0]["volumeMounts"]:
        if mount["name"] in ("nvidia", "gib"):
            mount["readOnly"] = True
    return out


def _parse_interfaces(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    annotations = _worker(out)["template"]["metadata"]["annotations"]
    if "networking.gke.io/interfaces" in annotations:
        annotations["networking.gke.io/interfaces"] = json.loads(annotations["networking.gke.io/interfaces"])
    return out


@pytest.mark.parametrize("mode", ["autopilot", "standard"])
def test_x86_matches_the_tutorial_except_the_listed_corrections(mode: str) -> None:
    spec = replace(TUTORIAL_X86, mode=mode, worker_spot=mode == "autopilot")
    ours = ray_cluster(spec)
    expected = _corrected(_tutorial_x86(mode), "default", autopilot=mode == "autopilot")
    assert _parse_interfaces(ours) == _parse_interfaces(expected)


def test_a4x_matches_the_tutorial_except_the_listed_corrections() -> None:
    env = {"KSA_NAME": KSA, "NAMESPACE": "verl", "VERL_IMAGE": TUTORIAL_A4X_IMAGE, "NUM_GPU_NODES": "4"}
    (tutorial,) = tutorial_named("RayCluster", "gb200-ray-cluster", env)
    assert ray_cluster(TUTORIAL_A4X) == _corrected(tutorial, "verl")


def test_autopilot_head_is_on_demand_c2_and_workers_spot_by_choice() -> None:
    ours = ray_cluster(TUTORIAL_X86)
    assert _head_pod(ours)["nodeSelector"] == {
        "cloud.google.com/machine-family": "c2",
        "cloud.google.com/compute-class": "Performance",
    }
    assert _worker_pod(ours)["nodeSelector"] == {
        "cloud.google.com/gke-accelerator": "nvidia-b200",
        "cloud.google.com/gke-accelerator-count": "8",
        "cloud.google.com/gke-spot": "true",
        "cloud.google.com/compute-class": "Performance",
    }
    on_demand = ray_cluster(replace(TUTORIAL_X86, worker_spot=False))
    assert "cloud.google.com/gke-spot" not in _worker_pod(on_demand)["nodeSelector"]


def test_standard_head_runs_on_the_configured_cpu_pool() -> None:
    ours = ray_cluster(replace(TUTORIAL_X86, mode="standard", worker_spot=False, head_node_pool="cpu-pool"))
    assert _head_pod(ours)["nodeSelector"] == {"cloud.google.com/gke-nodepool": "cpu-pool"}
    assert _worker_pod(ours)["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-b200"}


def test_interfaces_annotation_maps_eth0_default_eth1_gvnic_and_one_rdma_net_per_nic() -> None:
    group = _worker(ray_cluster(TUTORIAL_X86))
    annotations = group["template"]["metadata"]["annotations"]
    assert annotations["networking.gke.io/default-interface"] == "eth0"
    assert json.loads(annotations["networking.gke.io/interfaces"]) == interfaces(8)
    assert interfaces(8)[:3] == [
        {"interfaceName": "eth0", "network": "default"},
        {"interfaceName": "eth1", "network": "gvnic-1"},
        {"interfaceName": "eth2", "network": "rdma-0"},
    ]
    assert interfaces(8)[-1] == {"interfaceName": "eth9", "network": "rdma-7"}
    assert len(interfaces(4)) == 6


def test_a4x_worker_claims_every_nic_and_the_imex_channel() -> None:
    pod = _worker_pod(ray_cluster(TUTORIAL_A4X))
    assert pod["resourceClaims"] == [
        {"name": "rdma-nic-0", "resourceClaimTemplateName": "verl-rdma-nic"},
        {"name": "rdma-nic-1", "resourceClaimTemplateName": "verl-rdma-nic"},
        {"name": "rdma-nic-2", "resourceClaimTemplateName": "verl-rdma-nic"},
        {"name": "rdma-nic-3", "resourceClaimTemplateName": "verl-rdma-nic"},
        {"name": "compute-domain-channel", "resourceClaimTemplateName": dra.CHANNEL_CLAIM_TEMPLATE},
    ]
    claims = pod["containers"][0]["resources"]["claims"]
    assert [c["name"] for c in claims] == [c["name"] for c in pod["resourceClaims"]]
    annotations = _worker(ray_cluster(TUTORIAL_A4X))["template"]["metadata"]["annotations"]
    assert annotations == sidecar_annotations(autopilot=False)


def test_a4x_on_multi_network_names_its_nics_and_claims_only_the_channel() -> None:
    group = _worker(ray_cluster(replace(TUTORIAL_A4X, dra_nics=False)))
    annotations = group["template"]["metadata"]["annotations"]
    assert json.loads(annotations["networking.gke.io/interfaces"]) == interfaces(4)
    assert interfaces(4)[-1] == {"interfaceName": "eth5", "network": "rdma-3"}
    assert group["template"]["spec"]["resourceClaims"] == [
        {"name": "compute-domain-channel", "resourceClaimTemplateName": "verl-compute-domain-channel"}
    ]
    assert group["template"]["spec"]["containers"][0]["resources"]["claims"] == [{"name": "compute-domain-channel"}]


HASHED_TRANSFER_QUEUE = [
    "/bin/bash", "-c", "pip3 install --quiet --no-deps --only-binary=:all: --require-hashes -r <(echo 'TransferQueue==0.1.8 "
    "--hash=sha256:078c4a63ba0c222fe684e96844c937dcd97f45ac94340a9c92eb03cfbc48cffd')"]


def test_a4x_head_takes_no_ray_cpus_and_installs_the_pinned_transfer_queue_by_hash(tmp_path: Path) -> None:
    obj = ray_cluster(TUTORIAL_A4X)
    assert obj["spec"]["headGroupSpec"]["rayStartParams"] == {"dashboard-host": "0.0.0.0", "num-cpus": "0"}
    for pod in (_head_pod(obj), _worker_pod(obj)):
        hook = pod["containers"][0]["lifecycle"]["postStart"]["exec"]["command"]
        assert hook == HASHED_TRANSFER_QUEUE
    # The hook as bash runs it, with a pip3 that prints the requirements file it was given.
    (tmp_path / "pip3").write_text('#!/bin/bash\nwhile [[ $1 != -r ]]; do shift; done; cat "$2"\n')
    (tmp_path / "pip3").chmod(0o755)
    done = subprocess.run(hook, capture_output=True, text=True, timeout=30, check=True,
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert done.stdout == ("TransferQueue==0.1.8 "
                           "--hash=sha256:078c4a63ba0c222fe684e96844c937dcd97f45ac94340a9c92eb03cfbc48cffd\n")


def test_verl_tree_is_off_by_default_and_first_on_every_ray_containers_path_when_set() -> None:
    default = ray_cluster(TUTORIAL_X86)
    assert "env" not in _head_pod(default)["containers"][0]
    assert _worker_pod(default)["containers"][0]["env"] == [
        {"name": "LD_LIBRARY_PATH", "value": "/usr/local/nvidia/lib64"}
    ]
    assert "initContainers" not in _worker_pod(default)
    source = ray_cluster(replace(TUTORIAL_X86, verl_dir="/data/verl-0.6.1"))
    path = [{"name": "PYTHONPATH", "value": "/data/verl-0.6.1"}, {"name": "PYTHONPYCACHEPREFIX", "value": "/tmp/pycache"}]
    assert _head_pod(source)["containers"][0]["env"] == path
    assert _worker_pod(source)["containers"][0]["env"] == [
        {"name": "LD_LIBRARY_PATH", "value": "/usr/local/nvidia/lib64"}, *path]


def test_head_service_follows_kuberay_naming() -> None:
    assert head_service_name("h200-ray-cluster") == "h200-ray-cluster-head-svc"


def _platform_spec(platform: Platform, mode: str, nodes: int = 2) -> RayClusterSpec:
    return RayClusterSpec(
        name=platform.ray_cluster_name,
        namespace="verl",
        ray_version=platform.ray_version,
        image=platform.image,
        service_account=KSA,
        claim_name=PVC,
        mode=mode,  # type: ignore[arg-type]
        accelerator=platform.accelerator,
        gpus_per_node=platform.gpus_per_node,
        worker_replicas=nodes,
        worker_cpus=platform.worker_cpus,
        worker_memory_gi=platform.worker_memory_gi,
        worker_ephemeral_gi=platform.worker_ephemeral_storage_gi,
        shm_gi=platform.shm_size_gi,
        ld_library_path=platform.ld_library_path,
        rdma_nics=platform.rdma_nics,
        arm64=platform.arch == "arm64",
        a4x=platform.name == "a4x",
        dra_nics=platform.name == "a4x",
        worker_spot=mode == "autopilot",
    )


PLATFORM_MODES = [
    (name, mode)
    for name, platform in PLATFORMS.items()
    for mode in ("autopilot", "standard")
    if mode == "standard" or platform.autopilot_supported
]


@pytest.mark.parametrize(("platform_name", "mode"), PLATFORM_MODES)
def test_every_platform_and_mode_validates_against_the_crd_and_core_schemas(platform_name: str, mode: str) -> None:
    obj = ray_cluster(_platform_spec(PLATFORMS[platform_name], mode))
    validate_custom(obj)
    for template in (obj["spec"]["headGroupSpec"]["template"], _worker(obj)["template"]):
        validate_core({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template})


@pytest.mark.parametrize(("platform_name", "mode"), PLATFORM_MODES)
def test_workers_are_sized_from_the_platform_and_fixed_in_number(platform_name: str, mode: str) -> None:
    platform = PLATFORMS[platform_name]
    obj = ray_cluster(_platform_spec(platform, mode, nodes=3))
    assert obj["metadata"]["name"] == platform.ray_cluster_name
    assert obj["spec"]["rayVersion"] == platform.ray_version
    group = _worker(obj)
    assert (group["groupName"], group["replicas"], group["minReplicas"], group["maxReplicas"]) == ("gpu-group", 3, 3, 3)
    size = {
        "cpu": str(platform.worker_cpus),
        "memory": f"{platform.worker_memory_gi}Gi",
        "nvidia.com/gpu": str(platform.gpus_per_node),
        "ephemeral-storage": f"{platform.worker_ephemeral_storage_gi}Gi",
    }
    resources = _worker_pod(obj)["containers"][0]["resources"]
    assert resources["requests"] == size
    assert resources["limits"] == size
    assert group["rayStartParams"] == {"num-cpus": str(platform.worker_cpus)}
    for pod in (_head_pod(obj), _worker_pod(obj)):
        assert all(isinstance(v, str) for v in pod["nodeSelector"].values())
        assert "cloud.google.com/gke-spot" not in _head_pod(obj)["nodeSelector"]
        assert {"name": "training-bucket-vol", "persistentVolumeClaim": {"claimName": PVC}} in pod["volumes"]
        assert pod["serviceAccountName"] == KSA
    shm = next(v for v in _worker_pod(obj)["volumes"] if v["name"] == "shared-memory")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": f"{platform.shm_size_gi}Gi"}


def test_h200_workers_fit_the_machine_unlike_the_tutorials_2800gi() -> None:
    a3u = PLATFORMS["a3u"]
    memory = _worker_pod(ray_cluster(_platform_spec(a3u, "standard")))["containers"][0]["resources"]["requests"]["memory"]
    assert int(memory.removesuffix("Gi")) < a3u.allocatable_memory_gib < 2800


def test_bad_spec_names_every_problem() -> None:
    with pytest.raises(ValueError) as err:
        replace(
            TUTORIAL_A4X,
            name="GB200_cluster",
            image="verlai/verl:latest",
            mode="autopilot",
            worker_replicas=0,
            shm_gi=700,
        )
    text = str(err.value)
    assert "name = 'GB200_cluster': must be a DNS-1035 label" in text
    assert "image = 'verlai/verl:latest': needs a fixed tag or digest" in text
    assert "mode = 'autopilot': A4X (GB200) runs only on Standard clusters" in text
    assert "worker_replicas = 0: must be a whole number, at least 1" in text
    assert "shm_gi = 700: must be below worker_memory_gi (600)" in text
    with pytest.raises(ValueError, match="worker_spot = True: applies to Autopilot only"):
        replace(TUTORIAL_X86, mode="standard")
    with pytest.raises(ValueError, match="mode = 'gke': must be one of autopilot, standard"):
        replace(TUTORIAL_X86, mode="gke")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at most 53 characters"):
        replace(TUTORIAL_X86, name="r" * 54)
    with pytest.raises(ValueError, match="dra_nics = True: DRA NIC claims are set up for A4X"):
        replace(TUTORIAL_X86, dra_nics=True)
    with pytest.raises(ValueError, match="needs a fixed tag"):
        replace(TUTORIAL_X86, image="verlai/verl")


def test_arm64_nodes_are_tolerated_only_on_arm64() -> None:
    a4x = ray_cluster(TUTORIAL_A4X)
    head = a4x["spec"]["headGroupSpec"]["template"]["spec"]
    worker = a4x["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert ARM_TOLERATION in head["tolerations"] and ARM_TOLERATION in worker["tolerations"]
    x86 = ray_cluster(TUTORIAL_X86)
    assert ARM_TOLERATION not in x86["spec"]["workerGroupSpecs"][0]["template"]["spec"]["tolerations"]


def test_the_program_never_sets_the_field_the_supervisor_owns_nor_waits_on_a_suspendable_cluster():
    from tests.k8s_schema import _crds

    (v1,) = [v for v in _crds()[("ray.io", "RayCluster")]["spec"]["versions"] if v["name"] == "v1"]
    spec = v1["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    # The pinned CRD has the cluster-wide suspend, a scalar outside the atomic worker group list.
    assert spec["suspend"] == {"type": "boolean"} and "x-kubernetes-list-type" not in spec["workerGroupSpecs"]
    for out in (ray_cluster(TUTORIAL_X86), ray_cluster(TUTORIAL_A4X)):
        assert "suspend" not in out["spec"]
        assert "pulumi.com/waitFor" not in out["metadata"].get("annotations", {})
