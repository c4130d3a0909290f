"""A Helm chart pinned to a version: what a Helm release is installed from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HelmChart:
    name: str
    repo: str
    version: str
    image: str
    """The image the chart's pods run (`name:tag`, the chart version's own), set through its values by digest."""


def image_values(ref: str) -> dict[str, str]:
    """`name:tag@sha256:...` as a chart's `image` values: the repository, and a tag that carries the digest,
    which the charts join as `<repository>:<tag>`, a reference a runtime pulls by its digest."""
    name, _, tag = ref.partition("@")[0].rpartition(":")
    return {"repository": name, "tag": ref[len(name) + 1:]}
