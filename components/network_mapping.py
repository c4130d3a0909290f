"""The tutorial's "Configure network mappings" and NCCL RDMA installer steps, on the cluster.

Pass the GKE cluster's Kubernetes provider in `opts` (`providers=[cluster.provider]`) and the GPU
node pool in `depends_on`: these objects then wait for the pool and are removed before it.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

import pulumi
import pulumi_kubernetes as k8s

from components.children import child_options, custom_resource
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
        # Nothing is applied before the GPU pool exists (and, on destroy, everything goes before it).
        child = child_options(self, opts)
        names = args.get("networks")
        objects = network_mapping(names) if names else []

        def resource_name(obj: dict[str, Any]) -> str:
            return f"{name}-{obj['kind'].lower()}-{obj['metadata']['name']}"

        for param_set_obj, network_obj in zip(objects[::2], objects[1::2], strict=True):
            param_set = custom_resource(resource_name(param_set_obj), param_set_obj, child)
            # The Network refers to its param set: create it after, delete it before.
            custom_resource(resource_name(network_obj), network_obj,
                            child.merge(pulumi.ResourceOptions(depends_on=[param_set])))
        k8s.yaml.v2.ConfigFile(f"{name}-nccl-rdma-installer", file=args["nccl_installer_url"], opts=child)
        self.register_outputs({})
