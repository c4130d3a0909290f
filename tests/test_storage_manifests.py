"""The bucket's Kubernetes objects against the tutorial's gcsfuse-storage.yaml and kubectl steps."""

from __future__ import annotations

import pytest

from manifests import storage
from tests.k8s_schema import validate_core

BUCKET = "verl-data-my-project"

# gcsfuse-storage.yaml, verbatim and in order.
TUTORIAL_MOUNT_OPTIONS = [
    "implicit-dirs",
    "metadata-cache:negative-ttl-secs:0",
    "metadata-cache:ttl-secs:0",
    "metadata-cache:stat-cache-max-size-mb:-1",
    "metadata-cache:type-cache-max-size-mb:-1",
    "file-cache:max-size-mb:-1",
    "file-cache:cache-file-for-range-read:true",
    "file-cache:enable-parallel-downloads:true",
    "read_ahead_kb=1024",
    "write:enable-streaming-writes:true",
    "write:global-max-blocks:200000",
]
# The one change: the tutorial's unbounded file cache, bounded to what the sidecar's cache volume holds.
OUR_MOUNT_OPTIONS = [o if o != "file-cache:max-size-mb:-1" else "file-cache:max-size-mb:204800"
                     for o in TUTORIAL_MOUNT_OPTIONS]


def test_volume_matches_the_tutorial() -> None:
    pv = storage.persistent_volume(bucket=BUCKET, namespace="default")
    assert pv == {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": "training-bucket-pv"},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "capacity": {"storage": "768Gi"},
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "gcsfuse-sc",
            "claimRef": {"namespace": "default", "name": "training-bucket-pvc"},
            "mountOptions": OUR_MOUNT_OPTIONS,
            "csi": {
                "driver": "gcsfuse.csi.storage.gke.io",
                "volumeHandle": BUCKET,
                "volumeAttributes": {
                    "skipCSIBucketAccessCheck": "true",
                    "gcsfuseMetadataPrefetchOnMount": "true",
                },
            },
        },
    }


def test_file_cache_fits_its_volume() -> None:
    # 200 GiB of cache on a 220Gi volume: gcsfuse evicts its own files before kubelet evicts the pod.
    assert storage.cache_volume() == {"name": "gke-gcsfuse-cache", "emptyDir": {"sizeLimit": "220Gi"}}


def test_sidecar_on_standard_reserves_room_and_lifts_limits() -> None:
    assert storage.sidecar_annotations(autopilot=False) == {
        "gke-gcsfuse/volumes": "true",
        "gke-gcsfuse/cpu-request": "1", "gke-gcsfuse/memory-request": "4Gi",
        "gke-gcsfuse/ephemeral-storage-request": "10Gi",
        "gke-gcsfuse/cpu-limit": "0", "gke-gcsfuse/memory-limit": "0", "gke-gcsfuse/ephemeral-storage-limit": "0",
    }


def test_sidecar_on_autopilot_has_limits_equal_to_requests() -> None:
    # Autopilot takes no "0" (no limit).
    annotations = storage.sidecar_annotations(autopilot=True)
    for resource in ("cpu", "memory", "ephemeral-storage"):
        assert annotations[f"gke-gcsfuse/{resource}-limit"] == annotations[f"gke-gcsfuse/{resource}-request"] != "0"


def test_volume_has_all_eleven_mount_options() -> None:
    assert len(storage.persistent_volume(bucket=BUCKET, namespace="ns")["spec"]["mountOptions"]) == 11


def test_volume_keeps_the_bucket_when_released() -> None:
    # Retain, not the tutorial's Delete: checkpoints outlive the claim.
    assert storage.persistent_volume(bucket=BUCKET, namespace="ns")["spec"]["persistentVolumeReclaimPolicy"] == "Retain"


def test_capacity_is_configurable_on_both_volume_and_claim() -> None:
    pv = storage.persistent_volume(bucket=BUCKET, namespace="ml", capacity="2Ti")
    pvc = storage.persistent_volume_claim(namespace="ml", capacity="2Ti")
    assert pv["spec"]["capacity"] == {"storage": "2Ti"}
    assert pvc["spec"]["resources"] == {"requests": {"storage": "2Ti"}}


def test_builders_return_fresh_objects() -> None:
    pv = storage.persistent_volume(bucket=BUCKET, namespace="ns")
    pv["spec"]["mountOptions"].append("ro")
    pv["spec"]["csi"]["volumeAttributes"]["x"] = "y"
    again = storage.persistent_volume(bucket=BUCKET, namespace="ns")
    assert again["spec"]["mountOptions"] == OUR_MOUNT_OPTIONS
    assert "x" not in again["spec"]["csi"]["volumeAttributes"]


def test_claim_is_bound_to_the_volume_by_name() -> None:
    assert storage.persistent_volume_claim(namespace="ml") == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "training-bucket-pvc", "namespace": "ml"},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "768Gi"}},
            "storageClassName": "gcsfuse-sc",
            "volumeName": "training-bucket-pv",
        },
    }


def test_service_account() -> None:
    assert storage.service_account(name="verl-ksa", namespace="ml") == {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "verl-ksa", "namespace": "ml"},
    }


def test_namespace_carries_pod_security_labels_pinned_to_a_version() -> None:
    assert storage.namespace("verl-gke") == {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": "verl-gke", "labels": {
            "pod-security.kubernetes.io/enforce": "privileged", "pod-security.kubernetes.io/enforce-version": "v1.34",
            "pod-security.kubernetes.io/warn": "baseline", "pod-security.kubernetes.io/warn-version": "v1.34",
            "pod-security.kubernetes.io/audit": "baseline", "pod-security.kubernetes.io/audit-version": "v1.34"}}}


def test_claim_volume_and_its_mount() -> None:
    assert storage.claim_volume() == {
        "name": "training-bucket-vol",
        "persistentVolumeClaim": {"claimName": "training-bucket-pvc"},
    }
    assert storage.claim_volume("other-pvc") == {
        "name": "training-bucket-vol",
        "persistentVolumeClaim": {"claimName": "other-pvc"},
    }
    assert storage.bucket_mount() == {"name": "training-bucket-vol", "mountPath": "/data"}


@pytest.mark.parametrize(
    "obj",
    [
        storage.persistent_volume(bucket=BUCKET, namespace="default"),
        storage.persistent_volume_claim(namespace="default"),
        storage.service_account(name="verl-ksa", namespace="default"),
        storage.namespace("verl-gke"),
    ],
    ids=lambda o: o["kind"],
)
def test_objects_validate_for_kubernetes_1_34(obj: dict) -> None:
    validate_core(obj, k8s_version="1.34")
