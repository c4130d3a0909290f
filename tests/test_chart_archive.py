"""Chart archives by sha256 (#48): fetched from a real HTTP server on 127.0.0.1 (or a file URL) serving a
real chart .tgz (the layout `helm package` writes: `<name>/Chart.yaml` inside a gzip'd tar), good and
re-published; the pin kept in the stack's config or, at the first `pulumi up`, in its state (PinnedChart);
CI's check; synth, which fetches nothing."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import shutil
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pulumi
import pytest

from components import helm_release
from components.helm_release import PinnedChartProvider
from domain.platforms import repository_pin
from domain.chart_archive import ChartArchiveError, cached_path, fetch, verified
from manifests import dra, kuberay
from manifests.helm import HelmChart
from verl_gke import image_pins, synth

ROOT = Path(__file__).resolve().parent.parent


def chart_tgz(template: str = "kind: ConfigMap\n") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, text in (("demo/Chart.yaml", "apiVersion: v2\nname: demo\nversion: 1.0.0\n"),
                           ("demo/templates/cm.yaml", template)):
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return out.getvalue()


GOOD = chart_tgz()
GOOD_SHA = "sha256:" + hashlib.sha256(GOOD).hexdigest()
# The same version re-published with another template: what a version pin alone would install.
TAMPERED = chart_tgz(template="kind: ClusterRoleBinding\n")
TAMPERED_SHA = "sha256:" + hashlib.sha256(TAMPERED).hexdigest()


def _fix(got: str) -> str:
    return f"set {got}"


@pytest.fixture
def served() -> Iterator[dict[str, object]]:
    state: dict[str, object] = {"body": GOOD, "hits": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            state["hits"] = int(state["hits"]) + 1  # type: ignore[call-overload]
            body = state["body"]
            assert isinstance(body, bytes)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}/charts/demo-1.0.0.tgz"
    yield state
    server.shutdown()
    server.server_close()


# --- domain/chart_archive ------------------------------------------------------------------------------


def test_a_fetch_gives_the_archive_and_its_digest_and_caches_it(served, tmp_path: Path):
    url = str(served["url"])
    path, digest = fetch(url, root=tmp_path)
    assert (digest, path) == (GOOD_SHA, tmp_path / "charts" / GOOD_SHA[7:] / "demo-1.0.0.tgz")
    with tarfile.open(path) as tar:
        assert "demo/Chart.yaml" in tar.getnames()
    served["body"] = TAMPERED  # the repository now serves other bytes: the checked copy is used
    assert verified(url, GOOD_SHA, what="chart demo:1.0.0", fix=_fix, root=tmp_path).read_bytes() == GOOD
    assert served["hits"] == 1


def test_a_file_url_is_fetched_too(tmp_path: Path):
    source = tmp_path / "demo-1.0.0.tgz"
    source.write_bytes(GOOD)
    assert verified(source.as_uri(), GOOD_SHA, what="chart demo:1.0.0", fix=_fix, root=tmp_path / "cache") \
        .read_bytes() == GOOD


def test_a_republished_archive_is_refused_in_one_line_with_both_digests(served, tmp_path: Path):
    served["body"] = TAMPERED
    url = str(served["url"])
    with pytest.raises(ChartArchiveError) as error:
        verified(url, GOOD_SHA, what="chart demo:1.0.0", fix=_fix, root=tmp_path)
    assert str(error.value) == (f"chart demo:1.0.0: {url} serves {TAMPERED_SHA}, not the pinned {GOOD_SHA}: not the "
                                f"archive that was reviewed; nothing installed. set {TAMPERED_SHA}")
    assert not cached_path(url, GOOD_SHA, tmp_path).exists()


def test_a_tampered_cached_copy_is_not_trusted(served, tmp_path: Path):
    url = str(served["url"])
    path = cached_path(url, GOOD_SHA, tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(TAMPERED)
    assert verified(url, GOOD_SHA, what="chart demo:1.0.0", fix=_fix, root=tmp_path).read_bytes() == GOOD
    assert served["hits"] == 1


def test_an_unreachable_repository_fails_within_the_deadline(tmp_path: Path):
    with pytest.raises(ChartArchiveError, match=r"^http://127\.0\.0\.1:9/demo-1\.0\.0\.tgz: could not be downloaded"):
        fetch("http://127.0.0.1:9/demo-1.0.0.tgz", root=tmp_path, timeout_s=5)


# --- components/helm_release at `pulumi up` (outside the mock engine) ----------------------------------


@pytest.fixture
def live(served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The program outside the mock engine (the one thing stood in: `settings.get_monitor()`, which the
    module asks to tell synth from a real preview), the stack's chartDigests as given, the cache in tmp."""
    monkeypatch.setenv("VERL_GKE_CACHE_ROOT", str(tmp_path))
    monkeypatch.setattr(helm_release.settings, "get_monitor", lambda: object())
    monkeypatch.setattr(helm_release, "_sources", {})
    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *_a, **_k: warnings.append(message))
    pins: dict[str, str] = {}
    monkeypatch.setattr(pulumi.Config, "get_object", lambda _self, key: pins if key == "chartDigests" else None)
    chart = HelmChart(name="demo", repo="https://charts.example", version="1.0.0", image="x:1", url=str(served["url"]))
    return chart, pins, warnings


def test_the_first_up_fetches_an_unpinned_chart_and_shows_its_digest_for_review(live, tmp_path: Path):
    chart, _, warnings = live
    source = helm_release.chart_source(chart)
    assert source == helm_release.ChartSource(str(tmp_path / "charts" / GOOD_SHA[7:] / "demo-1.0.0.tgz"), GOOD_SHA,
                                              False)
    assert warnings == [
        f"chart demo:1.0.0: {chart.url} serves {GOOD_SHA}; the stack's state keeps the digest of its first `pulumi up` "
        "and every later `up` refuses other bytes. Review the chart, then keep the pin in the stack's config (CI "
        f"deploys no unpinned chart): `pulumi config set --path 'verl-gke:chartDigests[\"demo:1.0.0\"]' {GOOD_SHA}`"]


def test_a_chart_pinned_in_the_config_installs_only_those_bytes(live, served, tmp_path: Path):
    chart, pins, warnings = live
    pins["demo:1.0.0"] = GOOD_SHA
    helm_release.check_charts([chart])
    assert helm_release.chart_source(chart) == helm_release.ChartSource(
        str(tmp_path / "charts" / GOOD_SHA[7:] / "demo-1.0.0.tgz"), GOOD_SHA, True)
    assert served["hits"] == 1 and warnings == []


def test_a_republished_chart_stops_the_program_in_one_line(live, served):
    chart, pins, _ = live
    pins["demo:1.0.0"] = GOOD_SHA
    served["body"] = TAMPERED
    with pytest.raises(pulumi.RunError) as error:
        helm_release.check_charts([chart])
    assert str(error.value) == (
        f"chart demo:1.0.0 (verl-gke:chartDigests): {chart.url} serves {TAMPERED_SHA}, not the pinned {GOOD_SHA}: "
        "not the archive that was reviewed; nothing installed. Review what it serves now; if you trust it, pin it: "
        f"`pulumi config set --path 'verl-gke:chartDigests[\"demo:1.0.0\"]' {TAMPERED_SHA}`")


def test_every_later_up_refuses_an_archive_other_than_the_one_the_state_kept():
    """PinnedChart's check: Pulumi hands it the inputs of the last `up` (olds) and of this one (news)."""
    url = "https://charts.example/demo-1.0.0.tgz"
    olds = {"chart": "demo:1.0.0", "url": url, "sha256": GOOD_SHA}
    provider = PinnedChartProvider()
    assert provider.check(olds, dict(olds)).failures == []
    (failure,) = provider.check(olds, {**olds, "sha256": TAMPERED_SHA}).failures
    assert (failure.property, failure.reason) == ("sha256", (
        f"chart demo:1.0.0: {url} serves {TAMPERED_SHA}, not the {GOOD_SHA} this stack's first `pulumi up` kept in "
        "its state: not the archive that was reviewed; nothing installed. Review what it serves now; if you trust "
        f"it, pin it: `pulumi config set --path 'verl-gke:chartDigests[\"demo:1.0.0\"]' {TAMPERED_SHA}`"))
    # Another version is another archive: pinned anew (a replacement), not refused.
    other = {"chart": "demo:1.0.1", "url": url.replace("1.0.0", "1.0.1"), "sha256": TAMPERED_SHA}
    assert provider.check(olds, other).failures == []
    assert provider.diff("id", olds, other).replaces == ["url"]
    assert provider.update("id", olds, {**olds, "__provider": "moved"}).outs == olds


# --- synth (offline: nothing fetched) and CI's check ----------------------------------------------------


def test_synth_fetches_no_chart_and_says_where_each_sha256_comes_from(synth_stack, monkeypatch: pytest.MonkeyPatch):
    def no_network(url: str, _deadline: float) -> bytes:
        raise AssertionError(f"synth fetched {url}")

    monkeypatch.setattr("domain.chart_archive._download", no_network)
    result = synth.run("a4x")
    (release,) = [r for r in result.registrations if r.type == "kubernetes:helm.sh/v3:Release"
                  and r.inputs["name"] == dra.CHART.name]
    assert release.inputs["chart"] == ("[nvidia-dra-driver-gpu-25.3.2.tgz: fetched at pulumi preview and up, "
                                       "installed only as its pinned sha256]")
    (kept,) = [r for r in result.registrations if r.name == "dra-driver-archive"]
    # Its sha256 unknown offline: the first `pulumi up` fetches it.
    assert {k: v for k, v in kept.inputs.items() if k != "__provider"} == {
        "chart": "nvidia-dra-driver-gpu:25.3.2", "url": dra.CHART.url}
    assert result.images[result.images.index(next(i for i in result.images if i.startswith("Charts"))):] == [
        "Charts (installed from their archive, only with its pinned sha256; not fetched by synth):", *[
            f"  {chart.key}: pinned at the first `pulumi up` to what {chart.url} serves then (kept in the state; "
            "`python -m verl_gke.image_pins --stack <stack>` prints the config line; CI refuses to deploy so)"
            for chart in (kuberay.CHART, dra.CHART)]]
    assert [line for line in synth_stack("a4").images if "chart" in line.lower()] == []
    pinned = synth.run("a4x", overrides={"verl-gke:chartDigests": {"nvidia-dra-driver-gpu:25.3.2": GOOD_SHA}})
    assert [r for r in pinned.registrations if r.name == "dra-driver-archive"] == []
    assert pinned.images[-1] == f"  nvidia-dra-driver-gpu:25.3.2: pinned in the stack's config (chartDigests) to {GOOD_SHA}"


def test_ci_refuses_a_stack_with_an_unpinned_chart_and_the_command_prints_its_pin(
        served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    monkeypatch.setenv("VERL_GKE_CACHE_ROOT", str(tmp_path / "cache"))
    for module in (kuberay, dra):
        monkeypatch.setattr(module, "CHART", dataclasses.replace(module.CHART, url=str(served["url"])))
    images, _ = image_pins.stack_images(image_pins.load_config(
        image_pins.raw_config("a4x", ROOT)[0], "Pulumi.a4x.yaml"))
    digests = "".join(f'    "{i.image}": "sha256:{"ab" * 32}"\n' for i in images if not repository_pin(i.image))
    for name in ("Pulumi.yaml", "Pulumi.a4x.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    stack_file = tmp_path / "Pulumi.a4x.yaml"
    stack_file.write_text(stack_file.read_text() + "  verl-gke:imageDigests:\n" + digests)
    argv = ["--stack", "a4x", "--project-dir", str(tmp_path)]
    assert image_pins.main([*argv, "--check"]) == 1
    keys = ["kuberay-operator:1.6.2", "nvidia-dra-driver-gpu:25.3.2"]
    assert capsys.readouterr().err.splitlines() == [
        f"image_pins: stack a4x would install chart {key} with no sha256 in verl-gke:chartDigests (its archive's "
        "digest is asked at `pulumi up`): pin it first (`python -m verl_gke.image_pins --stack a4x` prints the command)"
        for key in keys]
    assert image_pins.main(argv) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"pulumi config set --stack a4x --path 'verl-gke:chartDigests[\"{key}\"]' {GOOD_SHA}" for key in keys]
    stack_file.write_text(stack_file.read_text() + "  verl-gke:chartDigests:\n" + "".join(
        f'    "{key}": "{GOOD_SHA}"\n' for key in keys))
    assert image_pins.main([*argv, "--check"]) == 0
