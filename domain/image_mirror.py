"""Docker Hub images through an Artifact Registry remote repository of the stack.

GKE streams only images in Artifact Registry (image streaming: containers start before the whole
image is on the node); a remote repository with Docker Hub upstream serves `verlai/verl` from the
stack's region, fetched from Docker Hub once and cached, instead of every GPU node pulling ~20 GB
from Docker Hub through the NAT.
"""

from __future__ import annotations

MIRROR_APIS = ("artifactregistry.googleapis.com", "containerfilesystem.googleapis.com")
"""Artifact Registry, and the API GKE image streaming reads images through."""
READER_ROLE = "roles/artifactregistry.reader"
_DOCKER_HUB_HOSTS = ("docker.io", "index.docker.io", "registry-1.docker.io")


def repository_id(cluster_name: str) -> str:
    """The stack's remote repository (cluster names are unique per project and valid repo ids)."""
    return f"{cluster_name}-docker-hub"


def registry_prefix(region: str, project: str, repository: str) -> str:
    return f"{region}-docker.pkg.dev/{project}/{repository}"


def is_docker_hub(image: str) -> bool:
    """A reference Docker resolves on Docker Hub: no registry host, or Docker Hub's own."""
    first, _, rest = image.partition("/")
    if not rest:
        return True
    if first in _DOCKER_HUB_HOSTS:
        return True
    return "." not in first and ":" not in first and first != "localhost"


def docker_hub_path(image: str) -> str:
    """A Docker Hub image's path on Docker Hub's registry, tag or digest kept: `docker.io/verlai/verl:1`
    -> `verlai/verl:1`; an official image (`ubuntu:24.04`) is `library/ubuntu:24.04` there."""
    first, _, rest = image.partition("/")
    path = rest if first in _DOCKER_HUB_HOSTS else image
    return path if "/" in path else f"library/{path}"


def mirrored(image: str, prefix: str) -> str:
    """`image` (a tag or a digest) through the remote repository at `prefix`; unchanged when it is
    not a Docker Hub image. `verlai/verl@sha256:...` -> `<prefix>/verlai/verl@sha256:...`."""
    if not is_docker_hub(image):
        return image
    return f"{prefix}/{docker_hub_path(image)}"
