"""wandb's API key (issue 49, item 1): from the user's Secret Manager secret, through the staging Job, into one
Kubernetes Secret only the Ray containers read; never in Pulumi's config or state."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from domain import staged
from domain.config import load_config
from domain.preflight import SECRET, PreflightResult, wandb_secret_check
from manifests import staging
from manifests.staging import SCRIPT_FILE as SCRIPT
from tests.conftest import BASE_CONFIG, verl_value
from tests.k8s_schema import validate_core, validate_custom
from tests.kube_api import InProcessApi, KubeApiStandIn
from tests.test_staging_manifests import SPEC
from tests.test_user_data import refused
from verl_gke import synth
from workloads import gcs, kube
from workloads import stage_data as sd

KEY_SECRET = "wandb-key"
WANDB = {"verl-gke:verl": verl_value({"trainer.logger": ["console", "wandb"]}),
         "verl-gke:wandbApiKeySecret": KEY_SECRET}
ENV = {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb-api-key", "key": "api-key"}}}


def test_wandb_without_its_secret_is_refused_naming_the_key_and_the_fix() -> None:
    assert refused(**{"verl-gke:verl": WANDB["verl-gke:verl"]}) == [
        'verl-gke:verl.trainer.logger = ["console", "wandb"]: wandb needs its API key, which staging copies from '
        "Secret Manager: set verl-gke:wandbApiKeySecret to the secret's id, or drop wandb."]


def test_a_secret_id_secret_manager_would_refuse_is_refused() -> None:
    assert refused(**{**WANDB, "verl-gke:wandbApiKeySecret": "projects/p/secrets/k"}) == [
        'verl-gke:wandbApiKeySecret = "projects/p/secrets/k": the id of a Secret Manager secret in the stack\'s '
        "project (letters, digits, '_' and '-', at most 255), e.g. wandb-api-key"]


@pytest.fixture(scope="module")
def wandb_stack() -> synth.SynthResult:
    return synth.run("a4", overrides=WANDB)


def stack_project(result: synth.SynthResult) -> str:
    [grant] = [r for r in result.registrations if r.name == "storage-wandb-key-accessor"]
    return grant.inputs["project"]


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Every container of a workload object (Job, Deployment, RayCluster), init containers too."""
    if obj["kind"] == "RayCluster":
        pods = [obj["spec"]["headGroupSpec"]["template"]["spec"],
                *(g["template"]["spec"] for g in obj["spec"]["workerGroupSpecs"])]
    else:
        pods = [obj["spec"]["template"]["spec"]]
    return [c for pod in pods for c in (*pod.get("initContainers", []), *pod["containers"])]


def test_only_the_ray_containers_get_the_key(wandb_stack: synth.SynthResult) -> None:
    with_key = sorted(f"{m['kind']}/{c['name']}" for m in wandb_stack.manifests()
                      if m["kind"] in ("RayCluster", "Job", "Deployment", "DaemonSet") for c in containers(m)
                      if ENV in c.get("env", []))
    assert with_key == ["RayCluster/ray-head", "RayCluster/ray-worker"]


def test_the_key_never_passes_through_pulumi(wandb_stack: synth.SynthResult) -> None:
    # No Kubernetes Secret and no Secret Manager version is a resource: the value is in no input or output.
    types = {r.type for r in wandb_stack.registrations}
    assert "kubernetes:core/v1:Secret" not in types and "gcp:secretmanager/secretVersion:SecretVersion" not in types
    [grant] = [r for r in wandb_stack.registrations if r.name == "storage-wandb-key-accessor"]
    assert grant.inputs["secretId"] == KEY_SECRET and grant.inputs["role"] == "roles/secretmanager.secretAccessor"
    [staging_grant] = [r for r in wandb_stack.registrations if r.name == "storage-hf-token-accessor"]
    assert grant.inputs["member"] == staging_grant.inputs["member"]  # staging's principal, not the Ray pods'


def test_staging_copies_the_key_with_a_role_on_that_secret_alone(wandb_stack: synth.SynthResult) -> None:
    objs = {(m["kind"], m["metadata"]["name"]): m for m in wandb_stack.manifests()}
    job = objs["Job", "stage-data"]
    pod = job["spec"]["template"]["spec"]
    args = pod["containers"][0]["command"]
    at = args.index("--wandb-key-secret")
    ns, project = job["metadata"]["namespace"], stack_project(wandb_stack)
    assert args[at:at + 4] == ["--wandb-key-secret", f"projects/{project}/secrets/{KEY_SECRET}", "--namespace", ns]
    assert pod["automountServiceAccountToken"] is True
    role, binding = objs["Role", "stage-data-wandb-key"], objs["RoleBinding", "stage-data-wandb-key"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["wandb-api-key"],
                              "verbs": ["create", "patch"]}]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": ns}]
    egress = objs["NetworkPolicy", "staging-egress"]["spec"]["egress"]
    assert {"ports": [{"protocol": "TCP", "port": 443}]} in egress  # the API server, wherever it is
    for obj in (job, role, binding, objs["ConfigMap", "stage-data-script"]):
        validate_core(obj, k8s_version="1.34")
    validate_custom(objs["RayCluster", "b200-ray-cluster"])


def test_without_wandb_nothing_of_it_is_rendered(synth_stack) -> None:
    result = synth_stack("a4")
    assert not [r.name for r in result.registrations if "wandb" in r.name]
    objs = {(m["kind"], m["metadata"]["name"]): m for m in result.manifests()}
    assert objs["Job", "stage-data"]["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert "WANDB_API_KEY" not in json.dumps(result.manifests())
    egress = objs["NetworkPolicy", "staging-egress"]["spec"]["egress"]
    assert {"ports": [{"protocol": "TCP", "port": 443}]} not in egress


def test_staging_applies_the_key_as_the_secret_and_again_on_rotation(monkeypatch: pytest.MonkeyPatch) -> None:
    state = KubeApiStandIn()
    api = InProcessApi(state)
    keys = iter(["first-key", "rotated-key"])
    monkeypatch.setattr(sd, "read_secret", lambda secret, what: next(keys))
    for expected in ("first-key", "rotated-key"):
        assert sd.copy_wandb_key("projects/p/secrets/wandb-key", "ml", api) == expected
        stored = state.get("/api/v1/namespaces/ml/secrets/wandb-api-key")
        assert stored["type"] == "Opaque"
        assert base64.b64decode(stored["data"]["api-key"]).decode() == expected


def test_a_secret_without_a_version_fails_staging_at_once_saying_how_to_add_it(monkeypatch) -> None:
    monkeypatch.setattr(sd, "read_secret", lambda secret, what: None)
    with pytest.raises(sd.StagingError) as caught:
        sd.copy_wandb_key("projects/p/secrets/wandb-key", "ml", InProcessApi(KubeApiStandIn()))
    assert caught.value.permanent
    assert str(caught.value) == (
        "projects/p/secrets/wandb-key has no version, and trainer.logger has wandb: add the API key with "
        "`gcloud secrets versions add wandb-key --project p --data-file=-`, then `pulumi up` again")


def test_the_job_arguments_are_accepted_by_the_script(wandb_stack: synth.SynthResult) -> None:
    [job] = [m for m in wandb_stack.manifests() if m["kind"] == "Job"]
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    settings = sd.parse_args(command[4:])
    assert (settings.wandb_key_secret, settings.namespace) == (
        f"projects/{stack_project(wandb_stack)}/secrets/{KEY_SECRET}", job["metadata"]["namespace"])


def test_preflight_refuses_a_secret_that_does_not_exist() -> None:
    cfg = load_config({**BASE_CONFIG, **WANDB})

    def invoke(token: str, args: dict[str, Any]) -> dict[str, Any]:
        assert (token, args) == (SECRET, {"project": "my-project-123", "secretId": KEY_SECRET})
        raise RuntimeError("invocation of gcp:secretmanager/getSecret:getSecret returned an error: googleapi: "
                           "Error 404: Secret [projects/1/secrets/wandb-key] not found or has no versions.")

    result = PreflightResult()
    wandb_secret_check(cfg, invoke, result)
    assert result.problems == [
        'verl-gke:wandbApiKeySecret = "wandb-key": no such secret in project my-project-123: create it with '
        "`gcloud secrets create wandb-key --project my-project-123`, then add the key with `gcloud secrets versions "
        "add wandb-key --project my-project-123 --data-file=-`"]
    found = PreflightResult()
    wandb_secret_check(cfg, lambda token, args: {"name": "projects/my-project-123/secrets/wandb-key"}, found)
    assert (found.problems, found.checks) == ([], [
        "wandb: Secret Manager secret projects/my-project-123/secrets/wandb-key exists"])


def test_the_script_finds_its_modules_where_the_config_map_mounts_them(tmp_path) -> None:
    # As the pod runs it: `python /opt/verl-gke/stage_data.py`, the volume's items under that folder, nothing
    # of this repository on the path (-I).
    cm = staging.script_config_map(namespace="ml", script=Path(sd.__file__).read_text(),
                                   kube=Path(kube.__file__).read_text(), gcs=Path(gcs.__file__).read_text(),
                                   shared=Path(staged.__file__).read_text())
    [volume] = [v for v in staging.staging_job(SPEC)["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
    for item in volume["configMap"]["items"]:
        (tmp_path / item["path"]).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / item["path"]).write_text(cm["data"][item["key"]])
    probe = (f"import runpy, sys; sys.path.insert(0, {str(tmp_path)!r}); runpy.run_path({str(tmp_path / SCRIPT)!r}); "
             "import workloads.kube as k, workloads.gcs as g, domain.staged as d; print(k.__file__, g.__file__, "
             "d.__file__)")
    done = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(tmp_path / "workloads" / "kube.py"), str(tmp_path / "workloads" / "gcs.py"),
                                   str(tmp_path / "domain" / "staged.py")]


def test_synth_lists_the_secret_check_and_answers_it_from_cloud() -> None:
    """Through run_preflight, as `pulumi preview` makes it: offline it is listed as not made; `--cloud` answers it."""
    import pulumi

    from domain.preflight import CHECKS

    offline = synth.run("a4", overrides=WANDB)
    assert SECRET in offline.unchecked
    assert f"  {CHECKS[SECRET]} ({SECRET})" in synth.summary(offline, Path("dist")).splitlines()
    with pytest.raises(pulumi.RunError) as caught:
        synth.run("a4", overrides=WANDB, cloud={SECRET: {"error": "googleapi: Error 404: Secret not found"}})
    project = stack_project(offline)
    assert (f'verl-gke:wandbApiKeySecret = "wandb-key": no such secret in project {project}: create it with '
            f"`gcloud secrets create wandb-key --project {project}`") in str(caught.value)
    found = synth.run("a4", overrides=WANDB, cloud={SECRET: {"name": f"projects/{project}/secrets/wandb-key"}})
    assert SECRET not in found.unchecked
    assert f"wandb: Secret Manager secret projects/{project}/secrets/wandb-key exists" in found.outputs[
        "preflightChecks"]
