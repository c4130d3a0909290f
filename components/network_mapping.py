"""The tutorial's "Configure network mappings" and NCCL RDMA installer steps, on the cluster.

Pass the GKE cluster's Kubernetes provider in `opts` (`providers=[cluster.provider]`) and the GPU
node pool in `depends_on`: these objects then wait for the pool and are removed before it.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict, cast

import pulumi
import pulumi_kubernetes as k8s

from components.children import child_options, custom_resource
from components.pinned_image import pinned_ref
from domain.platforms import Platform
from manifests.nccl import NAME, NAMESPACE, installer_daemonset
from manifests.network_mapping import NetworkNames, network_mapping


class NetworkMappingArgs(TypedDict):
    platform: Platform
    """Whose NCCL RDMA installer DaemonSet is built here, its image pinned by digest at the first up."""
    nccl_installer_url: NotRequired[str | None]
    """A manifest applied as is instead: Google's Autopilot installer pinned to a commit
    (manifests.nccl.installer_url) or the user's override."""
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
        installer = f"{name}-nccl-rdma-installer"
        if url := args.get("nccl_installer_url"):
            k8s.yaml.v2.ConfigFile(installer, file=url, opts=child)
        else:
            # The digest needs nothing of the cluster, so it waits for nothing.
            image = pinned_ref(f"{name}-nccl-installer-image", args["platform"].nccl_installer_image,
                               pulumi.ResourceOptions(parent=self))
            # The builder only places the pinned ref (resolved by the engine).
            daemonset = installer_daemonset(args["platform"], cast(str, image))
            k8s.apps.v1.DaemonSet(installer, metadata=daemonset["metadata"], spec=daemonset["spec"],
                                  opts=child.merge(pulumi.ResourceOptions(aliases=[_applied_from_url(self, installer)])))
        self.register_outputs({})


def _applied_from_url(mapping: NetworkMapping, installer: str) -> pulumi.Alias:
    """The same DaemonSet as verl-gke <= 0.4.0 applied it: a child of a yaml/v2 ConfigFile named like
    this resource, which names its children `<ConfigFile>:<namespace>/<name>` (pulumi-kubernetes
    provider/pkg/provider/yaml/v2/yaml.go, Register). With this alias an upgrade updates the object in
    place; without it Pulumi would create a second resource for the same object and then delete it
    with the old ConfigFile."""
    config_file = pulumi.create_urn(installer, "kubernetes:yaml/v2:ConfigFile", parent=mapping)
    return pulumi.Alias(name=f"{installer}:{NAMESPACE}/{NAME}", parent=config_file)
