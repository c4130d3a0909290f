"""The tutorial's "Create an RDMA network and subnets": a gVNIC VPC and a RoCE VPC for the GPU NICs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

import pulumi
from pulumi_gcp import compute

from components.children import child_options
from components.gpu_node_pool import NodeNetwork
from domain.network import VPC_MTU
from manifests.network_mapping import NetworkNames



class RdmaNetworkArgs(TypedDict):
    project: str
    """Project that owns both VPCs (and the zone's RoCE network profile)."""
    region: str
    """Region of the subnets: the cluster's control-plane region."""
    zone: str
    """Zone of the GPU nodes; the RoCE network profile is per zone (`<zone>-vpc-roce`)."""
    names: NetworkNames
    """Prefixes and RDMA NIC count: `<gvnic>-net`, `<gvnic>-sub`, `<rdma>-net`, `<rdma>-sub-N`."""
    gvnic_cidr: str
    """Range of the gVNIC subnet (tutorial: 192.168.0.0/24), also the only source its firewall rule admits."""
    rdma_cidrs: Sequence[str]
    """One subnet range per RDMA NIC, in NIC order (tutorial: 192.168.1.0/24 ... 192.168.8.0/24).
    domain.config checks they are valid and disjoint."""


class RdmaNetwork(pulumi.ComponentResource):
    """A gVNIC VPC with one subnet and a firewall rule admitting that subnet, and a RoCE VPC with one subnet
    per RDMA NIC, named as the tutorial's gcloud commands name them."""

    node_networks: pulumi.Output[list[NodeNetwork]]
    """`{network, subnetwork}` names for a node pool's additional networks: gVNIC first, then RDMA 0..N-1."""

    def __init__(self, name: str, args: RdmaNetworkArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("verl-gke:index:RdmaNetwork", name, {}, opts)
        names = args["names"]
        if len(args["rdma_cidrs"]) != names.rdma_nics:
            raise ValueError(
                f"RdmaNetwork: rdma_cidrs has {len(args['rdma_cidrs'])} ranges: needs one per RDMA NIC ({names.rdma_nics})"
            )
        project, region = args["project"], args["region"]
        # Names are fixed (the network mapping refers to them), so a replacement must delete first.
        child = child_options(self, opts).merge(pulumi.ResourceOptions(delete_before_replace=True))

        def subnet(logical: str, subnet_name: str, network: compute.Network, cidr: str) -> compute.Subnetwork:
            return compute.Subnetwork(
                f"{name}-{logical}", name=subnet_name, project=project, region=region,
                network=network.id, ip_cidr_range=cidr, opts=child,
            )

        gvnic_net = compute.Network(
            f"{name}-gvnic-net", name=names.gvnic_network, project=project, auto_create_subnetworks=False,
            mtu=VPC_MTU, opts=child,
        )
        gvnic_sub = subnet("gvnic-sub", names.gvnic_subnet, gvnic_net, args["gvnic_cidr"])
        compute.Firewall(
            f"{name}-gvnic-internal",
            name=names.gvnic_firewall,
            project=project,
            network=gvnic_net.id,
            direction="INGRESS",
            allows=[
                compute.FirewallAllowArgs(protocol="tcp", ports=["0-65535"]),
                compute.FirewallAllowArgs(protocol="udp", ports=["0-65535"]),
                compute.FirewallAllowArgs(protocol="icmp"),
            ],
            # Only the gVNIC subnet's own NICs (the tutorial admits 192.168.0.0/16).
            source_ranges=[args["gvnic_cidr"]],
            opts=child,
        )

        rdma_net = compute.Network(
            f"{name}-rdma-net",
            name=names.rdma_network,
            project=project,
            auto_create_subnetworks=False,
            mtu=VPC_MTU,
            network_profile=f"projects/{project}/global/networkProfiles/{args['zone']}-vpc-roce",
            opts=child,
        )
        rdma_subs = [
            subnet(f"rdma-sub-{n}", subnet_name, rdma_net, cidr)
            for n, (subnet_name, cidr) in enumerate(zip(names.rdma_subnets, args["rdma_cidrs"], strict=True))
        ]

        self.node_networks = pulumi.Output.all(
            pulumi.Output.all(network=gvnic_net.name, subnetwork=gvnic_sub.name),
            *(pulumi.Output.all(network=rdma_net.name, subnetwork=s.name) for s in rdma_subs),
        )
        self.register_outputs({"node_networks": self.node_networks})
