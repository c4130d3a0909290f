"""The maintenance exclusion: no fixed-date default (it starts at the cluster's first `pulumi up`, a start
read once and kept in state), a start GKE would refuse is refused, and a window in the past or already
over is said in one line."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from components.upgrade_exclusion import UpgradeExclusionStartProvider
from domain import upgrade_exclusion
from domain.config import ConfigError, load_config
from tests.conftest import BASE_CONFIG

NOW = datetime(2027, 3, 1, 12, 0, tzinfo=timezone.utc)
PROPS = {"cluster": "verl-a4", "location": "us-central1", "__provider": "pickled-at-a"}


def test_the_first_up_reads_the_clock_once_and_every_later_up_keeps_it():
    provider = UpgradeExclusionStartProvider()
    before = datetime.now(timezone.utc).replace(microsecond=0)
    created = provider.create(dict(PROPS))
    start = created.outs["start"]
    assert before <= datetime.strptime(start, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc) <= datetime.now(
        timezone.utc)
    assert provider.read(created.id, created.outs).outs["start"] == start
    assert not provider.diff(created.id, created.outs, dict(PROPS)).changes
    # A moved module stores its new reference (an update), the start stays.
    moved = {**PROPS, "__provider": "pickled-at-b"}
    assert provider.diff(created.id, created.outs, moved).changes
    assert provider.diff(created.id, created.outs, moved).replaces == []
    assert provider.update(created.id, created.outs, moved).outs["start"] == start
    # Another cluster is another first `up`.
    assert provider.diff(created.id, created.outs, {**PROPS, "cluster": "other"}).replaces == ["cluster"]


@pytest.mark.parametrize(("start", "level", "line"), [
    ("2027-03-10T00:00:00Z", "info", "verl-gke:upgradeExclusionStart: no minor or node auto-upgrades from "
                                     "2027-03-10T00:00:00Z to 2027-04-09T00:00:00Z."),
    ("2027-02-20T00:00:00Z", "info", "verl-gke:upgradeExclusionStart: 2027-02-20T00:00:00Z is in the past; the "
                                     "exclusion ends 2027-03-22T00:00:00Z (in 20 days)."),
    ("2027-01-01T00:00:00Z", "warning", "verl-gke:upgradeExclusionStart: the 30-day exclusion from "
                                        "2027-01-01T00:00:00Z ended on 2027-01-31T00:00:00Z: GKE upgrades the nodes "
                                        "again, draining GPU nodes mid-run; set a new start before the next run."),
])
def test_a_start_in_the_past_or_a_window_already_over_is_one_line(start: str, level: str, line: str):
    assert upgrade_exclusion.window_line(start, NOW) == (level, line)


def test_a_start_gke_would_refuse_is_refused_naming_the_key():
    with pytest.raises(ConfigError) as caught:
        load_config({**BASE_CONFIG, "verl-gke:upgradeExclusionStart": "2999-01-01T00:00:00Z"}, now=NOW)
    assert caught.value.problems == [
        'verl-gke:upgradeExclusionStart = "2999-01-01T00:00:00Z": ends after 2028-04-30T12:00:00Z, 14 months from '
        "now: GKE ends a NO_MINOR_OR_NODE_UPGRADES exclusion by the end of standard support of the cluster's minor "
        "version (14 months after its release); start it within a year."]
    assert load_config({**BASE_CONFIG, "verl-gke:upgradeExclusionStart": "none"}, now=NOW)
    assert load_config(dict(BASE_CONFIG), now=NOW).upgrade_exclusion_start == upgrade_exclusion.AT_FIRST_UP


def test_preview_says_in_one_line_that_a_configured_window_is_over_and_none_turns_it_off():
    from verl_gke import synth

    over = synth.run("a4-standard", overrides={"verl-gke:upgradeExclusionStart": "2026-01-01T00:00:00Z"})
    assert ("warning: verl-gke:upgradeExclusionStart: the 30-day exclusion from 2026-01-01T00:00:00Z ended on "
            "2026-01-31T00:00:00Z: GKE upgrades the nodes again, draining GPU nodes mid-run; set a new start before "
            "the next run.") in over.log
    (cluster,) = [r for r in over.registrations if r.type == "gcp:container/cluster:Cluster"]
    (exclusion,) = cluster.inputs["maintenancePolicy"]["maintenanceExclusions"]
    assert (exclusion["startTime"], exclusion["endTime"]) == ("2026-01-01T00:00:00Z", "2026-01-31T00:00:00Z")
    assert not [r for r in over.registrations if r.type == synth.EXCLUSION_START_TYPE]
    off = synth.run("a4-standard", overrides={"verl-gke:upgradeExclusionStart": "none"})
    (cluster,) = [r for r in off.registrations if r.type == "gcp:container/cluster:Cluster"]
    assert "maintenancePolicy" not in cluster.inputs
