"""The cluster's maintenance exclusion: 30 days without minor or node auto-upgrades (an upgrade drains the
GPU nodes in mid-run), as Cluster Toolkit's gke-a4, gke-a3-ultragpu and gke-a4x blueprints set one.

`upgradeExclusionStart` empty starts it at the cluster's first `pulumi up`, kept in state
(components/upgrade_exclusion.py). 30 days fits GKE's bounds for both NO_MINOR_OR_NODE_UPGRADES (until
the minor's end of support) and NO_UPGRADES (30 days), and lets nodes take security patches after.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

NAME = "verl-gke-no-minor-or-node-upgrades"
SCOPE = "NO_MINOR_OR_NODE_UPGRADES"
DAYS = 30
STANDARD_SUPPORT_DAYS = 426
"""14 months: a GKE minor version's standard support (no exclusion of this scope outlasts it)."""
AT_FIRST_UP = ""
"""upgradeExclusionStart's default: from the cluster's first `pulumi up`."""
OFF = "none"
"""upgradeExclusionStart for no exclusion at all."""
KEY = "verl-gke:upgradeExclusionStart"
_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
_RFC3339_UTC = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$")


def parse(start: str) -> datetime:
    """An RFC3339 UTC "Zulu" time and a real instant (GKE returns that form; any other is a permanent diff,
    pulumi-gcp docs); ValueError otherwise."""
    if not _RFC3339_UTC.match(start):
        raise ValueError(f"{start!r} is not YYYY-MM-DDTHH:MM:SSZ")
    return datetime.strptime(start, _FORMAT).replace(tzinfo=timezone.utc)


def text(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime(_FORMAT)


def end(start: str) -> str:
    """`start` plus DAYS, in the same form."""
    return text(parse(start) + timedelta(days=DAYS))


def start_problem(start: str, now: datetime) -> str | None:
    """What is wrong with an explicit start (empty and `none` are fine), in words for the key; None if nothing."""
    if start in (AT_FIRST_UP, OFF):
        return None
    try:
        begins = parse(start)
    except ValueError:
        return ("an RFC3339 UTC time such as 2027-03-01T00:00:00Z, empty (from the cluster's first `pulumi up`) or "
                "none (no exclusion).")
    latest = now + timedelta(days=STANDARD_SUPPORT_DAYS)
    if begins + timedelta(days=DAYS) > latest:
        return (f"ends after {text(latest)}, 14 months from now: GKE ends a {SCOPE} exclusion by the end of standard "
                "support of the cluster's minor version (14 months after its release); start it within a year.")
    return None


def window_line(start: str, now: datetime) -> tuple[str, str]:
    """(log level, the one line) that says when the exclusion runs, or that it is over."""
    begins, ends = parse(start), parse(start) + timedelta(days=DAYS)
    if ends <= now:
        return "warning", (f"{KEY}: the {DAYS}-day exclusion from {start} ended on {text(ends)}: GKE upgrades the "
                           "nodes again, draining GPU nodes mid-run; set a new start before the next run.")
    if begins < now:
        return "info", (f"{KEY}: {start} is in the past; the exclusion ends {text(ends)} (in "
                        f"{(ends - now).days} days).")
    return "info", f"{KEY}: no minor or node auto-upgrades from {start} to {text(ends)}."
