"""Who may reach the Ray pods: a NetworkPolicy, because the Ray Job API of the clusters' Ray
versions (2.47, 2.49) takes jobs from anything that reaches port 8265, without authentication.

GKE's Dataplane V2 (the clusters' datapath) enforces it. `kubectl port-forward`, the way verl-gke
reaches the head, enters the pod through the kubelet and is not subject to it; nor are the
kubelet's probes. Pure builder: plain data in, a dict out.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

from domain.config_fields import host_and_port
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


# --- default deny, and what each pod of the namespace needs ------------------------------------

DNS_PORTS = ({"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53})
KUBE_DNS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
METADATA_SERVER = "169.254.169.254/32"
"""Where pods ask for their Workload Identity token (port 80), and where Cloud DNS for GKE answers DNS."""
GKE_METADATA_SERVER = "169.254.169.252/32"
"""The GKE metadata server's own port on Dataplane V2 clusters (988)."""
NODE_LOCAL_DNS = "169.254.20.10/32"
"""NodeLocal DNSCache's address, where a cluster runs it."""
NOT_PUBLIC = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16", "127.0.0.0/8")
"""The VPC, the nodes, the control plane's private endpoint, other pods, link-local: never "the internet"."""
HTTPS = {"protocol": "TCP", "port": 443}
KUBERAY_OPERATOR_LABELS = {"app.kubernetes.io/name": "kuberay-operator"}
"""The KubeRay chart's operator pod (its `kuberay-operator.name`, nameOverride kuberay-operator)."""


def _policy(name: str, namespace: str, selector: Mapping[str, str], egress: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"podSelector": {"matchLabels": dict(selector)}, "policyTypes": ["Egress"], "egress": egress}}


def _metadata_server() -> dict[str, Any]:
    return {"to": [{"ipBlock": {"cidr": METADATA_SERVER}}, {"ipBlock": {"cidr": GKE_METADATA_SERVER}}],
            "ports": [{"protocol": "TCP", "port": 80}, {"protocol": "TCP", "port": 988}]}


def _public_https() -> dict[str, Any]:
    """HTTPS to public addresses: Google's APIs (GCS, Secret Manager) have no other name a NetworkPolicy
    can hold (FQDN policies are GKE Enterprise's), so the internet's HTTPS with them."""
    return {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": list(NOT_PUBLIC)}}], "ports": [dict(HTTPS)]}


def _kubernetes_api() -> dict[str, Any]:
    """The control plane on 443, at whichever address the cluster gives it (private endpoint, PSC, public)."""
    return {"ports": [dict(HTTPS)]}


def _server(url: str) -> dict[str, Any]:
    """The port of the server an http(s) URL names: at its address if the URL gives one; for a host name at every
    address and every pod (NetworkPolicy cannot name hosts; a Service's pods match by identity, not ipBlock)."""
    host, port = host_and_port(url)
    try:
        to = [{"ipBlock": {"cidr": str(ipaddress.ip_network(host))}}]
    except ValueError:
        to = [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"namespaceSelector": {}}]
    return {"to": to, "ports": [{"protocol": "TCP", "port": port}]}


def namespace_policies(*, namespace: str, cluster: str, staging: Mapping[str, str],
                       supervisor: Mapping[str, str] | None = None, kuberay_operator: bool = False,
                       staging_writes_secret: bool = False, ray_servers: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Default deny for every pod of `namespace` (ingress and egress; CIS GKE 5.3.2), DNS for every
    pod, and the egress each workload needs: the Ray pods of `cluster` to each other, the metadata
    server, HTTPS and each of `ray_servers` (http(s) URLs: the MLflow tracking server) on its port;
    staging (pods labelled `staging`) to the metadata server and HTTPS (and the Kubernetes
    API when `staging_writes_secret`: wandb's key); the run
    supervisor to the head's Job API, the Kubernetes API, the metadata server and HTTPS (its copy of the
    logs); the KubeRay operator to the Kubernetes API. Ingress to the Ray pods is ray_ingress_policy's."""
    own = {"podSelector": {"matchLabels": {CLUSTER_LABEL: cluster}}}
    policies = [
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
         "metadata": {"name": "default-deny", "namespace": namespace},
         "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}},
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
         "metadata": {"name": "dns", "namespace": namespace},
         "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [
             {"to": [dict(KUBE_DNS), {"ipBlock": {"cidr": METADATA_SERVER}}, {"ipBlock": {"cidr": NODE_LOCAL_DNS}}],
              "ports": [dict(p) for p in DNS_PORTS]}]}},
        _policy(f"{cluster}-egress", namespace, {CLUSTER_LABEL: cluster},
                [{"to": [own]}, _metadata_server(), _public_https(), *map(_server, ray_servers)]),
        _policy("staging-egress", namespace, staging,
                [_metadata_server(), _public_https(), *([_kubernetes_api()] if staging_writes_secret else [])]),
    ]
    if supervisor:
        head = {"podSelector": {"matchLabels": {CLUSTER_LABEL: cluster, "ray.io/node-type": "head"}}}
        policies.append(_policy("run-supervisor-egress", namespace, supervisor, [
            {"to": [head], "ports": [{"protocol": "TCP", "port": DASHBOARD_PORT}]}, _kubernetes_api(),
            # Its copy of the runs' logs: a token from the metadata server, the GCS JSON API over HTTPS.
            _metadata_server(), _public_https()]))
    if kuberay_operator:
        policies.append(_policy("kuberay-operator-egress", namespace, KUBERAY_OPERATOR_LABELS, [_kubernetes_api()]))
    return policies
