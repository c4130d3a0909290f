"""A4X DRA objects: the NVIDIA DRA driver's namespace, quota and Helm values, the RDMA NIC
ResourceClaimTemplate and the IMEX ComputeDomain (tutorial-ja, A4X: "compute-domain-a4x.yaml"
and the `helm upgrade --install nvidia-dra-driver-gpu` step)."""

from __future__ import annotations

from typing import Any

from manifests.helm import HelmChart
from manifests.storage import POD_SECURITY_VERSION

NAMESPACE = "nvidia-dra-driver-gpu"
QUOTA_NAME = "nvidia-dra-driver-gpu-quota"

# The tutorial installs 25.3.1; 25.3.2 is the 25.3.x patch whose ComputeDomain CRD is the one
# the manifests are validated against (tests/k8s_schema.py), so chart and checks agree.
CHART = HelmChart(name="nvidia-dra-driver-gpu", repo="https://helm.ngc.nvidia.com/nvidia", version="25.3.2",
                  image="nvcr.io/nvidia/k8s-dra-driver-gpu:v25.3.2",
                  url="https://helm.ngc.nvidia.com/nvidia/charts/nvidia-dra-driver-gpu-25.3.2.tgz")
"""Its one image runs the controller, the kubelet plugin and the IMEX daemons it starts (the chart's
`fullimage`, also their IMAGE_NAME)."""

# GKE installs the NVIDIA driver under this host path, not at `/` as the chart assumes.
NVIDIA_DRIVER_ROOT = "/home/kubernetes/bin/nvidia"

RDMA_DEVICE_CLASS = "mrdma.google.com"
RDMA_CLAIM_TEMPLATE = "verl-rdma-nic"
COMPUTE_DOMAIN = "verl-compute-domain"
CHANNEL_CLAIM_TEMPLATE = "verl-compute-domain-channel"
"""Created by the DRA driver from the ComputeDomain; worker pods claim their IMEX channel from it."""


def _check_nodes(gpu_nodes: int) -> None:
    if isinstance(gpu_nodes, bool) or not isinstance(gpu_nodes, int) or gpu_nodes < 1:
        raise ValueError(f"gpu_nodes = {gpu_nodes!r}: must be a whole number of A4X nodes, at least 1")


def namespace(name: str = NAMESPACE) -> dict[str, Any]:
    """The namespace the DRA driver runs in: Pod Security `privileged`, the strictest level its pods
    allow (the kubelet plugin is privileged and mounts the host's plugin and device paths)."""
    labels = {"pod-security.kubernetes.io/enforce": "privileged",
              "pod-security.kubernetes.io/enforce-version": POD_SECURITY_VERSION}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def resource_quota(*, gpu_nodes: int, namespace: str = NAMESPACE) -> dict[str, Any]:
    """Lets the driver's system-critical pods in: GKE only admits pods of the system priority
    classes outside kube-system where a quota covers them. One kubelet-plugin and one IMEX daemon
    per node plus the controller: 2 x nodes + 1."""
    _check_nodes(gpu_nodes)
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": QUOTA_NAME, "namespace": namespace},
        "spec": {
            "hard": {"pods": str(2 * gpu_nodes + 1)},
            "scopeSelector": {
                "matchExpressions": [
                    {
                        "operator": "In",
                        "scopeName": "PriorityClass",
                        "values": ["system-node-critical", "system-cluster-critical"],
                    }
                ]
            },
        },
    }


# GKE's node labels: the accelerator type on GPU nodes, the CPU architecture on every node.
ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
ARCH_LABEL = "kubernetes.io/arch"


def node_affinity(*expressions: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": list(expressions)}]}}}


def helm_values(*, accelerator: str, arch: str, image: Any) -> dict[str, Any]:
    """The tutorial's `--set` values (GKE's driver root, ComputeDomains only: GPUs stay with GKE's
    device plugin, a kubelet plugin that tolerates the GPU and arm64 taints), and affinities that
    match GKE nodes. The chart's defaults want a control-plane node (GKE shows none) and NFD or
    `nvidia.com/gpu.present` labels (GKE sets neither), so both would stay Pending: as GKE's A4X
    guide does, the controller runs off the GPU nodes and the kubelet plugin on the `accelerator`
    nodes of `arch`. `image`: the chart's image values, by digest (helm.image_values)."""
    return {
        "image": image,
        "nvidiaDriverRoot": NVIDIA_DRIVER_ROOT,
        "resources": {"gpus": {"enabled": False}},
        "controller": {
            "tolerations": [],
            "affinity": node_affinity({"key": ACCELERATOR_LABEL, "operator": "DoesNotExist"}),
        },
        "kubeletPlugin": {
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists"},
                {"key": "kubernetes.io/arch", "operator": "Exists"},
            ],
            "affinity": node_affinity({"key": ACCELERATOR_LABEL, "operator": "In", "values": [accelerator]},
                                  {"key": ARCH_LABEL, "operator": "In", "values": [arch]}),
        },
    }


def rdma_claim_template(*, namespace: str, name: str = RDMA_CLAIM_TEMPLATE) -> dict[str, Any]:
    """One RDMA NIC per claim; each A4X worker claims all four rails."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "nic",
                            "exactly": {
                                "deviceClassName": RDMA_DEVICE_CLASS,
                                "allocationMode": "ExactCount",
                                "count": 1,
                            },
                        }
                    ]
                }
            }
        },
    }


def compute_domain(
    *,
    namespace: str,
    gpu_nodes: int,
    name: str = COMPUTE_DOMAIN,
    channel_template: str = CHANNEL_CLAIM_TEMPLATE,
) -> dict[str, Any]:
    """The IMEX domain spanning every GPU node, for multi-node NVLink (its spec is immutable)."""
    _check_nodes(gpu_nodes)
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"numNodes": gpu_nodes, "channel": {"resourceClaimTemplate": {"name": channel_template}}},
    }
