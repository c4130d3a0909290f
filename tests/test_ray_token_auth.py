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


def test_the_supervisor_may_read_the_token_secret_by_name_and_knows_which() -> None:
    """A RayCluster replacement makes KubeRay write a new token into a new Secret of the same name (owned by
    the RayCluster, KubeRay v1.6.2 reconcileAuthSecret): the pod's env keeps the old one, so the supervisor
    reads the Secret itself, that one only."""
    import json

    result = synth.run("a4-standard", overrides={"verl-gke:verlImage": OWN_IMAGE, "verl-gke:rayVersion": "2.54.0"})
    cluster, _ = _objects(result)
    name = cluster["metadata"]["name"]
    role = next(m for m in result.manifests() if m["kind"] == "Role" and m["metadata"]["name"].endswith("-supervisor"))
    assert {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [name], "verbs": ["get"]} in role["rules"]
    program = next(m for m in result.manifests() if m["kind"] == "ConfigMap"
                   and m["metadata"]["name"].endswith("-supervisor"))
    assert json.loads(program["data"]["config.json"])["ray_token_secret"] == name


@pytest.mark.ray
@pytest.mark.timeout(240)
def test_the_supervisor_follows_a_replaced_rayclusters_new_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """The RayCluster replaced: its new head's Ray wants a new token (real Ray 2.60 with RAY_AUTH_MODE=token,
    as KubeRay sets it), and the Secret of the same name now holds it. The supervisor's pod still has the old
    token in its env; its requests are refused (403: another token, Ray's http_token_authentication.py),
    re-read the Secret and pass. One head, started wanting the new token: a restart is not what is checked."""
    import base64
    import secrets
    import urllib.error

    from tests.kube_api import InProcessApi, KubeApiStandIn
    from tests.ray_head import HEAD_ENV, start_head, stop_head
    from workloads.run_supervisor import SupervisorConfig, decider

    old, new = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    state = KubeApiStandIn()
    secret = "/api/v1/namespaces/ray/secrets/rc"

    def kuberay_writes(token: str) -> None:
        state.put_object(secret, {"metadata": {"name": "rc"},
                                  "data": {"auth_token": base64.b64encode(token.encode()).decode()}})

    kuberay_writes(new)
    monkeypatch.setenv("RAY_AUTH_TOKEN", old)  # the pod's env, fixed at its start
    head = start_head(env={**HEAD_ENV, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": new})
    try:
        config = SupervisorConfig(head_url=head.dashboard_url, submission_ids=["s-0"], entrypoint="true",
                                  runtime_env={}, expected_workers=0, expected_gpus=0, ray_token_secret="rc")
        supervisor = decider(config, InProcessApi(state), "ray", "rc", log=lambda _line: None)
        assert supervisor.ray.jobs() == {}
        assert supervisor.ray.capacity().workers == 0  # the state API too (the head alone)
        # The Secret holds a token the head refuses too: the refusal is raised after one more try.
        kuberay_writes("not-the-token")
        restarted = decider(config, InProcessApi(state), "ray", "rc", log=lambda _line: None)  # the old env again
        with pytest.raises(urllib.error.HTTPError) as refused:
            restarted.ray.jobs()
        assert refused.value.code == 403
    finally:
        stop_head(head, grace_s=2.0)
