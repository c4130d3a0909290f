"""The tutorial's network-mapping.yaml: one GKENetworkParamSet + Network pair per extra NIC.

Pods name these Networks in their `networking.gke.io/interfaces` annotation (`gvnic-1`,
`rdma-0` ...), and each pair points GKE at the VPC and subnet the NIC is attached to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

API_VERSION = "networking.gke.io/v1"
GVNIC_NETWORK = "gvnic-1"
RDMA_NETWORK_PREFIX = "rdma-"

DeviceMode = Literal["NetDevice", "RDMA"]


@dataclass(frozen=True)
class NetworkNames:
    """GCP names of the gVNIC VPC and the RDMA VPC, derived from prefixes as the tutorial does.
    (domain.config checks the prefixes and the NIC count.)"""

    gvnic_prefix: str
    rdma_prefix: str
    rdma_nics: int

    @property
    def gvnic_network(self) -> str:
        return f"{self.gvnic_prefix}-net"

    @property
    def gvnic_subnet(self) -> str:
        return f"{self.gvnic_prefix}-sub"

    @property
    def gvnic_firewall(self) -> str:
        return f"{self.gvnic_prefix}-internal"

    @property
    def rdma_network(self) -> str:
        return f"{self.rdma_prefix}-net"

    @property
    def rdma_subnets(self) -> tuple[str, ...]:
        """`<rdma prefix>-sub-0` ... `<rdma prefix>-sub-<N-1>`, one per RDMA NIC."""
        return tuple(f"{self.rdma_prefix}-sub-{n}" for n in range(self.rdma_nics))


def rdma_network_name(index: int) -> str:
    """Kubernetes name of the Network for RDMA NIC `index` (`rdma-0` ...)."""
    return f"{RDMA_NETWORK_PREFIX}{index}"


def param_set(*, name: str, vpc: str, vpc_subnet: str, device_mode: DeviceMode) -> dict[str, Any]:
    """A GKENetworkParamSet binding a device NIC to a VPC and subnet."""
    return {
        "apiVersion": API_VERSION,
        "kind": "GKENetworkParamSet",
        "metadata": {"name": name},
        "spec": {"vpc": vpc, "vpcSubnet": vpc_subnet, "deviceMode": device_mode},
    }


def network(*, name: str) -> dict[str, Any]:
    """A Device Network whose parameters come from the GKENetworkParamSet of the same name."""
    return {
        "apiVersion": API_VERSION,
        "kind": "Network",
        "metadata": {"name": name},
        "spec": {
            "type": "Device",
            "parametersRef": {"group": "networking.gke.io", "kind": "GKENetworkParamSet", "name": name},
        },
    }


def network_mapping(names: NetworkNames) -> list[dict[str, Any]]:
    """Every object of network-mapping.yaml, in its order: gvnic-1, then rdma-0 ... rdma-<N-1>,
    each as a GKENetworkParamSet followed by its Network."""
    pairs: list[tuple[str, str, str, DeviceMode]] = [
        (GVNIC_NETWORK, names.gvnic_network, names.gvnic_subnet, "NetDevice"),
        *((rdma_network_name(n), names.rdma_network, subnet, "RDMA") for n, subnet in enumerate(names.rdma_subnets)),
    ]
    objects: list[dict[str, Any]] = []
    for name, vpc, subnet, mode in pairs:
        objects.append(param_set(name=name, vpc=vpc, vpc_subnet=subnet, device_mode=mode))
        objects.append(network(name=name))
    return objects
