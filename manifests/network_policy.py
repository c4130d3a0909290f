"""Who may reach the Ray pods: a NetworkPolicy, because the Ray Job API of the clusters' Ray
versions (2.47, 2.49) takes jobs from anything that reaches port 8265, without authentication.

GKE's Dataplane V2 (the clusters' datapath) enforces it. `kubectl port-forward`, the way verl-gke
reaches the head, enters the pod through the kubelet and is not subject to it; nor are the
kubelet's probes. Pure builder: plain data in, a dict out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from manifests.ray_cluster import DASHBOARD_PORT

# KubeRay labels every pod of a RayCluster with its name.
CLUSTER_LABEL = "ray.io/cluster"


def ray_ingress_policy(*, cluster: str, namespace: str, dashboard_cidrs: Sequence[str] = (),
                       job_api_clients: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Ingress to the pods of RayCluster `cluster` only from its own pods (GCS, object transfer,
    NCCL bootstrap), to the dashboard and Job API from `dashboard_cidrs` (a private path to the
    head that `jobDashboardUrl` names) and from pods labelled `job_api_clients` (the run supervisor)."""
    own_pods = {"podSelector": {"matchLabels": {CLUSTER_LABEL: cluster}}}
    ingress: list[dict[str, Any]] = [{"from": [own_pods]}]
    if job_api_clients:
        ingress.append({"from": [{"podSelector": {"matchLabels": dict(job_api_clients)}}],
                        "ports": [{"protocol": "TCP", "port": DASHBOARD_PORT}]})
    if dashboard_cidrs:
        ingress.append({"from": [{"ipBlock": {"cidr": cidr}} for cidr in dashboard_cidrs],
                        "ports": [{"protocol": "TCP", "port": DASHBOARD_PORT}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"{cluster}-ingress", "namespace": namespace},
        "spec": {"podSelector": {"matchLabels": {CLUSTER_LABEL: cluster}}, "policyTypes": ["Ingress"],
                 "ingress": ingress},
    }
