"""RayTrainingCluster and A4xDra under the mock engine: what each registers, through which provider,
in which order, and the RayCluster / DRA objects as the engine would send them (schema-checked)."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pytest

from components.a4x_dra import A4xDra, A4xDraArgs
from domain.platforms import PLATFORMS, WORKER_CPU_HEADROOM, WORKER_MEMORY_FRACTION
from components.ray_training_cluster import RayTrainingCluster, RayTrainingClusterArgs, cluster_spec
from manifests import dra, kuberay
from manifests.ray_cluster import ray_cluster
from tests.k8s_schema import validate_core, validate_custom
from tests.mock_run import MockRun
from verl_gke import synth

RAY_CLUSTER = "kubernetes:ray.io/v1:RayCluster"
DIGEST = "sha256:" + "cd" * 32


def pinned(image: str) -> str:
    """What the pods get for a tagged image under the mock engine: the PinnedImage's ref, with synth's
    marked placeholder where the registry's digest goes at the first `pulumi up`."""
    return f"{image}@{synth.UNRESOLVED_DIGEST}"
RELEASE = "kubernetes:helm.sh/v3:Release"
CLAIM = "training-bucket-pvc-0123456789"


def ray_args(platform: str, mode: str = "standard", **overrides: Any) -> RayTrainingClusterArgs:
    """The args but the claim, which `deploy` registers."""
    args: dict[str, Any] = {"platform": platform, "mode": mode, "gpu_nodes": 2, "namespace": "verl",
                            "service_account": "verl-ray"}
    args.update(overrides)
    return args  # type: ignore[return-value]


def deploy(args: RayTrainingClusterArgs, dra_args: A4xDraArgs | None = None) -> MockRun:
    """The program the lead wires, reduced to these components: one provider, the bucket's claim, a
    stand-in for the other resources the pods need first (GPU pool), and on A4X the DRA component."""

    def program() -> None:
        provider = k8s.Provider("k8s", kubeconfig="mock")
        claim = k8s.core.v1.PersistentVolumeClaim("claim", metadata={"name": CLAIM, "namespace": "verl"},
                                                  opts=pulumi.ResourceOptions(provider=provider))
        prerequisite = k8s.core.v1.ConfigMap("prerequisite", opts=pulumi.ResourceOptions(provider=provider))
        waits_for: list[pulumi.Resource] = [prerequisite]
        if dra_args is not None:
            waits_for.append(A4xDra("dra", dra_args,
                                    opts=pulumi.ResourceOptions(providers=[provider], depends_on=[prerequisite])))
        cluster = RayTrainingCluster("ray", {**args, "claim": claim},
                                     opts=pulumi.ResourceOptions(providers=[provider], depends_on=waits_for))
        pulumi.export("name", cluster.name)
        pulumi.export("headService", cluster.head_service)
        pulumi.export("namespace", cluster.namespace)

    return MockRun(program)


PLATFORM_MODES = [(p, m) for p in PLATFORMS for m in ("autopilot", "standard")
                  if m == "standard" or PLATFORMS[p].autopilot_supported]


@pytest.mark.parametrize(("platform", "mode"), PLATFORM_MODES)
def test_ray_cluster_is_the_builders_manifest_and_valid(platform: str, mode: str) -> None:
    args = ray_args(platform, mode, worker_spot=mode == "autopilot")
    run = deploy(args)
    registration = run.one(RAY_CLUSTER)
    sent = run.manifest(registration)
    # The platform's image is a tag: the RayCluster gets it pinned by digest, everything else as built.
    # Applied with force (it takes back what an older supervisor owned), awaited until KubeRay reports a
    # state (tests/test_pulumi_lifecycle.py); never with spec.suspend.
    spec = cluster_spec(args, CLAIM)
    built = ray_cluster(replace(spec, image=pinned(PLATFORMS[platform].image)))
    assert sent == {**built, "metadata": {**built["metadata"], "annotations": {
        "pulumi.com/patchForce": "true", "pulumi.com/waitFor": "jsonpath={.status.state}"}}}
    validate_custom(sent)
    assert sent["metadata"]["name"] == PLATFORMS[platform].ray_cluster_name
    assert "suspend" not in sent["spec"]  # the run lifecycle's field
    assert run.outputs == {"name": PLATFORMS[platform].ray_cluster_name,
                           "headService": f"{PLATFORMS[platform].ray_cluster_name}-head-svc",
                           "namespace": "verl"}


def test_every_child_uses_the_one_provider_and_waits_for_the_prerequisites() -> None:
    run = deploy(ray_args("a4x", install_kuberay=True), {"namespace": "verl", "gpu_nodes": 2})
    provider = run.by_name["k8s"].urn
    # The image's pin is no Kubernetes object and needs nothing of the cluster: it asks the registry
    # at once, not after the GPU nodes, under its own (dynamic) provider.
    pins = {"ray-image": "ray", "ray-kuberay-operator-image": "ray", "dra-driver-image": "dra"}
    for name, parent in pins.items():
        pin = run.by_name[name]
        assert (pin.type, pin.parent, pin.dependencies) == (synth.PINNED_IMAGE_TYPE, run.by_name[parent].urn, [])
        assert pin.provider != provider
    # A chart's archive pin (its sha256 kept at the first `up`) likewise; its Release waits for it.
    archives = {"ray-kuberay-operator-archive": "ray-kuberay-operator", "dra-driver-archive": "dra-driver"}
    for name, release in archives.items():
        kept = run.by_name[name]
        assert (kept.type, kept.parent, kept.dependencies) == ("pulumi-python:dynamic:PinnedChart",
                                                               run.by_name[release].parent, [])
        assert kept.provider != provider and kept.urn in run.by_name[release].dependencies
    children = [r for r in run.registrations
                if r.custom and r.name not in ("k8s", "claim", "prerequisite", *pins, *archives)]
    assert len(children) == 8  # the DRA objects, the operator, the RayCluster and its NetworkPolicy
    assert {r.provider for r in children} == {provider}
    prerequisite = run.by_name["prerequisite"].urn
    assert all(prerequisite in r.dependencies for r in children)
    components = {run.by_name["ray"].urn, run.by_name["dra"].urn}
    assert {r.parent for r in children} == components


def test_cluster_is_awaited_with_a_long_timeout_and_replaced_delete_first() -> None:
    sent = deploy(ray_args("a4")).sent("ray-ray-cluster")
    assert sent.timeouts == ("60m", "60m")
    assert sent.delete_before_replace is True
    sent = deploy(ray_args("a4", ready_timeout_minutes=90)).sent("ray-ray-cluster")
    assert sent.timeouts == ("90m", "90m")


def test_overrides_reach_the_manifest() -> None:
    args = ray_args("a3u", name="my-ray", image="verlai/verl:vllm011.dev7", ray_version="2.49.1",
                    worker_cpus=200, worker_memory_gi=2000, gpu_nodes=3, head_node_pool="cpu-pool",
                    verl_dir="/data/verl")
    run = deploy(args)
    sent = run.manifest(run.one(RAY_CLUSTER))
    worker = sent["spec"]["workerGroupSpecs"][0]
    pod = worker["template"]["spec"]
    assert sent["metadata"]["name"] == "my-ray"
    assert sent["spec"]["rayVersion"] == "2.49.1"
    assert pod["containers"][0]["image"] == pinned("verlai/verl:vllm011.dev7")
    assert pod["containers"][0]["resources"]["requests"]["cpu"] == "200"
    assert pod["containers"][0]["resources"]["requests"]["memory"] == "2000Gi"
    assert (worker["replicas"], worker["minReplicas"], worker["maxReplicas"]) == (3, 3, 3)
    assert sent["spec"]["headGroupSpec"]["template"]["spec"]["nodeSelector"] == {"cloud.google.com/gke-nodepool": "cpu-pool"}
    assert {"name": "PYTHONPATH", "value": "/data/verl"} in pod["containers"][0]["env"]
    assert run.outputs["headService"] == "my-ray-head-svc"


def _images(run: MockRun) -> set[str]:
    spec = run.manifest(run.one(RAY_CLUSTER))["spec"]
    pods = [spec["headGroupSpec"]["template"], *(g["template"] for g in spec["workerGroupSpecs"])]
    return {c["image"] for pod in pods for c in pod["spec"]["containers"]}


def test_a_tag_is_pinned_once_by_its_upstream_name_and_pulled_through_the_mirror() -> None:
    prefix = "us-central1-docker.pkg.dev/p/verl-a4-docker-hub"
    run = deploy(ray_args("a4", image="verlai/verl:vllm011.dev7", image_mirror=prefix))
    (pin,) = run.of_type(synth.PINNED_IMAGE_TYPE)
    assert pin.inputs["image"] == "verlai/verl:vllm011.dev7"  # Docker Hub's name: the digest is the mirror's too
    assert pin.urn in run.one(RAY_CLUSTER).dependencies
    assert _images(run) == {f"{prefix}/verlai/verl:vllm011.dev7@{synth.UNRESOLVED_DIGEST}"}
    assert _images(deploy(ray_args("a4", image="verlai/verl:vllm011.dev7"))) == {pinned("verlai/verl:vllm011.dev7")}


@pytest.mark.parametrize(("mirror", "expected"), [
    (None, f"verlai/verl@{DIGEST}"),
    ("us-central1-docker.pkg.dev/p/r", f"us-central1-docker.pkg.dev/p/r/verlai/verl@{DIGEST}"),
])
def test_an_image_with_a_digest_is_used_as_it_is(mirror: str | None, expected: str) -> None:
    run = deploy(ray_args("a4", image=f"verlai/verl@{DIGEST}", image_mirror=mirror))
    assert not run.of_type(synth.PINNED_IMAGE_TYPE)
    assert _images(run) == {expected}


def test_the_claim_is_waited_for_mounted_and_replaces_the_cluster() -> None:
    """Replaced with the claim: KubeRay never moves running pods to a new claim, and the old claim
    goes only once no pod mounts it (tests/test_pulumi_lifecycle.py)."""
    run = deploy(ray_args("a4"))
    cluster, claim = run.one(RAY_CLUSTER), run.by_name["claim"].urn
    assert claim in cluster.dependencies
    assert run.sent(cluster.name).replace_with == [claim]
    spec = run.manifest(cluster)["spec"]
    for pod in (spec["headGroupSpec"]["template"]["spec"], spec["workerGroupSpecs"][0]["template"]["spec"]):
        assert {"name": "training-bucket-vol", "persistentVolumeClaim": {"claimName": CLAIM}} in pod["volumes"]


def test_kuberay_operator_only_when_asked_and_before_the_cluster() -> None:
    assert deploy(ray_args("a4x")).of_type(RELEASE) == []
    run = deploy(ray_args("a4x", install_kuberay=True), {"namespace": "verl", "gpu_nodes": 2})
    (operator,) = [r for r in run.of_type(RELEASE) if r.inputs["name"] == "kuberay-operator"]
    # From the archive whose sha256 is pinned, never the repository by version (offline: not fetched).
    assert operator.inputs["chart"] == "[kuberay-operator-1.6.2.tgz: fetched at pulumi preview and up, installed only as its pinned sha256]"
    assert "version" not in operator.inputs and "repositoryOpts" not in operator.inputs
    assert kuberay.CHART.url == ("https://github.com/ray-project/kuberay-helm/releases/download/"
                                 "kuberay-operator-1.6.2/kuberay-operator-1.6.2.tgz")
    assert operator.inputs["namespace"] == "verl"
    assert operator.inputs["values"] == {"singleNamespaceInstall": True, "watchNamespace": ["verl"], "image": {
        "repository": "quay.io/kuberay/operator", "tag": f"v1.6.2@{synth.UNRESOLVED_DIGEST}"}}
    assert operator.urn in run.one(RAY_CLUSTER).dependencies


def test_a4x_dra_registers_the_tutorials_objects_in_order() -> None:
    run = deploy(ray_args("a4x"), {"namespace": "verl", "gpu_nodes": 4})
    namespace = run.by_name["dra-namespace"]
    quota = run.by_name["dra-quota"]
    driver = run.one(RELEASE)
    template = run.by_name["dra-rdma-nic"]
    domain = run.by_name["dra-compute-domain"]
    assert namespace.inputs["metadata"] == dra.namespace()["metadata"]
    assert quota.inputs["spec"]["hard"] == {"pods": "9"}
    assert driver.inputs["name"] == "nvidia-dra-driver-gpu"
    assert driver.inputs["chart"] == "[nvidia-dra-driver-gpu-25.3.2.tgz: fetched at pulumi preview and up, installed only as its pinned sha256]"
    assert "version" not in driver.inputs and "repositoryOpts" not in driver.inputs
    assert dra.CHART.url == "https://helm.ngc.nvidia.com/nvidia/charts/nvidia-dra-driver-gpu-25.3.2.tgz"
    assert driver.inputs["namespace"] == "nvidia-dra-driver-gpu"
    assert driver.inputs["values"] == dra.helm_values(accelerator="nvidia-gb200", arch="arm64", image={
        "repository": "nvcr.io/nvidia/k8s-dra-driver-gpu", "tag": f"v25.3.2@{synth.UNRESOLVED_DIGEST}"})
    assert run.manifest(template) == dra.rdma_claim_template(namespace="verl")
    assert run.manifest(domain) == dra.compute_domain(namespace="verl", gpu_nodes=4)
    # Namespace, then its quota, then the driver (whose pods the quota admits), then the domain.
    assert namespace.urn in quota.dependencies
    assert quota.urn in driver.dependencies
    assert driver.urn in domain.dependencies
    assert run.sent("dra-compute-domain").replace_on_changes == ["spec"]
    assert run.sent("dra-compute-domain").delete_before_replace is True
    # The Ray workers' claims exist before the RayCluster.
    cluster = run.one(RAY_CLUSTER)
    assert {template.urn, domain.urn} <= set(cluster.dependencies)


def test_a4x_dra_objects_are_valid_as_sent() -> None:
    run = deploy(ray_args("a4x"), {"namespace": "verl", "gpu_nodes": 2})
    for name in ("dra-namespace", "dra-quota", "dra-rdma-nic"):
        registration = run.by_name[name]
        validate_core({k: v for k, v in registration.inputs.items() if k in ("apiVersion", "kind", "metadata", "spec")})
    validate_custom(run.manifest(run.by_name["dra-compute-domain"]))


def test_a4x_on_multi_network_has_no_nic_claim_template() -> None:
    run = deploy(ray_args("a4x", nic_claims=False), {"namespace": "verl", "gpu_nodes": 2, "nic_claims": False})
    assert "dra-rdma-nic" not in run.by_name
    pod = run.manifest(run.one(RAY_CLUSTER))["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert [c["name"] for c in pod["resourceClaims"]] == ["compute-domain-channel"]


@pytest.mark.parametrize(("overrides", "message"), [
    ({"platform": "a5"}, "platform = 'a5': must be one of a4, a3u, a4x"),
    ({"platform": "a4x", "mode": "autopilot"}, "A4X (GB200) runs only on Standard clusters"),
    ({"gpu_nodes": 0}, "worker_replicas = 0: must be a whole number, at least 1"),
    ({"mode": "standard", "worker_spot": True}, "worker_spot = True: applies to Autopilot only"),
])
def test_bad_args_are_refused_with_the_value_and_what_is_allowed(overrides: dict[str, Any], message: str) -> None:
    args: RayTrainingClusterArgs = {**ray_args("a4"), **overrides}  # type: ignore[typeddict-item]
    with pytest.raises(ValueError, match=re.escape(message)):
        cluster_spec(args, CLAIM)


def test_a4x_workers_leave_room_for_the_head_on_their_gpu_node() -> None:
    # The arm64-only head runs on a GB200 node beside that node's worker (one worker per node,
    # every node a worker): both must fit its allocatable resources, with the DaemonSet headroom.
    platform = PLATFORMS["a4x"]
    spec = ray_cluster(cluster_spec(ray_args("a4x", gpu_nodes=4, checkpoint_root="/data/verl/checkpoints"), CLAIM))["spec"]
    head = spec["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    worker = spec["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert (head["cpu"], head["memory"]) == ("12", "32Gi")
    assert (worker["cpu"], worker["memory"]) == ("123", "726Gi")
    copier = spec["workerGroupSpecs"][0]["template"]["spec"]["containers"][1]["resources"]["requests"]
    assert int(head["cpu"]) + int(worker["cpu"]) + int(copier["cpu"]) + WORKER_CPU_HEADROOM <= platform.allocatable_cpu
    gi = sum(int(c["memory"].removesuffix("Gi")) for c in (head, worker, copier))
    assert gi <= platform.allocatable_memory_gib * WORKER_MEMORY_FRACTION


@pytest.mark.parametrize(("overrides", "message"), [
    ({"worker_cpus": 136}, "worker_cpus = 136: an A4X node has 139.58 allocatable vCPUs and also runs the "
                           "Ray head (12) and the checkpoint copier (1); request at most 126"),
    ({"worker_memory_gi": 780}, "worker_memory_gi = 780: an A4X node has 799.97Gi allocatable and also runs the "
                                "Ray head (32Gi) and the checkpoint copier (1Gi); request at most 766"),
])
def test_a4x_workers_that_crowd_out_the_head_are_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        cluster_spec(ray_args("a4x", **overrides), CLAIM)
    cluster_spec(ray_args("a4x", worker_cpus=126, worker_memory_gi=766), CLAIM)
