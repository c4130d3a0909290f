"""Every image a stack runs is pulled by digest, the Helm charts' included: pinned in the repository
(domain.platforms.IMAGE_DIGESTS, written by `python -m verl_gke.image_pins` on a machine with network)
or, where the repository has no digest yet, at the first `pulumi up` (components.pinned_image).
The registry stand-in (tests/registry_api.py) answers for every registry here."""

from __future__ import annotations

import ast
import functools
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from domain import platforms
from tests.registry_api import OCI_INDEX, Manifest, RegistryStandIn, serve
from access import registry
from verl_gke import image_pins, synth

ROOT = Path(__file__).resolve().parent.parent
PINNED = re.compile(r"@(sha256:[0-9a-f]{64}|" + re.escape(synth.UNRESOLVED_DIGEST) + r")$")


def _images(value: Any) -> list[str]:
    """Every `image:` string of a manifest or of Helm values ({repository, tag} joined)."""
    found: list[str] = []
    if isinstance(value, dict):
        image = value.get("image")
        if isinstance(image, str):
            found.append(image)
        elif isinstance(image, dict) and "repository" in image:
            found.append(f"{image['repository']}:{image.get('tag', '')}")
        for key, item in value.items():
            if key != "image":
                found += _images(item)
    elif isinstance(value, list):
        found += [i for item in value for i in _images(item)]
    return found


@pytest.mark.parametrize("stack", ["a4", "a4x"])
def test_every_image_a_stack_runs_is_pulled_by_digest(synth_stack, stack: str) -> None:
    result = synth_stack(stack)
    images = [i for m in result.manifests() for i in _images(m)]
    releases = [r for r in result.registrations if r.type == "kubernetes:helm.sh/v3:Release"]
    images += [i for r in releases for i in _images(r.inputs["values"])]
    assert images and [i for i in images if not PINNED.search(i)] == []
    if stack == "a4x":  # the KubeRay operator's and the NVIDIA DRA driver's charts, through their values
        charts = {r.inputs["name"]: _images(r.inputs["values"]) for r in releases}
        assert charts == {
            "kuberay-operator": [f"quay.io/kuberay/operator:v1.6.2@{synth.UNRESOLVED_DIGEST}"],
            "nvidia-dra-driver-gpu": [f"nvcr.io/nvidia/k8s-dra-driver-gpu:v25.3.2@{synth.UNRESOLVED_DIGEST}"],
        }


def test_synth_says_which_images_are_pinned_in_the_repository_and_which_at_the_first_up(synth_stack) -> None:
    text = synth.summary(synth_stack("a4x"), Path("dist/a4x"))
    block = text[text.index("Images"):].splitlines()
    assert block[:11] == [
        "Images (every one pulled by digest):",
        "  pinned in the repository: python:3.11.13-slim-bookworm (staging, run supervisor), gke.gcr.io/pause:3.8 "
        "(NCCL installer)",
        "  pinned at the first `pulumi up` (no digest in domain/platforms.py or imageDigests; "
        "`python -m verl_gke.image_pins --stack <stack>` prints them; CI refuses to deploy so):",
        "    verlai/verl:vllm023.aarch64.dev1 (Ray head and workers)",
        "    us-docker.pkg.dev/gce-ai-infra/gpudirect-gib/nccl-plugin-gib-arm64:v1.1.0 (NCCL installer)",
        "    quay.io/kuberay/operator:v1.6.2 (KubeRay operator)",
        "    nvcr.io/nvidia/k8s-dra-driver-gpu:v25.3.2 (NVIDIA DRA driver)",
        "Charts (installed from their archive, only with its pinned sha256; not fetched by synth):",
        *[f"  {chart}: pinned at the first `pulumi up` to what {url} serves then (kept in the state; `python -m "
          "verl_gke.image_pins --stack <stack>` prints the config line; CI refuses to deploy so)" for chart, url in (
              ("kuberay-operator:1.6.2", "https://github.com/ray-project/kuberay-helm/releases/download/"
                                         "kuberay-operator-1.6.2/kuberay-operator-1.6.2.tgz"),
              ("nvidia-dra-driver-gpu:25.3.2",
               "https://helm.ngc.nvidia.com/nvidia/charts/nvidia-dra-driver-gpu-25.3.2.tgz"))],
        "Live checks not made (no --cloud answer; `pulumi preview` makes them):",
    ]


def test_autopilots_nccl_installer_is_named_as_the_one_image_by_tag(synth_stack) -> None:
    text = synth.summary(synth_stack("a4"), Path("dist/a4"))
    assert ("  by tag: Google's Autopilot NCCL installer manifest, applied as Google wrote it (Autopilot admits its "
            "privileged pods only so)") in text.splitlines()


@pytest.fixture
def registries(monkeypatch: pytest.MonkeyPatch):
    """One stand-in answering for every registry the images name, each tag with its own digest."""
    digests = {image: f"sha256:{i:064x}" for i, image in enumerate(image_pins.TAGGED_IMAGES, start=1)}
    manifests = {(registry.parse(image).repository, registry.parse(image).tag): Manifest(OCI_INDEX, digest)
                 for image, digest in digests.items()}
    with serve(RegistryStandIn(manifests=manifests)) as stand_in:
        monkeypatch.setattr(image_pins, "resolve_digest",
                            functools.partial(registry.resolve_digest, base_url=stand_in.url))
        yield stand_in, digests


def _load(path: Path) -> dict[str, str]:
    """The IMAGE_DIGESTS a Python file assigns, read as Python reads the literal."""
    tree = ast.parse(path.read_text())
    (value,) = [node.value for node in tree.body if isinstance(node, ast.AnnAssign)
                and getattr(node.target, "id", "") == "IMAGE_DIGESTS"]
    return ast.literal_eval(value)


def test_the_maintainer_command_writes_every_digest_into_the_platform_table(
        registries, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, digests = registries
    table = tmp_path / "platforms.py"
    shutil.copy(ROOT / "domain" / "platforms.py", table)
    assert image_pins.main(["--table", str(table)]) == 0
    assert _load(table) == digests
    assert table.read_text().replace(image_pins.block(digests), image_pins.block(platforms.IMAGE_DIGESTS)) == (
        ROOT / "domain" / "platforms.py").read_text()  # nothing else of the file changed
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {len(digests)} digests to {table}"
    assert image_pins.main(["--table", str(table)]) == 0  # again: the same file
    assert _load(table) == digests


def test_a_tag_no_registry_resolves_leaves_the_table_as_it_was(
        registries, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stand_in, _ = registries
    gone = image_pins.TAGGED_IMAGES[0]
    del stand_in.manifests[(registry.parse(gone).repository, registry.parse(gone).tag)]
    table = tmp_path / "platforms.py"
    shutil.copy(ROOT / "domain" / "platforms.py", table)
    assert image_pins.main(["--table", str(table)]) == 1
    assert table.read_text() == (ROOT / "domain" / "platforms.py").read_text()
    assert capsys.readouterr().err.splitlines() == [
        f"image_pins: {gone}: tag {registry.parse(gone).tag} not found in {registry.parse(gone).registry}/"
        f"{registry.parse(gone).repository} (HTTP 404)", f"image_pins: nothing written to {table}"]


def test_a_digest_in_the_repository_is_pulled_as_is_and_nothing_is_resolved_at_up(monkeypatch) -> None:
    image = platforms.X86_VERL_IMAGE
    monkeypatch.setitem(platforms.IMAGE_DIGESTS, image, "sha256:" + "d4" * 32)
    result = synth.run("a4-standard")
    (cluster,) = [m for m in result.manifests() if m["kind"] == "RayCluster"]
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
    assert head.endswith(f"verlai/verl:vllm011.dev7@sha256:{'d4' * 32}")
    pinned_at_up = [r.inputs["image"] for r in result.registrations if r.type == synth.PINNED_IMAGE_TYPE]
    assert image not in pinned_at_up and pinned_at_up == [platforms.PLATFORMS["a4"].nccl_installer_image]


def test_a_digest_in_the_stacks_config_is_pulled_as_is_and_nothing_is_resolved_at_up() -> None:
    image = platforms.X86_VERL_IMAGE
    result = synth.run("a4-standard", overrides={"verl-gke:imageDigests": {image: "sha256:" + "e5" * 32}})
    (cluster,) = [m for m in result.manifests() if m["kind"] == "RayCluster"]
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
    assert head.endswith(f"verlai/verl:vllm011.dev7@sha256:{'e5' * 32}")
    pinned_at_up = [r.inputs["image"] for r in result.registrations if r.type == synth.PINNED_IMAGE_TYPE]
    assert pinned_at_up == [platforms.PLATFORMS["a4"].nccl_installer_image]


def test_a_stacks_images_are_pinned_in_its_config_before_its_first_up_and_ci_refuses_them_unpinned(
        registries, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Why 2: a new stack trusted whatever its tags served at its first `up`. The command prints the
    `pulumi config set` lines (reviewed, then run); `--check` (CI, before `pulumi up`) refuses a
    stack with an image pinned neither in the repository nor in its config."""
    _, digests = registries
    for name in ("Pulumi.yaml", "Pulumi.a4-standard.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    argv = ["--stack", "a4-standard", "--project-dir", str(tmp_path)]
    unpinned = sorted(i for i in (platforms.X86_VERL_IMAGE, platforms.PLATFORMS["a4"].nccl_installer_image)
                      if i not in platforms.IMAGE_DIGESTS)
    assert image_pins.main([*argv, "--check"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"image_pins: stack a4-standard would pull {image} by a digest asked at `pulumi up`: pin it first "
        "(`python -m verl_gke.image_pins --stack a4-standard` prints the command)" for image in unpinned]
    assert image_pins.main(argv) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"pulumi config set --stack a4-standard --path 'verl-gke:imageDigests[\"{image}\"]' {digests[image]}"
        for image in unpinned]
    stack_file = tmp_path / "Pulumi.a4-standard.yaml"
    stack_file.write_text(stack_file.read_text() + "  verl-gke:imageDigests:\n" + "".join(
        f'    "{image}": "{digests[image]}"\n' for image in unpinned))
    assert image_pins.main([*argv, "--check"]) == 0
    assert image_pins.main(argv) == 0
    assert capsys.readouterr().out == "every image and chart of stack a4-standard is pinned\n"
