"""Ray's token authentication where the image's Ray has it (2.52 and later): the RayCluster asks
KubeRay for it, and the run supervisor gets the token KubeRay keeps in the Secret named after the
RayCluster (KubeRay v1.6.2 reconcileAuthSecret; key auth_token)."""

from __future__ import annotations

import pytest

from tests.k8s_schema import validate_custom
from verl_gke import synth

OWN_IMAGE = "registry.example/me/verl@sha256:" + "a" * 64


def _objects(result: synth.SynthResult) -> tuple[dict, dict]:
    cluster = next(m for m in result.manifests() if m["kind"] == "RayCluster")
    deployment = next(m for m in result.manifests() if m["kind"] == "Deployment")
    return cluster, deployment


def test_an_image_with_ray_252_or_later_runs_with_token_authentication() -> None:
    result = synth.run("a4-standard", overrides={"verl-gke:verlImage": OWN_IMAGE, "verl-gke:rayVersion": "2.54.0"})
    cluster, supervisor = _objects(result)
    assert cluster["spec"]["rayVersion"] == "2.54.0"
    assert cluster["spec"]["authOptions"] == {"mode": "token"}
    validate_custom(cluster)
    env = supervisor["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": cluster["metadata"]["name"], "key": "auth_token"}}} in env


@pytest.mark.parametrize("stack", ["a4-standard", "a4x"])
def test_the_pinned_images_ray_has_none_to_turn_on(synth_stack, stack: str) -> None:
    cluster, supervisor = _objects(synth_stack(stack))
    assert cluster["spec"]["rayVersion"] in ("2.47.0", "2.49.0")
    assert "authOptions" not in cluster["spec"]
    assert "RAY_AUTH_TOKEN" not in str(supervisor)
