"""The tutorial's "Configure network mappings" and NCCL RDMA installer steps, on the cluster.

Pass the GKE cluster's Kubernetes provider in `opts` (`providers=[cluster.provider]`) and the GPU
node pool in `depends_on`: these objects then wait for the pool and are removed before it.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

import pulumi
import pulumi_kubernetes as k8s

from manifests.network_mapping import NetworkNames, network_mapping


class NetworkMappingArgs(TypedDict):
    nccl_installer_url: str
    """Raw URL of the installer manifest, pinned to a commit (manifests.nccl.installer_url) or the
    user's override."""
    networks: NotRequired[NetworkNames | None]
    """The gVNIC and RDMA VPCs the NICs are on; None (A4X with DRANET) creates no mapping objects,
    since GKE manages those interfaces itself."""


class NetworkMapping(pulumi.ComponentResource):
    """A GKENetworkParamSet + Network per extra NIC, and the NCCL RDMA installer DaemonSet."""

    def __init__(self, name: str, args: NetworkMappingArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("verl-gke:index:NetworkMapping", name, {}, opts)
        # Children don't inherit a component's depends_on: hand it down, so nothing is applied before
        # the GPU pool exists (and, on destroy, everything goes before it).
        waits_for = opts.depends_on if opts else None
        child = pulumi.ResourceOptions(parent=self, depends_on=waits_for)
        names = args.get("networks")
        param_set: k8s.apiextensions.CustomResource | None = None
        for obj in network_mapping(names) if names else []:
            kind, obj_name = obj["kind"], obj["metadata"]["name"]
            resource = k8s.apiextensions.CustomResource(
                f"{name}-{kind.lower()}-{obj_name}",
                api_version=obj["apiVersion"],
                kind=kind,
                metadata=obj["metadata"],
                spec=obj["spec"],
                # A Network refers to the param set just before it: create after it, delete before it.
                opts=child if kind == "GKENetworkParamSet" else child.merge(pulumi.ResourceOptions(depends_on=[param_set])),
            )
            if kind == "GKENetworkParamSet":
                param_set = resource
        k8s.yaml.v2.ConfigFile(f"{name}-nccl-rdma-installer", file=args["nccl_installer_url"], opts=child)
        self.register_outputs({})
