"""The Google APIs the program needs, enabled on the project (Cluster Toolkit's blueprints do the
same). Destroy leaves them on: the project, and whatever else uses its APIs, is the user's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

import pulumi
from pulumi_gcp import projects

from components.children import child_options


class ProjectApisArgs(TypedDict):
    project: str
    services: Sequence[str]
    """Service names such as container.googleapis.com."""


class ProjectApis(pulumi.ComponentResource):
    """One `projects.Service` per API; everything that calls an API waits for `services`."""

    services: list[projects.Service]

    def __init__(self, name: str, args: ProjectApisArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("verl-gke:index:ProjectApis", name, {}, opts)
        child = child_options(self, opts)
        self.services = [
            projects.Service(
                f"{name}-{service.split('.')[0]}", project=args["project"], service=service,
                # Never turn an API off on destroy, nor the services that depend on it.
                disable_on_destroy=False, disable_dependent_services=False, opts=child)
            for service in args["services"]
        ]
        self.register_outputs({})
