"""Outbound internet for private nodes: a Cloud Router with Cloud NAT on the cluster's network, so
nodes without public IPs still pull images from Docker Hub and models from the Hugging Face Hub."""

from __future__ import annotations

from typing import TypedDict

import pulumi
from pulumi_gcp import compute

from components.children import child_options
from domain.network import MAX_PORTS_PER_VM, MIN_PORTS_PER_VM


class CloudNatArgs(TypedDict):
    project: str
    region: str
    """The nodes' region: a router and its NAT serve one region."""
    network: pulumi.Input[str]
    """The cluster's VPC (ClusterNetwork.network), or the name of an existing one (clusterNetwork)."""
    router: str
    """Router name, unique per project and region (domain.names)."""
    nat: str


class CloudNat(pulumi.ComponentResource):
    """A Cloud Router and a NAT gateway with Google-allocated addresses for every subnet range of the
    cluster's network in the region, with dynamic port allocation, logging translation errors only."""

    def __init__(self, name: str, args: CloudNatArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("verl-gke:index:CloudNat", name, {}, opts)
        child = child_options(self, opts)
        router = compute.Router(
            f"{name}-router", name=args["router"], project=args["project"], region=args["region"],
            network=args["network"], opts=child)
        compute.RouterNat(
            f"{name}-nat", name=args["nat"], project=args["project"], region=args["region"],
            router=router.name,
            # AUTO_ONLY: GCP adds addresses as the VMs' port demand grows.
            nat_ip_allocate_option="AUTO_ONLY",
            source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES",
            enable_dynamic_port_allocation=True,
            enable_endpoint_independent_mapping=False,
            min_ports_per_vm=MIN_PORTS_PER_VM,
            max_ports_per_vm=MAX_PORTS_PER_VM,
            log_config={"enable": True, "filter": "ERRORS_ONLY"},
            opts=child)
        self.register_outputs({})
