"""The custom ComputeClass that orders the GPU workers' capacity kinds (manifests.compute_class).

Pass the cluster's Kubernetes provider in `opts` and, on Standard, the GPU node pools it names in
`depends_on`; the RayCluster waits for it, so its workers never select a class that does not exist.
"""

from __future__ import annotations

from typing import TypedDict

import pulumi

from components.children import child_options, custom_resource


class GpuComputeClassArgs(TypedDict):
    manifest: dict
    """The ComputeClass object (manifests.compute_class.compute_class)."""


class GpuComputeClass(pulumi.ComponentResource):
    """One cluster-scoped ComputeClass; GKE's autoscaler reads its priorities."""

    name: str

    def __init__(self, name: str, args: GpuComputeClassArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("verl-gke:index:GpuComputeClass", name, {}, opts)
        manifest = args["manifest"]
        custom_resource(f"{name}-class", manifest, opts=child_options(self, opts))
        self.name = manifest["metadata"]["name"]
        self.register_outputs({})
