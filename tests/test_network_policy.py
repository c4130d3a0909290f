"""The Ray pods' NetworkPolicy: only the cluster's own pods reach them, on every stack."""

from __future__ import annotations

from typing import Any

import pytest

from manifests.network_policy import ray_ingress_policy
from tests.conftest import STACKS
from tests.k8s_schema import validate_core
from verl_gke import synth


def _policies(result: synth.SynthResult) -> list[dict[str, Any]]:
    return [m for m in result.manifests() if m["kind"] == "NetworkPolicy"]


def test_the_policy_validates_against_the_kubernetes_schema() -> None:
    validate_core(ray_ingress_policy(cluster="b200-ray-cluster", namespace="default"))
    validate_core(ray_ingress_policy(cluster="b200-ray-cluster", namespace="default", dashboard_cidrs=["10.8.0.0/16"]))


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_lets_only_its_ray_pods_reach_its_ray_pods(synth_stack: Any, stack: str) -> None:
    result = synth_stack(stack)
    ray = next(m for m in result.manifests() if m["kind"] == "RayCluster")
    [policy] = _policies(result)
    own = {"ray.io/cluster": ray["metadata"]["name"]}
    assert policy["metadata"] == {"name": f"{ray['metadata']['name']}-ingress", "namespace": ray["metadata"]["namespace"]}
    supervisor = {"app.kubernetes.io/name": "verl-gke", "app.kubernetes.io/component": "run-supervisor"}
    assert policy["spec"] == {"podSelector": {"matchLabels": own}, "policyTypes": ["Ingress"],
                              "ingress": [{"from": [{"podSelector": {"matchLabels": own}}]},
                                          # the run supervisor, on the Job API's port only
                                          {"from": [{"podSelector": {"matchLabels": supervisor}}],
                                           "ports": [{"protocol": "TCP", "port": 8265}]}]}


def test_a_private_dashboard_path_is_let_in_on_8265_only() -> None:
    result = synth.run("a4-standard", overrides={"verl-gke:rayDashboardCidrs": '["10.8.0.0/16"]'})
    [policy] = _policies(result)
    assert policy["spec"]["ingress"][2] == {"from": [{"ipBlock": {"cidr": "10.8.0.0/16"}}],
                                            "ports": [{"protocol": "TCP", "port": 8265}]}


def test_the_policy_can_be_turned_off() -> None:
    assert _policies(synth.run("a4-standard", overrides={"verl-gke:rayNetworkPolicy": "false"})) == []
