"""GKE versions: ordering, the floors the stack's features need, and the pick from a channel's offer.
Pure: the preflight passes in what the provider answered."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from domain.platforms import DRANET_MIN_GKE, Platform

_VERSION = re.compile(r"^1\.(\d+)(?:\.(\d+)(?:-gke\.(\d+))?)?$")


def is_version(text: str) -> bool:
    """`1.34`, `1.34.1` or `1.34.1-gke.1829001`."""
    return bool(_VERSION.match(text))


def version_key(version: str) -> tuple[int, int, int]:
    """`1.34.1-gke.1829001` -> (34, 1, 1829001); a bare minor sorts before its patches."""
    match = _VERSION.match(version)
    if not match:
        return (-1, -1, -1)
    minor, patch, build = (int(g) if g else -1 for g in match.groups())
    return (minor, patch, build)


def is_exact(version: str) -> bool:
    """A full GKE version (with its -gke. build), not a prefix."""
    return version_key(version)[2] >= 0


def floors(platform: Platform, dranet: bool) -> list[tuple[str, str]]:
    """(feature, lowest GKE version) for each feature of the stack that needs one."""
    out = []
    if platform.min_gke_version:
        out.append((f"{platform.title} (DRA resource.k8s.io/v1)", platform.min_gke_version))
    if dranet:
        out.append(("DRANET", DRANET_MIN_GKE))
    return out


def below_floor(version: str, floor: str) -> bool:
    """Whether every version `version` stands for is older than `floor` (`1.34` may still get a patch
    above it, `1.34.0` may not reach 1.34.1)."""
    given = [part for part in version_key(version) if part >= 0]
    return tuple(given) < version_key(floor)[:len(given)]


def choose(wanted: str, channel: str, needs: Sequence[tuple[str, str]], answer: Mapping[str, Any]) -> str | None:
    """The channel's default when it matches `wanted` (empty: anything) and every floor; else the
    lowest version between the default and the channel's latest that does; else None (a version
    below the default may no longer be in the channel)."""
    default = (answer.get("releaseChannelDefaultVersion") or {}).get(channel, "")
    latest = (answer.get("releaseChannelLatestVersion") or {}).get(channel, "")

    def fits(v: str) -> bool:
        matches = not wanted or v == wanted or v.startswith(f"{wanted}.") or v.startswith(f"{wanted}-")
        return (matches and version_key(v) <= version_key(latest)
                and all(version_key(v) >= version_key(floor) for _, floor in needs))

    offered = sorted({v for v in [*(answer.get("validMasterVersions") or []), default] if is_exact(v)},
                     key=version_key)
    fitting = [v for v in offered if fits(v)]
    if default in fitting:
        return default
    above = [v for v in fitting if version_key(v) > version_key(default)]
    return above[0] if above else None
