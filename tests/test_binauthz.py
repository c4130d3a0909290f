"""The Binary Authorization policy `python -m verl_gke.image_pins --stack S --binauthz-policy` prints
(manifests/binauthz.py): exactly the stack's images at their pinned digests, GKE's own through Google's
system policy, everything else denied; refused while an image has no digest."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from domain import platforms
from manifests import binauthz, kuberay, nccl, staging
from tests.test_image_pins import _images
from verl_gke import image_pins, synth

ROOT = Path(__file__).resolve().parent.parent
VERL = platforms.X86_VERL_IMAGE
GIB = platforms.PLATFORMS["a4"].nccl_installer_image


@pytest.fixture(autouse=True)
def _no_repository_digests(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table as shipped today (empty): every digest below comes from the stack's config."""
    monkeypatch.setattr(platforms, "IMAGE_DIGESTS", {})


def _stack_dir(tmp_path: Path, stack: str, digests: dict[str, str]) -> list[str]:
    for name in ("Pulumi.yaml", f"Pulumi.{stack}.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    if digests:
        with (tmp_path / f"Pulumi.{stack}.yaml").open("a") as f:
            f.write("  verl-gke:imageDigests:\n" + "".join(f'    "{i}": "{d}"\n' for i, d in digests.items()))
    return ["--stack", stack, "--project-dir", str(tmp_path), "--binauthz-policy"]


def test_the_policy_of_a_stack_with_every_image_pinned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = _stack_dir(tmp_path, "a4-standard", {VERL: "sha256:" + "a1" * 32, GIB: "sha256:" + "b2" * 32})
    assert image_pins.main(argv) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out == f"""\
name: projects/replace-me-project/policy
globalPolicyEvaluationMode: ENABLE
admissionWhitelistPatterns:
- namePattern: {nccl.PAUSE_IMAGE}
- namePattern: {staging.IMAGE}
- namePattern: us-central1-docker.pkg.dev/replace-me-project/verl-a4-docker-hub/{VERL}@sha256:{"a1" * 32}
- namePattern: {GIB}@sha256:{"b2" * 32}
defaultAdmissionRule:
  evaluationMode: ALWAYS_DENY
  enforcementMode: ENFORCED_BLOCK_AND_AUDIT_LOG
"""
    assert nccl.PAUSE_IMAGE.startswith("gke.gcr.io/pause:3.8@sha256:")
    assert staging.IMAGE.startswith("python:3.11.13-slim-bookworm@sha256:")
    assert VERL == "verlai/verl:vllm011.dev7"  # pulled through the stack's mirror of Docker Hub, named so


def test_no_policy_while_an_image_has_no_digest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = _stack_dir(tmp_path, "a4-standard", {GIB: "sha256:" + "b2" * 32})
    assert image_pins.main(argv) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"image_pins: stack a4-standard has no digest for {VERL}: pin it first "
        "(`python -m verl_gke.image_pins --stack a4-standard` prints the command)"]


def test_no_policy_for_a_stack_applying_an_installer_by_tag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Autopilot: Google's NCCL installer manifest names its images by tag; ALWAYS_DENY would refuse them."""
    argv = _stack_dir(tmp_path, "a4", {VERL: "sha256:" + "a1" * 32})
    assert image_pins.main(argv) == 1
    assert capsys.readouterr().err.splitlines() == [
        "image_pins: stack a4 applies by tag Google's Autopilot NCCL installer manifest, applied as Google wrote it "
        "(Autopilot admits its privileged pods only so): the policy would refuse its pods"]


def test_every_image_the_stack_runs_is_admitted_exactly_once_at_its_digest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A4X: the Ray image, the NCCL installer's two, staging's, and both charts' (KubeRay, the DRA driver)."""
    cfg_images, _ = image_pins.stack_images(
        image_pins.load_config(image_pins.raw_config("a4x", ROOT)[0], "Pulumi.a4x.yaml"))
    tagged = sorted({i.image for i in cfg_images if not platforms.has_digest(i.image)})
    digests = {image: f"sha256:{n:064x}" for n, image in enumerate(tagged, start=1)}
    assert image_pins.main(_stack_dir(tmp_path, "a4x", digests)) == 0
    patterns = [p["namePattern"] for p in yaml.safe_load(capsys.readouterr().out)["admissionWhitelistPatterns"]]

    result = synth.run("a4x", overrides={"verl-gke:imageDigests": digests})
    run = [i for m in result.manifests() for i in _images(m)]
    run += [i for r in result.registrations if r.type == "kubernetes:helm.sh/v3:Release"
            for i in _images(r.inputs["values"])]
    # synth asks no registry: an image the stack pins at `up` shows a placeholder; the config's pins show as such
    assert not [i for i in run if synth.UNRESOLVED_DIGEST in i]
    assert len(patterns) == len(set(patterns)) == 6
    assert sorted(set(run)) == patterns
    assert all(re.search(r"@sha256:[0-9a-f]{64}$", p) for p in patterns)
    assert f"{kuberay.CHART.image}@{digests[kuberay.CHART.image]}" in patterns


def test_an_image_by_tag_can_never_be_admitted() -> None:
    with pytest.raises(ValueError, match="no digest, so no pattern can pin them: verlai/verl:latest$"):
        binauthz.policy("p", [staging.IMAGE, "verlai/verl:latest"])
    assert binauthz.policy("p", [staging.IMAGE])["defaultAdmissionRule"]["evaluationMode"] == "ALWAYS_DENY"


def test_the_fields_are_the_ones_pulumi_gcps_binaryauthorization_policy_takes() -> None:
    """pulumi_gcp's input types for google_binary_authorization_policy: the same fields construct them, and
    each enum value is one its docstrings list as possible."""
    from pulumi_gcp import binaryauthorization as ba

    policy = binauthz.policy("my-project", [staging.IMAGE])
    ba.PolicyArgs(
        project=policy["name"].split("/")[1],
        global_policy_evaluation_mode=policy["globalPolicyEvaluationMode"],
        admission_whitelist_patterns=[ba.PolicyAdmissionWhitelistPatternArgs(name_pattern=p["namePattern"])
                                      for p in policy["admissionWhitelistPatterns"]],
        default_admission_rule=ba.PolicyDefaultAdmissionRuleArgs(
            evaluation_mode=policy["defaultAdmissionRule"]["evaluationMode"],
            enforcement_mode=policy["defaultAdmissionRule"]["enforcementMode"]))
    assert set(policy) == {"name", "globalPolicyEvaluationMode", "admissionWhitelistPatterns", "defaultAdmissionRule"}
    rule_doc = ba.PolicyDefaultAdmissionRuleArgs.__init__.__doc__
    possible = re.findall(r":param [^:]+ (\w+):.*?Possible values are: ([^\n]+)", rule_doc, re.DOTALL)
    allowed = {field: set(re.findall(r"`(\w+)`", values)) for field, values in possible}
    assert policy["defaultAdmissionRule"]["evaluationMode"] in allowed["evaluation_mode"]
    assert policy["defaultAdmissionRule"]["enforcementMode"] in allowed["enforcement_mode"]
    policy_doc = ba.PolicyArgs.__init__.__doc__
    assert re.search(r"global_policy_evaluation_mode:.*?Possible values are: `ENABLE`, `DISABLE`", policy_doc,
                     re.DOTALL)
