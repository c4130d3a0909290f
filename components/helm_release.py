"""One way to install a pinned Helm chart: a `helm.v3.Release` named after the chart, from the local
archive whose sha256 is pinned (domain/chart_archive.py), never from the repository by version.

The pin is the stack's config (`verl-gke:chartDigests`); until it is set, the digest the stack's first
`pulumi up` fetched is kept in its state by a PinnedChart (shown for review in a warning), whose `check`
refuses every later archive of other bytes. Offline (synth, tests) nothing is fetched.
Dynamic-provider rules as components/pinned_image.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi.dynamic
import pulumi_kubernetes as k8s
from pulumi.runtime import mocks, settings

from components import provider_reference
from domain.chart_archive import ChartArchiveError, fetch, verified
from manifests.helm import HelmChart, pin_command

OFFLINE_CHART = "[{archive}: fetched at pulumi preview and up, installed only as its pinned sha256]"
"""The Release's `chart` offline (synth, tests): no repository is asked, and no path is made up."""


@dataclass(frozen=True)
class ChartSource:
    path: str
    """The checked local archive the Release installs (OFFLINE_CHART offline)."""
    digest: str | None
    """Its sha256:<hex> (None offline when the config pins none)."""
    in_config: bool
    """Pinned by `verl-gke:chartDigests` (else by the state's PinnedChart)."""


_sources: dict[tuple[HelmChart, str | None], ChartSource] = {}
"""Each chart's source for its pin, once per program run."""


def _offline() -> bool:
    return isinstance(settings.get_monitor(), mocks.MockMonitor)


def chart_source(chart: HelmChart) -> ChartSource:
    """The chart's archive, fetched (60 s deadline) and checked against the config's pin once per run."""
    pin = (pulumi.Config("verl-gke").get_object("chartDigests") or {}).get(chart.key)
    if _offline():
        return ChartSource(OFFLINE_CHART.format(archive=chart.archive), pin, bool(pin))
    if (chart, pin) in _sources:
        return _sources[chart, pin]
    if pin:
        try:
            path = verified(chart.url, pin, what=f"chart {chart.key} (verl-gke:chartDigests)",
                            fix=lambda got: f"Review what it serves now; if you trust it, pin it: "
                                            f"`{chart.pin_command(got)}`")
        except ChartArchiveError as error:
            raise pulumi.RunError(str(error)) from None
        source = ChartSource(str(path), pin, True)
    else:
        try:
            path, digest = fetch(chart.url)
        except ChartArchiveError as error:
            raise pulumi.RunError(str(error)) from None
        pulumi.log.warn(f"chart {chart.key}: {chart.url} serves {digest}; the stack's state keeps the digest of its "
                        f"first `pulumi up` and every later `up` refuses other bytes. Review the chart, then keep the "
                        f"pin in the stack's config (CI deploys no unpinned chart): `{chart.pin_command(digest)}`")
        source = ChartSource(str(path), digest, False)
    _sources[chart, pin] = source
    return source


def check_charts(charts: list[HelmChart]) -> None:
    """Before anything is created: each chart's archive fetched and checked, so a mismatch stops the
    program first."""
    for chart in charts:
        chart_source(chart)


def _refusal(key: str, url: str, kept: str, served: str) -> str:
    return (f"chart {key}: {url} serves {served}, not the {kept} this stack's first `pulumi up` kept in its state: "
            f"not the archive that was reviewed; nothing installed. Review what it serves now; if you trust it, "
            f"pin it: `{pin_command(key, served)}`")


class PinnedChartProvider(pulumi.dynamic.ResourceProvider):
    """Keeps the first `up`'s digest of a chart's archive; refuses another one for the same archive."""

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.CheckResult:
        kept, served = olds.get("sha256"), news.get("sha256")
        if olds.get("url") == news.get("url") and kept and served and kept != served:
            reason = _refusal(str(news.get("chart")), str(news.get("url")), kept, served)
            return pulumi.dynamic.CheckResult(news, [pulumi.dynamic.CheckFailure("sha256", reason)])
        return pulumi.dynamic.CheckResult(news, [])

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.DiffResult:
        changed = olds.get("url") != news.get("url")
        return pulumi.dynamic.DiffResult(changes=changed or provider_reference.moved(olds, news),
                                         replaces=["url"] if changed else [])

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        return pulumi.dynamic.CreateResult(props["url"], {k: props[k] for k in ("chart", "url", "sha256")})

    def update(self, _id: str, olds: dict[str, Any], _news: dict[str, Any]) -> pulumi.dynamic.UpdateResult:
        # Only the provider's reference changed (check refused another digest): the pin stays.
        return pulumi.dynamic.UpdateResult({k: olds[k] for k in ("chart", "url", "sha256")})

    def read(self, id_: str, props: dict[str, Any]) -> pulumi.dynamic.ReadResult:
        return pulumi.dynamic.ReadResult(id_, props)


class PinnedChart(pulumi.dynamic.Resource, name="PinnedChart"):
    """A chart's archive (`url`) and the sha256 it had at the stack's first `pulumi up`."""

    sha256: pulumi.Output[str]

    def __init__(self, name: str, args: dict[str, Any], opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(PinnedChartProvider(), name, args, opts)


def pinned_release(resource_name: str, chart: HelmChart, *, namespace: str, values: dict[str, Any],
                   opts: pulumi.ResourceOptions) -> k8s.helm.v3.Release:
    """The chart's checked archive (pulumi-kubernetes' Release takes a local chart path: Helm reads the
    name and version from the archive's Chart.yaml) as release `chart.name` in `namespace`.

    The release name is fixed and helm_release.go's diff never deletes first: a replacement does."""
    source = chart_source(chart)
    # Its own (dynamic) provider, and nothing of the cluster to wait for.
    kept = [] if source.in_config else [PinnedChart(f"{resource_name}-archive", {
        "chart": chart.key, "url": chart.url, "sha256": source.digest}, pulumi.ResourceOptions(parent=opts.parent))]
    return k8s.helm.v3.Release(
        resource_name,
        name=chart.name,
        chart=source.path,
        namespace=namespace,
        values=values,
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(delete_before_replace=True, depends_on=kept)),
    )
