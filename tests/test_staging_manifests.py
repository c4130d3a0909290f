"""The staging Job and its script ConfigMap: placement, mounts, identity, token, pins, schema."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys

import re
import subprocess
from pathlib import Path

import pytest

from manifests import staging, storage
from tests.k8s_schema import validate_core
from workloads import stage_data

SCRIPT_TEXT = Path(stage_data.__file__).read_text()

SPEC = staging.StagingSpec(
    namespace="ml",
    service_account="verl-ray",
    claim_name="training-bucket-pvc-0123456789",
    model_repo="Qwen/Qwen2.5-32B-Instruct",
    model_revision="5ede1c97bbab6ce5cda5812749b4c0bdf79b18dd",
    model_dir="Qwen2.5-32B-Instruct",
    dataset_repo="openai/gsm8k",
    dataset_revision="740312add88f781978c0658806c59bc2815b9866",
    dataset_config="main",
    script_digest=staging.script_digest({"stage_data.py": SCRIPT_TEXT}),
    deadline_seconds=10800,
)


@pytest.fixture
def job() -> dict:
    return staging.staging_job(SPEC)


def _pod(job: dict) -> dict:
    return job["spec"]["template"]["spec"]


def _container(job: dict) -> dict:
    (container,) = _pod(job)["containers"]
    return container


def test_config_map_carries_the_script() -> None:
    cm = staging.script_config_map(namespace="ml", script=SCRIPT_TEXT, kube="# kube", gcs="# gcs", shared="# staged")
    assert cm == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "stage-data-script",
            "namespace": "ml",
            "labels": {"app.kubernetes.io/name": "verl-gke", "app.kubernetes.io/component": "data-staging"},
        },
        "data": {"stage_data.py": SCRIPT_TEXT, "kube.py": "# kube", "gcs.py": "# gcs", "staged.py": "# staged",
                 "requirements.txt": staging.requirements_text()},
    }


def test_job_identity_and_lifecycle(job: dict) -> None:
    assert job["apiVersion"] == "batch/v1"
    assert job["kind"] == "Job"
    assert job["metadata"]["name"] == "stage-data"
    assert job["metadata"]["namespace"] == "ml"
    assert job["metadata"]["annotations"] == {"pulumi.com/replaceUnready": "true"}
    assert job["spec"]["backoffLimit"] == 3
    assert job["spec"]["activeDeadlineSeconds"] == 10800
    # Pulumi owns the Job's lifetime: a TTL would delete it and make Pulumi recreate it.
    assert "ttlSecondsAfterFinished" not in job["spec"]
    assert _pod(job)["restartPolicy"] == "Never"


def test_permanent_failures_fail_the_job_at_once(job: dict) -> None:
    assert job["spec"]["podFailurePolicy"] == {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": "stage-data", "operator": "In", "values": [stage_data.EXIT_PERMANENT]},
            },
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        ]
    }


def test_job_never_lands_on_a_gpu_node(job: dict) -> None:
    assert _pod(job)["affinity"] == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "cloud.google.com/gke-accelerator", "operator": "DoesNotExist"}]}
                ]
            }
        }
    }
    assert "nodeSelector" not in _pod(job)
    assert "tolerations" not in _pod(job)
    assert "nvidia.com/gpu" not in str(_container(job)["resources"])


def test_job_mounts_the_bucket_with_the_gcsfuse_sidecar(job: dict) -> None:
    annotations = job["spec"]["template"]["metadata"]["annotations"]
    assert annotations["gke-gcsfuse/volumes"] == "true"
    assert annotations["gke-gcsfuse/cpu-limit"] == "2"
    assert annotations["gke-gcsfuse/memory-limit"] == "2Gi"
    assert _pod(job)["serviceAccountName"] == "verl-ray"
    assert {"name": "training-bucket-vol", "persistentVolumeClaim": {"claimName": "training-bucket-pvc-0123456789"}} in _pod(job)[
        "volumes"
    ]
    assert {"name": "training-bucket-vol", "mountPath": "/data"} in _container(job)["volumeMounts"]


def test_script_is_mounted_from_the_config_map_and_run_by_path(job: dict) -> None:
    # The modules it imports beside it as their packages' modules (workloads.kube, workloads.gcs, domain.staged).
    assert {"name": "script", "configMap": {"name": "stage-data-script", "defaultMode": 0o444, "items": [
        {"key": "stage_data.py", "path": "stage_data.py"}, {"key": "requirements.txt", "path": "requirements.txt"},
        {"key": "kube.py", "path": "workloads/kube.py"}, {"key": "gcs.py", "path": "workloads/gcs.py"},
        {"key": "staged.py", "path": "domain/staged.py"}]}} in _pod(job)["volumes"]
    assert {"name": "script", "mountPath": "/opt/verl-gke", "readOnly": True} in _container(job)["volumeMounts"]
    command = _container(job)["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    assert command[2].endswith('exec python /opt/verl-gke/stage_data.py "$@"\n')
    assert command[3] == "stage-data"


def test_script_arguments(job: dict) -> None:
    assert _container(job)["command"][4:] == [
        "--model-repo", "Qwen/Qwen2.5-32B-Instruct",
        "--model-revision", "5ede1c97bbab6ce5cda5812749b4c0bdf79b18dd",
        "--model-dir", "Qwen2.5-32B-Instruct",
        "--dataset-repo", "openai/gsm8k",
        "--dataset-config", "main",
        "--dataset-revision", "740312add88f781978c0658806c59bc2815b9866",
        "--data-root", "/data",
        "--workers", "8",
    ]


def test_arguments_are_accepted_by_the_script(job: dict) -> None:
    settings = stage_data.parse_args(_container(job)["command"][4:])
    assert settings.model_dir == "Qwen2.5-32B-Instruct"
    assert str(settings.data_root) == "/data"


def test_shell_passes_arguments_through_untouched(tmp_path: Path) -> None:
    # Run the Job's shell program with pip and python swapped for echoes: hostile arguments
    # arrive as single, unexpanded words.
    program = staging.staging_job(SPEC)["spec"]["template"]["spec"]["containers"][0]["command"][2]
    program = program.replace("pip install", "true").replace("exec python", "printf '%s\\n'")
    out = subprocess.run(
        ["/bin/sh", "-c", program, "stage-data", "--model-dir", "$(touch pwned) x;y"],
        capture_output=True, text=True, cwd=tmp_path, check=True, timeout=30,
    ).stdout
    assert out.splitlines() == ["/opt/verl-gke/stage_data.py", "--model-dir", "$(touch pwned) x;y"]
    assert not (tmp_path / "pwned").exists()


def test_the_token_is_read_from_secret_manager_never_from_the_pod_spec(job: dict) -> None:
    assert "HF_TOKEN" not in {e["name"] for e in _container(job)["env"]}
    assert "--hf-token-secret" not in _container(job)["command"]
    secret = "projects/my-project-123/secrets/verl-gke-a4-hf-token"
    command = _container(staging.staging_job(dataclasses.replace(SPEC, hf_token_secret=secret)))["command"]
    assert command[-2:] == ["--hf-token-secret", secret]


def test_download_settings(job: dict) -> None:
    env = {e["name"]: e.get("value") for e in _container(job)["env"]}
    assert env["HF_HUB_DISABLE_XET"] == "1"
    assert env["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert env["PYTHONPATH"] == "/tmp/pydeps"
    assert env["HOME"] == "/tmp"
    assert env["PYTHONUNBUFFERED"] == "1"


def test_image_and_packages_are_pinned(job: dict) -> None:
    assert _container(job)["image"] == (
        "python:3.11.13-slim-bookworm@sha256:86adf8dbadc3d6e82ee5dd2c74bec2e1c2467cdad47886280501df722372d2e1")
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-[a-z]+@sha256:[0-9a-f]{64}", staging.IMAGE)
    for req in staging.PIP_REQUIREMENTS:
        assert re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][A-Za-z0-9.]*", req), req
    names = {req.split("==")[0].lower().replace("_", "-") for req in staging.PIP_REQUIREMENTS}
    assert {"huggingface-hub", "pyarrow"} <= names
    install = _container(job)["command"][2].splitlines()[1]
    assert install.startswith("pip install --quiet --no-cache-dir --disable-pip-version-check --no-deps ")
    assert install.endswith(" -r /opt/verl-gke/requirements.txt")


def test_runs_as_non_root_with_a_read_only_root(job: dict) -> None:
    assert _pod(job)["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert _container(job)["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}} in _pod(job)["volumes"]
    assert {"name": "tmp", "mountPath": "/tmp"} in _container(job)["volumeMounts"]


def test_resources(job: dict) -> None:
    assert _container(job)["resources"] == {
        "requests": {"cpu": "2", "memory": "4Gi", "ephemeral-storage": "2Gi"},
        "limits": {"memory": "4Gi", "ephemeral-storage": "2Gi"},
    }


def test_new_script_changes_the_pod_template() -> None:
    def digest_annotation(script: str) -> str:
        spec = staging.StagingSpec(**{**SPEC.__dict__, "script_digest": staging.script_digest({"s": script})})
        return staging.staging_job(spec)["spec"]["template"]["metadata"]["annotations"]["verl-gke/script-sha256"]

    assert digest_annotation(SCRIPT_TEXT) != digest_annotation(SCRIPT_TEXT + "\n")
    # Of every file the ConfigMap carries: a change to any module the script loads runs the Job again.
    files = staging.script_config_map(namespace="ml", script="s", kube="k", gcs="g", shared="d")["data"]
    assert staging.script_digest(files) == hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    assert len({staging.script_digest({**files, key: files[key] + "#"}) for key in files} | {
        staging.script_digest(files)}) == 1 + len(files) == 6


def test_names_shared_with_storage(job: dict) -> None:
    assert storage.MOUNT_PATH == "/data"
    assert _pod(job)["volumes"][1] == storage.claim_volume(SPEC.claim_name)


@pytest.mark.parametrize(
    "obj",
    [staging.staging_job(SPEC),
     staging.script_config_map(namespace="ml", script=SCRIPT_TEXT, kube="# kube", gcs="# gcs", shared="# staged")],
    ids=lambda o: o["kind"],
)
def test_objects_validate_for_kubernetes_1_34(obj: dict) -> None:
    validate_core(obj, k8s_version="1.34")


def test_schema_check_rejects_a_misspelt_field(job: dict) -> None:
    job["spec"]["backofLimit"] = 3
    with pytest.raises(AssertionError, match="backofLimit"):
        validate_core(job, k8s_version="1.34")


def test_the_jobs_packages_install_by_hash_only() -> None:
    program = staging.staging_job(SPEC)["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert ("--no-deps --only-binary=:all: --require-hashes --target /tmp/pydeps "
            "-r /opt/verl-gke/requirements.txt\n") in program
    lines = staging.requirements_text().splitlines()
    assert [line.split(" ")[0] for line in lines] == list(staging.PIP_REQUIREMENTS)
    for line in lines:
        hashes = [part for part in line.split(" ")[1:]]
        assert hashes and all(re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", h) for h in hashes), line
    # The two compiled wheels carry an x86_64 and an aarch64 hash: the image is multi-arch.
    assert {line.split(" ")[0] for line in lines if line.count("--hash") == 2} == {"pyarrow==26.0.1", "PyYAML==6.0.4"}


def test_pip_refuses_a_file_whose_hash_differs(tmp_path: Path) -> None:
    """pip's own hash check, run on the Job's requirement line shape against a local wheel."""
    wheel = tmp_path / "demo_pkg-1.0-py3-none-any.whl"
    import zipfile
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("demo_pkg/__init__.py", "")
        zf.writestr("demo_pkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n")
        zf.writestr("demo_pkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("demo_pkg-1.0.dist-info/RECORD", "")
    req = tmp_path / "req.txt"
    req.write_text("demo-pkg==1.0 --hash=sha256:" + "0" * 64 + "\n")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--isolated", "--no-index", "--find-links", str(tmp_path),
                           "--no-deps", "--only-binary=:all:", "--require-hashes", "--target", str(tmp_path / "t"),
                           "-r", str(req)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "THESE PACKAGES DO NOT MATCH THE HASHES" in done.stderr
