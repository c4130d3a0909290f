"""Outbound internet for private nodes: a Cloud Router with Cloud NAT on the cluster's network, so
nodes without public IPs still pull images from Docker Hub and models from the Hugging Face Hub."""

from __future__ import annotations

from typing import TypedDict

import pulumi
from pulumi_gcp import compute

from components.children import child_options

CLUSTER_NETWORK = "default"
"""The VPC of the cluster's primary NICs: the cluster names no network, so GKE uses `default`."""


class CloudNatArgs(TypedDict):
    project: str
    region: str
    """The nodes' region: a router and its NAT serve one region."""
    name: str
    """Prefix of the router and NAT names (the cluster name), unique per project and region."""


class CloudNat(pulumi.ComponentResource):
    """A Cloud Router and a NAT gateway with Google-allocated addresses for every subnet range of the
    cluster's network in the region, logging translation errors only."""

    def __init__(self, name: str, args: CloudNatArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("verl-gke:index:CloudNat", name, {}, opts)
        child = child_options(self, opts)
        router = compute.Router(
            f"{name}-router", name=f"{args['name']}-router", project=args["project"], region=args["region"],
            network=CLUSTER_NETWORK, opts=child)
        compute.RouterNat(
            f"{name}-nat", name=f"{args['name']}-nat", project=args["project"], region=args["region"],
            router=router.name,
            nat_ip_allocate_option="AUTO_ONLY",
            source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES",
            log_config={"enable": True, "filter": "ERRORS_ONLY"},
            opts=child)
        self.register_outputs({})
