"""What the stack's namespace admits before any of its pods starts: the Pod Security admission policy
(manifests/pod_security.py: Baseline, and the GPU workers' two named exceptions) and the namespace's
NetworkPolicies (manifests/network_policy.py: default deny, DNS, and the egress each workload needs).

Pass the cluster's Kubernetes provider in `opts.providers` and the namespace's owner (the storage) in
`opts.depends_on`; whatever starts pods in the namespace (staging, the RayCluster, the run supervisor)
should depend on this component.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NotRequired, TypedDict

import pulumi
import pulumi_kubernetes as k8s

from components.children import child_options
from manifests import network_policy, pod_security
from manifests.ray_cluster import WORKER_GROUP


class NamespaceSecurityArgs(TypedDict):
    namespace: str
    ray_cluster: str
    """The RayCluster whose GPU worker group gets the named exceptions, and whose pods the policies name."""
    staging_labels: Mapping[str, str]
    """Labels of the staging Job's pods."""
    supervisor_labels: NotRequired[Mapping[str, str] | None]
    """Labels of the run supervisor's pod, if the stack runs one."""
    kuberay_operator: NotRequired[bool]
    """The namespace holds the KubeRay operator (its Helm chart, A4X)."""
    staging_writes_secret: NotRequired[bool]
    """Staging reaches the Kubernetes API (it writes wandb's key Secret). Default False."""
    ray_servers: NotRequired[Sequence[str]]
    """http(s) URLs the Ray pods reach on their ports (the MLflow tracking server)."""
    network_policies: NotRequired[bool]
    """Default deny and the allows (default True; rayNetworkPolicy)."""


class NamespaceSecurity(pulumi.ComponentResource):
    """The Pod Security admission policy and binding; the namespace's NetworkPolicies."""

    def __init__(self, name: str, args: NamespaceSecurityArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("verl-gke:index:NamespaceSecurity", name, {}, opts)
        child = child_options(self, opts)
        ns = args["namespace"]
        policy = pod_security.admission_policy(namespace=ns, ray_cluster=args["ray_cluster"], worker_group=WORKER_GROUP)
        admission = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            f"{name}-pod-security", metadata=policy["metadata"], spec=policy["spec"], opts=child)
        binding = pod_security.admission_policy_binding(namespace=ns)
        k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            f"{name}-pod-security-binding", metadata=binding["metadata"], spec=binding["spec"],
            opts=child.merge(pulumi.ResourceOptions(depends_on=[admission])))
        if args.get("network_policies", True):
            for obj in network_policy.namespace_policies(
                    namespace=ns, cluster=args["ray_cluster"], staging=args["staging_labels"],
                    supervisor=args.get("supervisor_labels"), kuberay_operator=args.get("kuberay_operator", False),
                    staging_writes_secret=args.get("staging_writes_secret", False),
                    ray_servers=args.get("ray_servers", ())):
                k8s.networking.v1.NetworkPolicy(f"{name}-{obj['metadata']['name']}", metadata=obj["metadata"],
                                                spec=obj["spec"], opts=child)
        self.register_outputs({})
