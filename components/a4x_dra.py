"""The tutorial's A4X DRA steps: the NVIDIA DRA driver (for the IMEX ComputeDomain), the RDMA NIC
claim template and the ComputeDomain the Ray workers claim their channel from.

Pass the cluster's Kubernetes provider in `opts` (`providers=[cluster.provider]`) and the owner of
the Ray namespace in `depends_on` (none of it needs a GPU node); give the RayCluster `depends_on=[this]`, so its pods only start once their
claims can be satisfied (and on destroy go before the driver that releases them).
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

import pulumi
import pulumi_kubernetes as k8s

from components.children import child_options, custom_resource
from components.helm_release import pinned_release
from components.pinned_image import pinned_ref
from domain.platforms import PLATFORMS
from manifests import dra
from manifests.helm import image_values


class A4xDraArgs(TypedDict):
    namespace: str
    """Namespace of the Ray cluster: the claim template and the ComputeDomain live beside its pods."""
    gpu_nodes: int
    """A4X nodes the ComputeDomain spans (one Ray worker each)."""
    nic_claims: NotRequired[bool]
    """Create the RDMA NIC ResourceClaimTemplate (A4X with DRANET, the tutorial's path); default True."""


class A4xDra(pulumi.ComponentResource):
    """Namespace + quota + Helm release of the NVIDIA DRA driver, the NIC claim template, the ComputeDomain."""

    def __init__(self, name: str, args: A4xDraArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("verl-gke:index:A4xDra", name, {}, opts)
        child = child_options(self, opts)

        def after(*resources: pulumi.Resource) -> pulumi.ResourceOptions:
            return child.merge(pulumi.ResourceOptions(depends_on=list(resources)))

        namespace = k8s.core.v1.Namespace(f"{name}-namespace", metadata=dra.namespace()["metadata"], opts=child)
        quota_obj = dra.resource_quota(gpu_nodes=args["gpu_nodes"])
        # GKE admits the driver's system-critical pods only where such a quota exists.
        quota = k8s.core.v1.ResourceQuota(
            f"{name}-quota", metadata=quota_obj["metadata"], spec=quota_obj["spec"], opts=after(namespace)
        )
        facts = PLATFORMS["a4x"]
        # Its digest needs nothing of the cluster, so it waits for nothing.
        image = pulumi.Output.from_input(pinned_ref(f"{name}-driver-image", dra.CHART.image,
                                                    pulumi.ResourceOptions(parent=self)))
        driver = pinned_release(f"{name}-driver", dra.CHART, namespace=dra.NAMESPACE,
                                values=dra.helm_values(accelerator=facts.accelerator, arch=facts.arch,
                                                       image=image.apply(image_values)),
                                opts=after(quota))
        if args.get("nic_claims", True):
            template = dra.rdma_claim_template(namespace=args["namespace"])
            k8s.resource.v1.ResourceClaimTemplate(
                f"{name}-rdma-nic", metadata=template["metadata"], spec=template["spec"], opts=child
            )
        custom_resource(
            f"{name}-compute-domain",
            dra.compute_domain(namespace=args["namespace"], gpu_nodes=args["gpu_nodes"]),
            # The driver's chart brings the CRD. The spec is immutable, so a new
            # node count replaces the domain instead of failing as an update.
            opts=after(driver).merge(pulumi.ResourceOptions(replace_on_changes=["spec"], delete_before_replace=True)),
        )
        self.register_outputs({})
