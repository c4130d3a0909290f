"""A Helm chart pinned to a version, installed from its archive only if that archive's sha256 is pinned."""

from __future__ import annotations

import shlex
from dataclasses import dataclass


@dataclass(frozen=True)
class HelmChart:
    name: str
    repo: str
    version: str
    image: str
    """The image the chart's pods run (`name:tag`, the chart version's own), set through its values by digest."""
    url: str
    """The version's archive, as the repository's index.yaml names it (`urls`)."""

    @property
    def key(self) -> str:
        """`name:version`, the chart's key in `verl-gke:chartDigests`."""
        return f"{self.name}:{self.version}"

    @property
    def archive(self) -> str:
        return self.url.rpartition("/")[2]

    def pin_command(self, digest: str, stack: str = "") -> str:
        return pin_command(self.key, digest, stack)


def pin_command(key: str, digest: str, stack: str = "") -> str:
    """The `pulumi config set` that keeps `digest` as the stack's pin of chart `key` (name:version)."""
    return shlex.join(["pulumi", "config", "set", *(["--stack", stack] if stack else []), "--path",
                       f'verl-gke:chartDigests["{key}"]', digest])


def image_values(ref: str) -> dict[str, str]:
    """`name:tag@sha256:...` as a chart's `image` values: the repository, and a tag that carries the digest,
    which the charts join as `<repository>:<tag>`, a reference a runtime pulls by its digest."""
    name, _, tag = ref.partition("@")[0].rpartition(":")
    return {"repository": name, "tag": ref[len(name) + 1:]}
