"""How a component registers its children: the options they share, and custom objects from the
manifest builders' dicts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi
import pulumi_kubernetes as k8s


def child_options(component: pulumi.Resource, opts: pulumi.ResourceOptions | None) -> pulumi.ResourceOptions:
    """Parented to `component` and waiting for what it was told to wait for: children don't inherit
    a component's depends_on, so they would otherwise be created before it (and destroyed after)."""
    return pulumi.ResourceOptions(parent=component, depends_on=opts.depends_on if opts else None)


def custom_resource(resource_name: str, obj: Mapping[str, Any],
                    opts: pulumi.ResourceOptions) -> k8s.apiextensions.CustomResource:
    """A custom object (apiVersion, kind, metadata, spec) exactly as a manifests builder made it.

    Its name is fixed: a replacement deletes it first, also where its own diff does not decide
    (a replaced provider, `pulumi up --replace`), which would otherwise create it beside itself."""
    return k8s.apiextensions.CustomResource(
        resource_name,
        api_version=obj["apiVersion"],
        kind=obj["kind"],
        metadata=obj["metadata"],
        spec=obj["spec"],
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(delete_before_replace=True)),
    )
