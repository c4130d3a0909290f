"""A Helm chart pinned to a version: what a Helm release is installed from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HelmChart:
    name: str
    repo: str
    version: str
