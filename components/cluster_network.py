"""The cluster's own VPC: not the project's `default` network, which an organization policy may skip,
which has MTU 1460 and no planned pod and service ranges. Cluster Toolkit's GKE GPU blueprints
(gke-a4, gke-a3-ultragpu, gke-a4x) create theirs the same way: one subnet with `pods` and `services`
secondary ranges, MTU 8896."""

from __future__ import annotations

from typing import TypedDict

import pulumi
from pulumi_gcp import compute

from components.children import child_options
from domain.network import VPC_MTU

PODS_RANGE = "pods"
SERVICES_RANGE = "services"


class ClusterNetworkArgs(TypedDict):
    project: str
    region: str
    """The cluster's region: its subnet lives there."""
    network: str
    """VPC name (domain.names: verl-<stack>-net)."""
    subnet: str
    node_cidr: str
    pod_cidr: str
    service_cidr: str


class ClusterNetwork(pulumi.ComponentResource):
    """A custom-mode VPC with jumbo MTU and one regional subnet with the pods and services ranges."""

    network: pulumi.Output[str]
    """The VPC's id (`projects/<p>/global/networks/<name>`), for the cluster and the router."""
    subnet: pulumi.Output[str]

    def __init__(self, name: str, args: ClusterNetworkArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("verl-gke:index:ClusterNetwork", name, {}, opts)
        child = child_options(self, opts)
        net = compute.Network(
            f"{name}-vpc", name=args["network"], project=args["project"], auto_create_subnetworks=False,
            routing_mode="REGIONAL", mtu=VPC_MTU, opts=child)
        sub = compute.Subnetwork(
            f"{name}-subnet", name=args["subnet"], project=args["project"], region=args["region"],
            network=net.id, ip_cidr_range=args["node_cidr"],
            # Private nodes reach Google APIs (GCS, Artifact Registry) without a public address.
            private_ip_google_access=True,
            secondary_ip_ranges=[
                {"range_name": PODS_RANGE, "ip_cidr_range": args["pod_cidr"]},
                {"range_name": SERVICES_RANGE, "ip_cidr_range": args["service_cidr"]},
            ],
            opts=child)
        self.network = net.id
        self.subnet = sub.id
        self.register_outputs({"network": self.network, "subnet": self.subnet})
