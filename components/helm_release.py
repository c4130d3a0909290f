"""One way to install a pinned Helm chart: a `helm.v3.Release` named after the chart."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from manifests.helm import HelmChart


def pinned_release(resource_name: str, chart: HelmChart, *, namespace: str, values: dict[str, Any],
                   opts: pulumi.ResourceOptions) -> k8s.helm.v3.Release:
    """The chart at its pinned version, from its repository, as release `chart.name` in `namespace`.

    The release name is fixed and helm_release.go's diff never deletes first: a replacement does."""
    return k8s.helm.v3.Release(
        resource_name,
        name=chart.name,
        chart=chart.name,
        version=chart.version,
        repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=chart.repo),
        namespace=namespace,
        values=values,
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(delete_before_replace=True)),
    )
