"""UpgradeExclusionStart: the default start of the cluster's maintenance exclusion, its first `pulumi up`.

A start taken from the clock on every run would move the exclusion at every `pulumi up` (an update of
the cluster each time) and never let it end; a fixed date runs out (domain/upgrade_exclusion.py). This
resource reads the clock once, in `create`, on the machine that runs that `pulumi up`; `read` and
`diff` keep it in the stack's state, and only another cluster (name or location) gets a new start.

Dynamic-provider rules as components/pinned_image.py's: pickled by reference to this module, no state;
a changed `__provider` (the module moved) is an update that keeps the start.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, TypedDict

import pulumi
import pulumi.dynamic

from domain.upgrade_exclusion import text

_CLUSTER_KEYS = ("cluster", "location")


class UpgradeExclusionStartArgs(TypedDict):
    cluster: pulumi.Input[str]
    """The cluster's name: a new cluster starts its own exclusion."""
    location: pulumi.Input[str]


class UpgradeExclusionStartProvider(pulumi.dynamic.ResourceProvider):
    """Reads the clock in `create` only."""

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.DiffResult:
        replaces = [key for key in _CLUSTER_KEYS if olds.get(key) != news.get(key)]
        moved = olds.get("__provider") != news.get("__provider")
        return pulumi.dynamic.DiffResult(changes=bool(replaces) or moved, replaces=replaces)

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        start = text(datetime.now(timezone.utc))
        return pulumi.dynamic.CreateResult(f"{props['cluster']}@{start}", {**props, "start": start})

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.UpdateResult:
        return pulumi.dynamic.UpdateResult({**news, "start": olds["start"]})

    def read(self, id_: str, props: dict[str, Any]) -> pulumi.dynamic.ReadResult:
        return pulumi.dynamic.ReadResult(id_, props)


class UpgradeExclusionStart(pulumi.dynamic.Resource, name="UpgradeExclusionStart"):
    """When the cluster's first `pulumi up` ran (RFC3339 UTC): the maintenance exclusion's default start."""

    start: pulumi.Output[str]

    def __init__(self, name: str, args: UpgradeExclusionStartArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(UpgradeExclusionStartProvider(), name, {**args, "start": None}, opts)
