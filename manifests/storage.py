"""The training bucket as Kubernetes sees it: a GCS FUSE volume, its claim, the service account
that may use it, and the Hugging Face token Secret.

Spec: the tutorial's "Prepare data and storage" section and its gcsfuse-storage.yaml.
Pure builders: plain data in, dicts out, no Pulumi.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from domain.bucket import DEFAULT_CAPACITY, MOUNT_PATH
from domain.platforms import AUTOPILOT_SIDECAR

PV_PREFIX = "training-bucket-pv"
PVC_PREFIX = "training-bucket-pvc"
"""The tutorial's names, followed here by the volume's generation (`volume_generation`)."""
STORAGE_CLASS = "gcsfuse-sc"
CSI_DRIVER = "gcsfuse.csi.storage.gke.io"
BUCKET_VOLUME = "training-bucket-vol"
"""The pod volume that mounts the training claim, in every pod that reads or writes the bucket."""
GCSFUSE_POD_ANNOTATION = {"gke-gcsfuse/volumes": "true"}
"""Asks GKE to inject the gcsfuse sidecar into a pod that mounts the volume."""

CACHE_VOLUME = "gke-gcsfuse-cache"
"""The pod volume GKE's sidecar keeps its file cache in, instead of its own ephemeral storage
(where the tutorial's unbounded cache would get the pod evicted while reading the 66 GB model)."""
FILE_CACHE_GI = 200
"""File cache bound: the model (66 GB) and the dataset with room to spare, well inside the workers'
500-1000Gi of Local SSD ephemeral storage. The head and staging read only small files."""
_CACHE_VOLUME_GI = FILE_CACHE_GI * 11 // 10  # gcsfuse's own files beside the cached data

# gcsfuse-storage.yaml, in the tutorial's order: metadata caches and a file cache (bounded here, on
# its own volume) with parallel downloads for reading the model on every node, streaming writes for
# checkpoints.
GCSFUSE_MOUNT_OPTIONS: tuple[str, ...] = (
    "implicit-dirs",
    "metadata-cache:negative-ttl-secs:0",
    "metadata-cache:ttl-secs:0",
    "metadata-cache:stat-cache-max-size-mb:-1",
    "metadata-cache:type-cache-max-size-mb:-1",
    f"file-cache:max-size-mb:{FILE_CACHE_GI * 1024}",
    "file-cache:cache-file-for-range-read:true",
    "file-cache:enable-parallel-downloads:true",
    "read_ahead_kb=1024",
    "write:enable-streaming-writes:true",
    "write:global-max-blocks:200000",
)

VOLUME_ATTRIBUTES: dict[str, str] = {
    "skipCSIBucketAccessCheck": "true",
    "gcsfuseMetadataPrefetchOnMount": "true",
}

# The tutorial says Delete. Retain instead: the bucket holds the checkpoints of a paid training
# run, and its lifetime belongs to the GCS bucket resource (force_destroy), not to whether a
# claim happens to be deleted (a new generation deletes the old claim and volume). The PV object
# itself is still removed by `pulumi destroy` and by a new generation.
RECLAIM_POLICY = "Retain"


def _csi(bucket: str) -> dict[str, Any]:
    return {"driver": CSI_DRIVER, "volumeHandle": bucket, "volumeAttributes": dict(VOLUME_ATTRIBUTES)}


def _claim_request(capacity: str) -> dict[str, Any]:
    return {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": capacity}},
            "storageClassName": STORAGE_CLASS}


def volume_generation(*, bucket: str, namespace: str, capacity: str = DEFAULT_CAPACITY) -> str:
    """10 hex digits of everything the volume and its claim cannot change in place: the volume's `csi`
    source (the bucket and its attributes) and the claim's namespace, access modes and class, which
    pulumi-kubernetes replaces them for (provider/pkg/provider/diff.go, `forceNew`), and the size,
    which the API server refuses to change on a claim no StorageClass provisions. Both are named by
    it: their replacement then creates the new pair beside the old one, which goes only once nothing
    mounts it (a fixed name would be deleted first, and wait on its protection finalizers)."""
    fixed = {"csi": _csi(bucket), "namespace": namespace, "claim": _claim_request(capacity)}
    return hashlib.sha256(json.dumps(fixed, sort_keys=True).encode()).hexdigest()[:10]


def volume_names(*, bucket: str, namespace: str, capacity: str = DEFAULT_CAPACITY) -> tuple[str, str]:
    """(volume, claim) of that generation, e.g. (`training-bucket-pv-0123456789`, `training-bucket-pvc-0123456789`)."""
    generation = volume_generation(bucket=bucket, namespace=namespace, capacity=capacity)
    return f"{PV_PREFIX}-{generation}", f"{PVC_PREFIX}-{generation}"


def persistent_volume(*, bucket: str, namespace: str, capacity: str = DEFAULT_CAPACITY) -> dict[str, Any]:
    """The tutorial's GCS FUSE volume over `bucket`, reserved for the training claim in `namespace`."""
    pv_name, pvc_name = volume_names(bucket=bucket, namespace=namespace, capacity=capacity)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "capacity": {"storage": capacity},
            "persistentVolumeReclaimPolicy": RECLAIM_POLICY,
            "storageClassName": STORAGE_CLASS,
            # A PV is cluster-wide: reserve it for our claim so no other claim can bind it first.
            "claimRef": {"namespace": namespace, "name": pvc_name},
            "mountOptions": list(GCSFUSE_MOUNT_OPTIONS),
            "csi": _csi(bucket),
        },
    }


def persistent_volume_claim(*, bucket: str, namespace: str, capacity: str = DEFAULT_CAPACITY) -> dict[str, Any]:
    """The claim every Ray pod and the staging Job mount, bound to the training volume by name."""
    pv_name, pvc_name = volume_names(bucket=bucket, namespace=namespace, capacity=capacity)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": pvc_name, "namespace": namespace},
        "spec": {**_claim_request(capacity), "volumeName": pv_name},
    }


def service_account(*, name: str, namespace: str) -> dict[str, Any]:
    """The Kubernetes service account that Workload Identity lets into the bucket (no GSA needed)."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": namespace},
    }


POD_SECURITY_VERSION = "v1.34"
"""Pod Security Standards version the labels pin, so a GKE upgrade never changes what is admitted."""
POD_SECURITY = {"enforce": "privileged", "warn": "baseline", "audit": "baseline"}
"""Pod Security admission levels of the stack's namespace. The GPU workers cannot meet `baseline`:
they mount the host's NVIDIA driver and gIB plugin (hostPath) and add IPC_LOCK (RDMA memory
registration), so `enforce` is `privileged`; `warn` and `audit` at `baseline` name every pod that
goes beyond those two needs."""


def namespace(name: str) -> dict[str, Any]:
    """The stack's own namespace, with Pod Security admission labels."""
    labels = {}
    for mode, level in POD_SECURITY.items():
        labels[f"pod-security.kubernetes.io/{mode}"] = level
        labels[f"pod-security.kubernetes.io/{mode}-version"] = POD_SECURITY_VERSION
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def claim_volume(claim_name: str) -> dict[str, Any]:
    """The pod volume of the training claim."""
    return {"name": BUCKET_VOLUME, "persistentVolumeClaim": {"claimName": claim_name}}


def cache_volume() -> dict[str, Any]:
    """The sidecar's file cache volume, on the node's ephemeral storage (Local SSD on GPU nodes)."""
    return {"name": CACHE_VOLUME, "emptyDir": {"sizeLimit": f"{_CACHE_VOLUME_GI}Gi"}}


def bucket_volumes(claim_name: str) -> list[dict[str, Any]]:
    """What a pod that mounts the bucket needs: the claim and the sidecar's cache volume."""
    return [claim_volume(claim_name), cache_volume()]


def sidecar_annotations(autopilot: bool) -> dict[str, str]:
    """Inject the gcsfuse sidecar, sized per GKE's guidance for training: requests reserve its room on
    the node; on Standard "0" lifts the limits (a memory limit would kill it mid-checkpoint, with
    streaming writes buffered in memory); Autopilot has no "0" and sets limits equal to requests."""
    if autopilot:
        car = AUTOPILOT_SIDECAR
        sizes = {"cpu": str(car.cpu), "memory": f"{car.memory_gi}Gi", "ephemeral-storage": f"{car.ephemeral_gi}Gi"}
        limits = sizes
    else:
        sizes = {"cpu": "1", "memory": "4Gi", "ephemeral-storage": "10Gi"}
        limits = {name: "0" for name in sizes}
    return {
        **GCSFUSE_POD_ANNOTATION,
        **{f"gke-gcsfuse/{name}-request": value for name, value in sizes.items()},
        **{f"gke-gcsfuse/{name}-limit": value for name, value in limits.items()},
    }


def bucket_mount() -> dict[str, str]:
    """A container's mount of that volume at /data."""
    return {"name": BUCKET_VOLUME, "mountPath": MOUNT_PATH}
