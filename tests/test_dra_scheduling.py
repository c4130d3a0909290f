"""The NVIDIA DRA driver's pods schedule on the nodes the a4x stack itself creates: its Helm values
(as the program passes them) evaluated against the labels and taints those nodes carry on GKE."""

from __future__ import annotations

from typing import Any

import pytest

from manifests import dra

POOL = "gcp:container/nodePool:NodePool"
RELEASE = "kubernetes:helm.sh/v3:Release"
# Architecture of the machine families the stacks use (GCP's machine-series docs).
ARCH_OF_SERIES = {"a4x": "arm64", "c2": "amd64", "a4": "amd64", "a3": "amd64"}


def _matches(expression: dict[str, Any], labels: dict[str, str]) -> bool:
    """One node selector requirement, as the scheduler reads it."""
    key, op = expression["key"], expression["operator"]
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op == "In":
        return labels.get(key) in expression["values"]
    if op == "NotIn":
        return labels.get(key) not in expression["values"]
    raise AssertionError(f"operator {op} not handled")


def schedulable(pod_values: dict[str, Any], node: dict[str, Any]) -> bool:
    terms = pod_values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    fits = any(all(_matches(e, node["labels"]) for e in term["matchExpressions"]) for term in terms)
    tolerated = all(any(t["key"] == taint["key"] and t["operator"] == "Exists" for t in pod_values["tolerations"])
                    for taint in node["taints"])
    return fits and tolerated


def gke_node(pool_inputs: dict[str, Any]) -> dict[str, Any]:
    """The labels and NoSchedule taints GKE gives a node of this pool."""
    config = pool_inputs["nodeConfig"]
    arch = ARCH_OF_SERIES[config["machineType"].split("-")[0]]
    labels = {dra.ARCH_LABEL: arch, **config.get("labels", {})}
    taints = []
    for accelerator in config.get("guestAccelerators", []):
        labels[dra.ACCELERATOR_LABEL] = accelerator["type"]
        taints.append({"key": "nvidia.com/gpu"})
    if arch == "arm64":
        taints.append({"key": "kubernetes.io/arch"})
    return {"labels": labels, "taints": taints}


@pytest.fixture(scope="module")
def a4x(synth_stack: Any) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    result = synth_stack("a4x")
    values = next(r.inputs["values"] for r in result.registrations
                  if r.type == RELEASE and r.inputs["name"] == dra.CHART.name)
    nodes = {r.inputs["name"]: gke_node(r.inputs) for r in result.registrations if r.type == POOL}
    return values, nodes


def test_the_stack_has_a_gpu_pool_and_a_cpu_pool(a4x: Any) -> None:
    _, nodes = a4x
    kinds = sorted(dra.ACCELERATOR_LABEL in node["labels"] for node in nodes.values())
    assert kinds == [False, True]


def test_the_kubelet_plugin_runs_on_every_gb200_node_and_nowhere_else(a4x: Any) -> None:
    values, nodes = a4x
    for name, node in nodes.items():
        gpu = node["labels"].get(dra.ACCELERATOR_LABEL) == "nvidia-gb200"
        assert schedulable(values["kubeletPlugin"], node) is gpu, name


def test_the_controller_runs_on_the_cpu_nodes_only(a4x: Any) -> None:
    values, nodes = a4x
    for name, node in nodes.items():
        assert schedulable(values["controller"], node) is (dra.ACCELERATOR_LABEL not in node["labels"]), name


def test_the_charts_default_affinities_would_match_no_node_of_the_stack(a4x: Any) -> None:
    _, nodes = a4x
    # The 25.3 chart's defaults: a control-plane node for the controller, NFD or
    # nvidia.com/gpu.present labels for the kubelet plugin; GKE nodes carry none of them.
    controller = {"tolerations": [], "affinity": dra.node_affinity(
        {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"})}
    plugin = {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"},
                              {"key": "kubernetes.io/arch", "operator": "Exists"}],
              "affinity": dra.node_affinity({"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]})}
    assert not any(schedulable(controller, node) or schedulable(plugin, node) for node in nodes.values())
