"""The Ray pods' NetworkPolicy: only the cluster's own pods reach them, on every stack."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from manifests.network_policy import namespace_policies, ray_ingress_policy
from tests.conftest import STACKS, verl_value
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
    [policy] = [p for p in _policies(result) if p["metadata"]["name"].endswith("-ingress")]
    own = {"ray.io/cluster": ray["metadata"]["name"]}
    assert policy["metadata"] == {"name": f"{ray['metadata']['name']}-ingress", "namespace": ray["metadata"]["namespace"]}
    supervisor = {"app.kubernetes.io/name": "verl-gke", "app.kubernetes.io/component": "run-supervisor"}
    assert policy["spec"] == {"podSelector": {"matchLabels": own}, "policyTypes": ["Ingress"],
                              "ingress": [{"from": [{"podSelector": {"matchLabels": own}}]},
                                          # the run supervisor, on the Job API's port only
                                          {"from": [{"podSelector": {"matchLabels": supervisor}}],
                                           "ports": [{"protocol": "TCP", "port": 8265}]}]}


def test_a_private_dashboard_path_is_let_in_on_8265_only() -> None:
    # A single host (the stack's Ray has no token authentication; domain/config.py).
    result = synth.run("a4-standard", overrides={"verl-gke:rayDashboardCidrs": '["10.8.0.7/32"]'})
    [policy] = [p for p in _policies(result) if p["metadata"]["name"].endswith("-ingress")]
    assert policy["spec"]["ingress"][2] == {"from": [{"ipBlock": {"cidr": "10.8.0.7/32"}}],
                                            "ports": [{"protocol": "TCP", "port": 8265}]}


def test_the_policy_can_be_turned_off() -> None:
    assert _policies(synth.run("a4-standard", overrides={"verl-gke:rayNetworkPolicy": "false"})) == []


# --- default deny: what each pod may reach ------------------------------------------------------
# Kubernetes' NetworkPolicy semantics (kubernetes.io/docs/concepts/services-networking/network-policies/):
# a pod is isolated for a direction once any policy of its namespace selects it with that policy type;
# it may then send (receive) what the union of those policies' rules allows; a connection needs the
# sender's egress and the receiver's ingress. A rule without `to`/`from` allows any peer, without
# `ports` any port; a podSelector peer without namespaceSelector is the policy's own namespace.

NS = "verl-gke"


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _peer_matches(peer: dict[str, Any], dest: tuple, policy_ns: str) -> bool:
    if "ipBlock" in peer:
        if dest[0] != "ip":
            return False
        address = ipaddress.ip_address(dest[1])
        block = peer["ipBlock"]
        return (address in ipaddress.ip_network(block["cidr"])
                and not any(address in ipaddress.ip_network(e) for e in block.get("except", [])))
    if dest[0] != "pod":
        return False
    _, namespace, labels = dest
    if "namespaceSelector" in peer:
        if not _selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": namespace}):
            return False
    elif namespace != policy_ns:
        return False
    return _selects(peer.get("podSelector", {}), labels)


def _allowed(policies: list[dict[str, Any]], kind: str, pod: dict[str, str], peer: tuple, port: int,
             protocol: str) -> bool:
    """Whether `pod` (of NS) may send to (Egress) or receive from (Ingress) `peer` on `port`."""
    selecting = [p for p in policies if kind in p["spec"]["policyTypes"] and _selects(p["spec"]["podSelector"], pod)]
    if not selecting:
        return True
    key, peers = ("egress", "to") if kind == "Egress" else ("ingress", "from")
    for policy in selecting:
        for rule in policy["spec"].get(key, []):
            peers_ok = peers not in rule or any(_peer_matches(p, peer, policy["metadata"]["namespace"])
                                               for p in rule[peers])
            ports_ok = "ports" not in rule or any(
                p.get("port") in (None, port) and p.get("protocol", "TCP") == protocol for p in rule["ports"])
            if peers_ok and ports_ok:
                return True
    return False


def can_connect(policies: list[dict[str, Any]], source: dict[str, str], dest: tuple, port: int,
                protocol: str = "TCP") -> bool:
    """A connection from a pod of NS with labels `source` to `dest` (("pod", ns, labels) or ("ip", a))."""
    if not _allowed(policies, "Egress", source, dest, port, protocol):
        return False
    if dest[0] == "pod" and dest[1] == NS:
        return _allowed(policies, "Ingress", dest[2], ("pod", NS, source), port, protocol)
    return True


RAY_HEAD = {"ray.io/cluster": "b200-ray-cluster", "ray.io/node-type": "head", "ray.io/group": "headgroup"}
RAY_WORKER = {"ray.io/cluster": "b200-ray-cluster", "ray.io/node-type": "worker", "ray.io/group": "gpu-group"}
STAGING = {"app.kubernetes.io/name": "verl-gke", "app.kubernetes.io/component": "data-staging"}
SUPERVISOR = {"app.kubernetes.io/name": "verl-gke", "app.kubernetes.io/component": "run-supervisor"}
OTHER = {"app": "anything-else"}
KUBE_DNS = ("pod", "kube-system", {"k8s-app": "kube-dns"})
PUBLIC = ("ip", "142.250.1.207")  # an address of storage.googleapis.com; any public address alike
VPC, API_SERVER_PRIVATE = ("ip", "10.0.0.5"), ("ip", "172.16.0.2")
METADATA, GKE_METADATA = ("ip", "169.254.169.254"), ("ip", "169.254.169.252")
ELSEWHERE = ("pod", "other-namespace", {"app": "x"})

FLOWS = [  # (from, to, port, protocol, allowed, why)
    (RAY_WORKER, ("pod", NS, RAY_HEAD), 6379, "TCP", True, "a worker joins the head's GCS"),
    (RAY_HEAD, ("pod", NS, RAY_WORKER), 30000, "TCP", True, "Ray's object transfer, NCCL bootstrap: any port"),
    (RAY_WORKER, KUBE_DNS, 53, "UDP", True, "DNS"),
    (RAY_WORKER, METADATA, 80, "TCP", True, "the gcsfuse sidecar's Workload Identity token"),
    (RAY_WORKER, GKE_METADATA, 988, "TCP", True, "the GKE metadata server on Dataplane V2"),
    (RAY_WORKER, METADATA, 53, "UDP", True, "Cloud DNS for GKE answers on the metadata server"),
    (RAY_WORKER, PUBLIC, 443, "TCP", True, "Google APIs (GCS through the sidecar; PyPI on A4X), wandb, the Hub"),
    (RAY_WORKER, PUBLIC, 80, "TCP", False, "no plain HTTP out"),
    (RAY_WORKER, PUBLIC, 22, "TCP", False, "no other port out"),
    (RAY_WORKER, VPC, 443, "TCP", False, "not the VPC (other machines, the nodes)"),
    (RAY_HEAD, API_SERVER_PRIVATE, 443, "TCP", False, "not the control plane's private endpoint"),
    (RAY_WORKER, ELSEWHERE, 8080, "TCP", False, "not another namespace"),
    (STAGING, PUBLIC, 443, "TCP", True, "the Hub, PyPI, GCS, Secret Manager"),
    (STAGING, METADATA, 80, "TCP", True, "the token for Secret Manager and GCS"),
    (STAGING, ("pod", NS, RAY_HEAD), 8265, "TCP", False, "staging has no business with the Job API"),
    (STAGING, VPC, 443, "TCP", False, "not the VPC"),
    (SUPERVISOR, ("pod", NS, RAY_HEAD), 8265, "TCP", True, "the supervisor's Job API calls"),
    (SUPERVISOR, ("pod", NS, RAY_HEAD), 6379, "TCP", False, "only the Job API"),
    (SUPERVISOR, API_SERVER_PRIVATE, 443, "TCP", True, "the Kubernetes API (its record, the RayCluster)"),
    (SUPERVISOR, METADATA, 80, "TCP", True, "its Workload Identity token for the log copy"),
    (SUPERVISOR, PUBLIC, 443, "TCP", True, "the GCS JSON API: the runs' logs into logs/"),
    (OTHER, ("pod", NS, RAY_HEAD), 8265, "TCP", False, "nothing else reaches the Job API"),
    (OTHER, PUBLIC, 443, "TCP", False, "a pod nobody named may send nothing but DNS"),
    (OTHER, KUBE_DNS, 53, "TCP", True, "DNS"),
]


@pytest.mark.parametrize("source, dest, port, protocol, allowed, why", FLOWS, ids=[f[-1] for f in FLOWS])
def test_each_pod_of_the_namespace_reaches_only_what_it_needs(synth_stack: Any, source, dest, port: int,
                                                             protocol: str, allowed: bool, why: str) -> None:
    policies = _policies(synth_stack("a4-standard"))
    assert can_connect(policies, source, dest, port, protocol) is allowed, why


def test_the_namespace_denies_every_ingress_and_egress_by_default(synth_stack: Any) -> None:
    for stack in STACKS:
        policies = _policies(synth_stack(stack))
        deny = next(p for p in policies if p["metadata"]["name"] == "default-deny")
        assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}, stack
        for policy in policies:
            validate_core(policy)


def test_on_a4x_the_kuberay_operator_reaches_the_kubernetes_api_only(synth_stack: Any) -> None:
    policies = _policies(synth_stack("a4x"))
    operator = {"app.kubernetes.io/name": "kuberay-operator", "app.kubernetes.io/instance": "kuberay-operator"}
    assert can_connect(policies, operator, API_SERVER_PRIVATE, 443)
    assert not can_connect(policies, operator, METADATA, 80)
    assert not can_connect(policies, operator, ("pod", NS, RAY_HEAD | {"ray.io/cluster": "gb200-ray-cluster"}), 8265)


# --- the MLflow tracking server (verl-gke:mlflowTrackingUri): the Ray pods reach it on its port ----------------
# NetworkPolicy names addresses, not hosts: an IP literal admits that address only; a host name its port at every
# address and every pod (a Service of the cluster: Dataplane V2 matches pods by identity, not by ipBlock).

ANY_ADDRESS = [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"namespaceSelector": {}}]


@pytest.mark.parametrize("uri, to, port", [
    ("http://10.1.2.3:5000", [{"ipBlock": {"cidr": "10.1.2.3/32"}}], 5000),
    ("https://[fd00::7]/mlflow", [{"ipBlock": {"cidr": "fd00::7/128"}}], 443),
    ("http://mlflow.mlflow.svc.cluster.local", ANY_ADDRESS, 80),
    ("https://MLflow.corp.example:8443/", ANY_ADDRESS, 8443),
])
def test_the_ray_pods_alone_gain_one_rule_for_the_tracking_server(uri: str, to: list, port: int) -> None:
    def policies(**servers: Any) -> list[dict[str, Any]]:
        return namespace_policies(namespace=NS, cluster="b200-ray-cluster", staging=STAGING, supervisor=SUPERVISOR,
                                  **servers)
    default, with_server = policies(), policies(ray_servers=[uri])
    [ray] = [i for i, p in enumerate(default) if p["metadata"]["name"] == "b200-ray-cluster-egress"]
    assert with_server[ray]["spec"]["egress"] == [*default[ray]["spec"]["egress"],
                                                  {"to": to, "ports": [{"protocol": "TCP", "port": port}]}]
    assert with_server[:ray] + with_server[ray + 1:] == default[:ray] + default[ray + 1:]
    validate_core(with_server[ray])


def _with_mlflow(uri: str, *loggers: str) -> list[dict[str, Any]]:
    return _policies(synth.run("a4-standard", overrides={
        "verl-gke:verl": verl_value({"trainer.logger": list(loggers or ("console", "mlflow"))}),
        "verl-gke:mlflowTrackingUri": uri}))


def test_synth_lets_the_ray_pods_reach_an_mlflow_server_at_an_address_on_its_port_only() -> None:
    policies, server = _with_mlflow("http://10.1.2.3:5000"), ("ip", "10.1.2.3")
    assert can_connect(policies, RAY_WORKER, server, 5000) and can_connect(policies, RAY_HEAD, server, 5000)
    assert not can_connect(policies, RAY_WORKER, server, 5001)
    assert not can_connect(policies, RAY_WORKER, ("ip", "10.1.2.4"), 5000)
    assert not can_connect(policies, RAY_WORKER, PUBLIC, 5000)
    assert not can_connect(policies, STAGING, server, 5000) and not can_connect(policies, SUPERVISOR, server, 5000)


def test_synth_lets_the_ray_pods_reach_an_mlflow_host_on_its_port_wherever_it_resolves() -> None:
    policies = _with_mlflow("https://mlflow.corp.example")
    assert can_connect(policies, RAY_WORKER, KUBE_DNS, 53, "UDP"), "its name resolves through the cluster's DNS"
    assert can_connect(policies, RAY_WORKER, METADATA, 53, "UDP"), "or Cloud DNS for GKE"
    assert can_connect(policies, RAY_WORKER, VPC, 443), "an internal load balancer"
    assert can_connect(policies, RAY_HEAD, ("pod", "mlflow", {"app": "mlflow"}), 443), "a Service of the cluster"
    assert not can_connect(policies, RAY_WORKER, VPC, 5000) and not can_connect(policies, RAY_WORKER, PUBLIC, 80)
    assert not can_connect(policies, STAGING, VPC, 443)


def test_a_tracking_uri_the_job_does_not_log_to_admits_nothing(synth_stack: Any) -> None:
    assert _with_mlflow("http://10.1.2.3:5000", "console", "tensorboard") == _policies(synth_stack("a4-standard"))
