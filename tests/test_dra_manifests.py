"""manifests.dra and manifests.kuberay against the tutorial's A4X steps (tutorial-ja)."""

from __future__ import annotations

import re

import pytest

from manifests import dra, kuberay
from manifests.helm import image_values
from tests.k8s_schema import CRD_FILES, validate_core, validate_custom
from tests.seed_manifests import TUTORIAL, TUTORIAL_DIR, tutorial_helm_install, tutorial_named

ENV = {"NAMESPACE": "verl", "NUM_GPU_NODES": "4"}


def _repo_url(alias: str) -> str:
    text = (TUTORIAL_DIR / TUTORIAL).read_text()
    match = re.search(rf"helm repo add {alias} (\S+)", text)
    assert match, f"no `helm repo add {alias}` in the tutorial"
    return match.group(1)


def test_namespace_and_quota_match_the_tutorial() -> None:
    (quota,) = tutorial_named("ResourceQuota", "nvidia-dra-driver-gpu-quota", ENV)
    assert dra.resource_quota(gpu_nodes=4) == quota
    assert dra.resource_quota(gpu_nodes=4)["spec"]["hard"] == {"pods": "9"}
    assert dra.resource_quota(gpu_nodes=18)["spec"]["hard"] == {"pods": "37"}
    # The tutorial's namespace, labelled with the strictest Pod Security level its privileged plugin allows.
    assert dra.namespace() == {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": "nvidia-dra-driver-gpu", "labels": {"pod-security.kubernetes.io/enforce": "privileged",
                                                    "pod-security.kubernetes.io/enforce-version": "v1.34"}}}


def test_claim_template_and_compute_domain_match_the_tutorial() -> None:
    (template,) = tutorial_named("ResourceClaimTemplate", "verl-rdma-nic", ENV)
    (domain,) = tutorial_named("ComputeDomain", "verl-compute-domain", ENV)
    assert dra.rdma_claim_template(namespace="verl") == template
    assert dra.compute_domain(namespace="verl", gpu_nodes=4) == domain
    assert dra.compute_domain(namespace="verl", gpu_nodes=2)["spec"] == {
        "numNodes": 2,
        "channel": {"resourceClaimTemplate": {"name": "verl-compute-domain-channel"}},
    }


def test_core_objects_validate_for_kubernetes_1_34() -> None:
    validate_core(dra.namespace())
    validate_core(dra.resource_quota(gpu_nodes=4))
    validate_core(dra.rdma_claim_template(namespace="verl"))


def test_compute_domain_validates_against_its_crd() -> None:
    validate_custom(dra.compute_domain(namespace="verl", gpu_nodes=4))


IMAGE_VALUES = {"repository": "registry.example/x", "tag": "v1@sha256:" + "e5" * 32}


def test_a_pinned_reference_becomes_the_charts_image_values() -> None:
    """The charts write `image: <repository>:<tag>` (kuberay-operator templates/deployment.yaml;
    nvidia-dra-driver-gpu v25.3.2 templates/_helpers.tpl `fullimage`): the digest rides in the tag."""
    ref = "quay.io/kuberay/operator:v1.6.2@sha256:" + "e5" * 32
    values = image_values(ref)
    assert values == {"repository": "quay.io/kuberay/operator", "tag": "v1.6.2@sha256:" + "e5" * 32}
    assert f"{values['repository']}:{values['tag']}" == ref
    assert image_values("localhost:5000/x/y:t@sha256:" + "e5" * 32)["repository"] == "localhost:5000/x/y"


def test_dra_helm_values_are_the_tutorials_set_flags_plus_gke_affinities() -> None:
    install = tutorial_helm_install("nvidia-dra-driver-gpu", ENV)
    values = dra.helm_values(accelerator="nvidia-gb200", arch="arm64", image=IMAGE_VALUES)
    assert values["image"] == IMAGE_VALUES  # the one image of the chart, by digest (tests/test_image_pins.py)
    assert {k: v for k, v in values.items() if k not in ("controller", "image")} == {
        **install["values"], "kubeletPlugin": {**install["values"]["kubeletPlugin"],
                                               "affinity": values["kubeletPlugin"]["affinity"]}}
    assert install["namespace"] == dra.NAMESPACE
    alias, chart = install["chart"].split("/")
    assert chart == dra.CHART.name
    assert _repo_url(alias) == dra.CHART.repo
    # Same 25.3 line as the tutorial's 25.3.1; the patch release whose CRD the tests pin.
    assert install["version"] == "25.3.1"
    assert dra.CHART.version == "25.3.2"
    assert any(f"-v{dra.CHART.version}-" in c.name and "NVIDIA" in c.url for c in CRD_FILES)


def test_kuberay_helm_values_are_the_tutorials_set_flags() -> None:
    install = tutorial_helm_install("kuberay-operator", ENV)
    values = kuberay.helm_values(namespace="verl", image=IMAGE_VALUES)
    assert {k: v for k, v in values.items() if k != "image"} == install["values"]
    assert values == {"singleNamespaceInstall": True, "watchNamespace": ["verl"], "image": IMAGE_VALUES}
    alias, chart = install["chart"].split("/")
    assert chart == kuberay.CHART.name
    assert _repo_url(alias) == kuberay.CHART.repo
    # The chart version matches the ray.io CRDs the RayCluster is validated against.
    assert any(f"kuberay-v{kuberay.CHART.version}-" in c.name for c in CRD_FILES)


@pytest.mark.parametrize("nodes", [0, -1, 2.0, True])
def test_node_count_must_be_a_positive_whole_number(nodes: object) -> None:
    with pytest.raises(ValueError, match=rf"gpu_nodes = {re.escape(repr(nodes))}: must be a whole number"):
        dra.compute_domain(namespace="verl", gpu_nodes=nodes)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gpu_nodes"):
        dra.resource_quota(gpu_nodes=nodes)  # type: ignore[arg-type]


def test_kuberay_needs_a_namespace() -> None:
    with pytest.raises(ValueError, match="namespace = ''"):
        kuberay.helm_values(namespace="", image=IMAGE_VALUES)
