"""The serialized provider a dynamic resource's state holds (`__provider`), and the module paths that
states have named.

Pulumi's provider host (pulumi/dynamic/__main__.py) unpickles `Check`'s and `Diff`'s provider from the
program's inputs, `Read`'s and `Delete`'s from the state's outputs, and stores the program's only on
`Create` and `Update`. A state naming a module that no longer imports fails refresh, destroy and every
delete-first replacement (pulumi/pulumi#6238), so each provider's `diff` reports a changed reference
as a change, never a replacement: the update that follows stores the program's reference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

KEY = "__provider"

STATE_REFERENCES = (
    ("components.grpo_job", "GrpoJobProvider"),
    ("components.helm_release", "PinnedChartProvider"),
    ("components.pinned_image", "PinnedImageProvider"),
    ("components.upgrade_exclusion", "UpgradeExclusionStartProvider"),
)
"""Every provider class a stack's state has named (each module added once and never moved). A
move keeps the old path importable (a module re-exporting the class) until every stack ran an `up`."""


def moved(olds: Mapping[str, Any], news: Mapping[str, Any]) -> bool:
    """Whether the state names another serialized provider than the program does."""
    return olds.get(KEY) != news.get(KEY)
