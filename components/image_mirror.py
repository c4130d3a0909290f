"""The stack's Artifact Registry remote repository of Docker Hub, readable by the nodes.

Pass the project APIs (domain.image_mirror.MIRROR_APIS enabled) in `opts.depends_on`; give the
RayCluster `depends_on=[this]`, so its pods pull only once the nodes may read the repository.
"""

from __future__ import annotations

from typing import TypedDict

import pulumi
from pulumi_gcp import artifactregistry

from components.children import child_options
from domain.image_mirror import READER_ROLE


class ImageMirrorArgs(TypedDict):
    project: str
    region: str
    """Where the repository lives: the nodes' region, so pulls stay in it."""
    repository_id: str
    reader: pulumi.Input[str]
    """IAM member that pulls (the nodes' service account, `serviceAccount:<email>`)."""


class ImageMirror(pulumi.ComponentResource):
    """A REMOTE_REPOSITORY Docker repository with Docker Hub upstream and the nodes' reader binding."""

    def __init__(self, name: str, args: ImageMirrorArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("verl-gke:index:ImageMirror", name, {}, opts)
        child = child_options(self, opts)
        repository = artifactregistry.Repository(
            f"{name}-repository",
            project=args["project"],
            location=args["region"],
            repository_id=args["repository_id"],
            format="DOCKER",
            mode="REMOTE_REPOSITORY",
            description="Docker Hub through Artifact Registry, for GKE image streaming (verl-gke)",
            remote_repository_config=artifactregistry.RepositoryRemoteRepositoryConfigArgs(
                description="Docker Hub",
                docker_repository=artifactregistry.RepositoryRemoteRepositoryConfigDockerRepositoryArgs(
                    public_repository="DOCKER_HUB"),
            ),
            opts=child,
        )
        artifactregistry.RepositoryIamMember(
            f"{name}-node-reader",
            project=args["project"],
            location=args["region"],
            repository=repository.repository_id,
            role=READER_ROLE,
            member=args["reader"],
            opts=child,
        )
        self.register_outputs({})
