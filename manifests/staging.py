"""The staging Job that fills the bucket with the model and GSM8K, and the ConfigMap carrying its
program (workloads/stage_data.py).

Replaces the tutorial's "Prepare the model and data" section (download to a laptop, upload to the
bucket) with a Job on a CPU node that writes through the bucket mount; it also stages verl.
Pure builders: plain data in, dicts out, no Pulumi.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from domain import staged
from domain.platforms import VerlRelease
from manifests import storage
from workloads import stage_data

JOB_NAME = "stage-data"
CONFIG_MAP_NAME = "stage-data-script"
CONTAINER_NAME = "stage-data"
SCRIPT_DIR = "/opt/verl-gke"
SCRIPT_FILE = "stage_data.py"
KUBE_FILE = "kube.py"
"""workloads/kube.py, mounted as SCRIPT_DIR/workloads/kube.py: the script's Kubernetes client (wandb's key)."""
GCS_FILE = "gcs.py"
"""workloads/gcs.py, mounted as SCRIPT_DIR/workloads/gcs.py: the script's GCS client (gs:// dataDir's copy)."""
SHARED_FILE = "staged.py"
"""domain/staged.py, mounted as SCRIPT_DIR/domain/staged.py: the names, checks and wheel download the script
shares with the program."""
SCRIPT_DIGEST_ANNOTATION = "verl-gke/script-sha256"
LABELS = {"app.kubernetes.io/name": "verl-gke", "app.kubernetes.io/component": "data-staging"}

# The official Python image at a fixed patch release, by the digest of its multi-arch index (as
# public Dockerfiles pin it, e.g. `FROM python:3.11.13-slim-bookworm@sha256:86adf8db...`; check with
# `docker buildx imagetools inspect python:3.11.13-slim-bookworm`), so any CPU node will do and a
# re-pushed tag changes nothing.
IMAGE = "python:3.11.13-slim-bookworm@sha256:86adf8dbadc3d6e82ee5dd2c74bec2e1c2467cdad47886280501df722372d2e1"

# huggingface_hub and pyarrow with their whole dependency closure, installed with --no-deps so the
# Job runs exactly these versions. hf-xet is left out on purpose: see HF_HUB_DISABLE_XET below.
PIP_REQUIREMENTS: tuple[str, ...] = (
    "anyio==4.16.0",
    "click==8.5.1",
    "filelock==4.3.1",
    "fsspec==2026.9.0",
    "h11==0.16.0",
    "httpcore2==2.16.2",
    "httpx2==2.16.2",
    "huggingface_hub==2.4.0",
    "idna==3.20",
    "packaging==26.4",
    "pyarrow==26.0.1",
    "PyYAML==6.0.4",
    "tqdm==4.70.1",
    "truststore==0.10.5",
    "typing_extensions==4.16.0",
)
PIP_HASHES: dict[str, tuple[str, ...]] = {
    "anyio==4.16.0": ("c66ae634e0b8228396b801741beb3294326d4b6102f7bba4041c0dfb58c29026",),
    "click==8.5.1": ("8bb5376d2006950386f8c6427613334a2acadc5f559cb80e638d00b4df957e37",),
    "filelock==4.3.1": ("79e43df8e9fe509cd83a3899a7c186c8077cbbe4d200a1ed3705c2f3bb6bc487",),
    "fsspec==2026.9.0": ("8dd6e646e99ea382bd85f97a45e6b526a442d79423a7dc673f1e2756d05fcb5f",),
    "h11==0.16.0": ("63cf8bbe7522de3bf65932fda1d9c2772064ffb3dae62d55932da54b31cb6c86",),
    "httpcore2==2.16.2": ("16051ae2a42f776007543f32de9349a317b23d2cbb4e1456b4bac0e88b87419a",),
    "httpx2==2.16.2": ("f05c13aade4c45dbf1c9060647a1058f0acad62398fad96e741269edb33d46f5",),
    "huggingface_hub==2.4.0": ("42ecfd93ede47bdd333daebbf66a32d7bfe2e18752754fe4d2d4f98a0179d801",),
    "idna==3.20": ("ab7ae7122974553370f0bdb919e1a960b2cd1bc1ef0276416d896db81c14582c",),
    "packaging==26.4": ("81383611a09c1bc0b08b76e0fd5829d7c6824c65b27a6aee339da133f4233ea2",),
    "pyarrow==26.0.1": ("39cb0f2418282c24bea6ceda77b03e5a8f0a5766b63a8bf194d4e2a2c423548c", "22a96a225de107eb9acd1ad9a818198ca832df2a4c0952412f754a7ed2105a98"),
    "PyYAML==6.0.4": ("622aa875fa6533f25fedcffe23079357d65a690d462200afed5d8e9d0e01ebee", "71bb5b87465d88d1dfc577115af6d435bff9b26f2512936f610c26aa55966028"),
    "tqdm==4.70.1": ("c293e525e6fef9c20e8728fd4612df02a0aa31bb5fe91ecd93e123b1b7bffa73",),
    "truststore==0.10.5": ("9aaaedaefaf06d8b206278cf8b5012bc897f485a874503501e12d776df78951c",),
    "typing_extensions==4.16.0": ("481caa481374e813c1b176ada14e97f1f67a4539ce9cfeb3f350d78d6370c2e8",),
}
"""sha256 of the wheel PyPI serves for each requirement (CPython 3.11, manylinux x86_64 and, for the
two compiled ones, aarch64): pip installs them with --require-hashes, so a changed file on the index
fails the Job instead of running beside the bucket's credentials."""
REQUIREMENTS_FILE = "requirements.txt"

RUN_AS = 1000
"""uid and gid of the programs verl-gke ships (staging, the run supervisor): never root."""
_DEPS_DIR = "/tmp/pydeps"
_TMP_VOLUME = "tmp"
_SCRIPT_VOLUME = "script"

BACKOFF_LIMIT = 3

# The main container only downloads and writes through FUSE: a few cores, little memory.
RESOURCES = {
    "requests": {"cpu": "2", "memory": "4Gi", "ephemeral-storage": "2Gi"},
    "limits": {"memory": "4Gi", "ephemeral-storage": "2Gi"},
}
# gcsfuse's sidecar does the uploading: its default 250m CPU / 256Mi would throttle a 66 GB
# upload and leave no room for the streaming-write buffers of parallel shard uploads.
# Its file cache lives in the pod's cache volume, so its own ephemeral storage stays small.
GCSFUSE_SIDECAR_ANNOTATIONS = {"gke-gcsfuse/cpu-limit": "2", "gke-gcsfuse/memory-limit": "2Gi",
                               "gke-gcsfuse/ephemeral-storage-limit": "10Gi"}


@dataclass(frozen=True)
class StagingSpec:
    """What the staging Job stages and where, as plain values."""

    namespace: str
    service_account: str
    """The Kubernetes service account allowed into the bucket."""
    claim_name: str
    """The bucket's claim (manifests.storage.volume_names), mounted at the bucket mount."""
    model_repo: str
    model_revision: str
    """A 40-hex commit of the model repository."""
    model_dir: str
    """Directory under the bucket mount for the model, e.g. Qwen2.5-32B-Instruct."""
    dataset_repo: str
    dataset_revision: str
    dataset_config: str
    script_digest: str
    """sha256 of the script: a new script changes the pod template, so the Job runs again."""
    deadline_seconds: int
    """Kubernetes stops the Job after this long, so it never outlives Pulumi's wait for it."""
    workers: int = stage_data.DEFAULT_WORKERS
    """Files downloaded in parallel."""
    verl: VerlRelease | None = None
    """None when the image or the user's own tree on the bucket provides verl."""
    hf_token_secret: str | None = None
    """`projects/P/secrets/S`: where the Job reads the Hugging Face token (Workload Identity); None: no token."""
    wandb_key_secret: str | None = None
    """`projects/P/secrets/S` holding wandb's API key, which the Job applies as Secret WANDB_SECRET (with the
    pod's Kubernetes token and wandb_role); None: no wandb."""
    user_data: tuple[str, ...] = ()
    """gs:// dataDir's copies (stage_data.USER_DATA_RE), made into `bucket` before anything else."""
    bucket: str | None = None


def script_digest(files: Mapping[str, str]) -> str:
    """Of every file the ConfigMap carries (its `data`): any changing runs the Job again."""
    return hashlib.sha256(json.dumps(dict(files), sort_keys=True).encode()).hexdigest()


def requirements_text() -> str:
    """PIP_REQUIREMENTS with their hashes, as a pip requirements file."""
    return "".join(f"{req}" + "".join(f" --hash=sha256:{sha}" for sha in PIP_HASHES[req]) + "\n"
                   for req in PIP_REQUIREMENTS)


def script_config_map(*, namespace: str, script: str, kube: str, gcs: str, shared: str) -> dict[str, Any]:
    """The ConfigMap holding stage_data.py, workloads/kube.py, workloads/gcs.py, domain/staged.py and the hashed
    requirements, mounted read-only at /opt/verl-gke."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIG_MAP_NAME, "namespace": namespace, "labels": dict(LABELS)},
        "data": {SCRIPT_FILE: script, KUBE_FILE: kube, GCS_FILE: gcs, SHARED_FILE: shared,
                 REQUIREMENTS_FILE: requirements_text()},
    }


def wandb_role(namespace: str) -> dict[str, Any]:
    """Staging may create and patch the one Secret wandb's key goes in, nothing else. Server-side apply's
    create is authorized as `create` with the object's name (kube-apiserver endpoints/handlers/patch.go,
    `createAuthorizerAttributes`), so resourceNames holds it to that name, unlike a POST's."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": f"{JOB_NAME}-wandb-key", "namespace": namespace, "labels": dict(LABELS)},
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [staged.WANDB_SECRET],
                       "verbs": ["create", "patch"]}]}


def wandb_role_binding(namespace: str, service_account: str) -> dict[str, Any]:
    name = wandb_role(namespace)["metadata"]["name"]
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(LABELS)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}]}


def script_args(spec: StagingSpec) -> list[str]:
    """stage_data.py's command line for `spec`."""
    args = [
        "--model-repo", spec.model_repo,
        "--model-revision", spec.model_revision,
        "--model-dir", spec.model_dir,
        "--dataset-repo", spec.dataset_repo,
        "--dataset-config", spec.dataset_config,
        "--dataset-revision", spec.dataset_revision,
        "--data-root", storage.MOUNT_PATH,
        "--workers", str(spec.workers),
    ]
    if spec.verl is not None:
        args += ["--verl-wheel-url", spec.verl.wheel_url, "--verl-wheel-sha256", spec.verl.sha256,
                 "--verl-dir", spec.verl.dir_name]
    if spec.hf_token_secret is not None:
        args += ["--hf-token-secret", spec.hf_token_secret]
    if spec.wandb_key_secret is not None:
        args += ["--wandb-key-secret", spec.wandb_key_secret, "--namespace", spec.namespace]
    if spec.user_data:
        args += ["--bucket", str(spec.bucket), *(a for copy in spec.user_data for a in ("--user-data", copy))]
    return args


def _shell() -> str:
    """Install the pinned packages, then hand over to the script with the arguments after it
    (`sh -c SCRIPT NAME ARGS...`: the arguments never pass through the shell's parser)."""
    return (
        "set -e\n"
        "pip install --quiet --no-cache-dir --disable-pip-version-check --no-deps --only-binary=:all: "
        f"--require-hashes --target {_DEPS_DIR} -r {SCRIPT_DIR}/{REQUIREMENTS_FILE}\n"
        f'exec python {SCRIPT_DIR}/{SCRIPT_FILE} "$@"\n'
    )


def restricted_container() -> dict[str, Any]:
    """A container of a program verl-gke ships: no privilege escalation, read-only root, no capabilities."""
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


def off_gpu_nodes() -> dict[str, Any]:
    """Pod affinity for nodes without GPUs: CPU work never holds (or waits for) a GPU node."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "cloud.google.com/gke-accelerator", "operator": "DoesNotExist"}]}]}}}


def staging_job(spec: StagingSpec) -> dict[str, Any]:
    """A Job on a CPU node that runs stage_data.py against the bucket mounted at /data."""
    env = [
        {"name": "HOME", "value": "/tmp"},
        {"name": "PYTHONPATH", "value": _DEPS_DIR},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        # Plain HTTPS downloads write each file front to back, which is what gcsfuse's streaming
        # writes (a mount option of the tutorial's volume) upload without staging on local disk.
        {"name": "HF_HUB_DISABLE_XET", "value": "1"},
        {"name": "HF_HUB_DISABLE_PROGRESS_BARS", "value": "1"},
        {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
    ]
    container = {
        "name": CONTAINER_NAME,
        "image": IMAGE,
        "command": ["/bin/sh", "-c", _shell(), JOB_NAME, *script_args(spec)],
        "env": env,
        "resources": {kind: dict(values) for kind, values in RESOURCES.items()},
        "securityContext": restricted_container(),
        "volumeMounts": [
            {"name": _SCRIPT_VOLUME, "mountPath": SCRIPT_DIR, "readOnly": True},
            storage.bucket_mount(),
            {"name": _TMP_VOLUME, "mountPath": "/tmp"},
        ],
    }
    pod_spec = {
        "serviceAccountName": spec.service_account,
        # It reaches the Hub and the bucket (through the sidecar); the Kubernetes API only to write wandb's key.
        "automountServiceAccountToken": spec.wandb_key_secret is not None,
        "restartPolicy": "Never",
        # Downloading needs no GPU: keep the Job off GPU nodes, which may still be coming up
        # while it runs and cost far more per hour.
        "affinity": off_gpu_nodes(),
        # Non-root: the GCS FUSE CSI driver turns fsGroup into gid=1000 with group-writable modes
        # on the mount, so the bucket stays writable without root.
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "fsGroup": RUN_AS,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {"name": _SCRIPT_VOLUME, "configMap": {"name": CONFIG_MAP_NAME, "defaultMode": 0o444, "items": [
                {"key": SCRIPT_FILE, "path": SCRIPT_FILE}, {"key": REQUIREMENTS_FILE, "path": REQUIREMENTS_FILE},
                {"key": KUBE_FILE, "path": f"workloads/{KUBE_FILE}"},
                {"key": GCS_FILE, "path": f"workloads/{GCS_FILE}"},
                {"key": SHARED_FILE, "path": f"domain/{SHARED_FILE}"}]}},
            *storage.bucket_volumes(spec.claim_name),
            {"name": _TMP_VOLUME, "emptyDir": {"sizeLimit": RESOURCES["limits"]["ephemeral-storage"]}},
        ],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": JOB_NAME,
            "namespace": spec.namespace,
            "labels": dict(LABELS),
            # A Job that failed in an earlier `pulumi up` is replaced (run again) by the next one
            # instead of being waited on forever.
            "annotations": {"pulumi.com/replaceUnready": "true"},
        },
        "spec": {
            "backoffLimit": BACKOFF_LIMIT,
            "activeDeadlineSeconds": spec.deadline_seconds,
            "podFailurePolicy": {
                "rules": [
                    # stage_data.py's exit status when retrying cannot help (bad argument, missing
                    # repo or revision, token refused): fail the Job at once, not after the retries.
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": CONTAINER_NAME,
                            "operator": "In",
                            "values": [stage_data.EXIT_PERMANENT],
                        },
                    },
                    # A preempted or drained node is not the program's fault: don't count it.
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                ]
            },
            "template": {
                "metadata": {
                    "labels": dict(LABELS),
                    "annotations": {
                        **storage.GCSFUSE_POD_ANNOTATION,
                        **GCSFUSE_SIDECAR_ANNOTATIONS,
                        SCRIPT_DIGEST_ANNOTATION: spec.script_digest,
                    },
                },
                "spec": pod_spec,
            },
        },
    }
