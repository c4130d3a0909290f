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
    generation = storage.volume_generation(bucket=BUCKET, namespace="default")
    assert pv == {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"training-bucket-pv-{generation}"},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "capacity": {"storage": "768Gi"},
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "gcsfuse-sc",
            "claimRef": {"namespace": "default", "name": f"training-bucket-pvc-{generation}"},
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
    pvc = storage.persistent_volume_claim(bucket=BUCKET, namespace="ml", capacity="2Ti")
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
    generation = storage.volume_generation(bucket=BUCKET, namespace="ml")
    assert storage.persistent_volume_claim(bucket=BUCKET, namespace="ml") == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": f"training-bucket-pvc-{generation}", "namespace": "ml"},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "768Gi"}},
            "storageClassName": "gcsfuse-sc",
            "volumeName": f"training-bucket-pv-{generation}",
        },
    }


def test_a_generation_is_stable_across_releases() -> None:
    """Pinned: another digest for the same bucket renames the volume on every deployed stack, and
    with it replaces the RayCluster and restarts the run at the next `pulumi up`."""
    assert storage.volume_names(bucket=BUCKET, namespace="verl-gke") == (
        "training-bucket-pv-5be1ec7699", "training-bucket-pvc-5be1ec7699")


def _names(**overrides: str) -> tuple[str, str]:
    return storage.volume_names(**{"bucket": BUCKET, "namespace": "ml", "capacity": "768Gi", **overrides})


@pytest.mark.parametrize("overrides", [{"bucket": "another-bucket"}, {"namespace": "other"}, {"capacity": "1Ti"}],
                         ids=lambda o: next(iter(o)))
def test_what_cannot_change_in_place_names_a_new_generation(overrides: dict[str, str]) -> None:
    """The volume's `csi` and the claim's namespace, access modes and class are pulumi-kubernetes'
    replace keys (diff.go `forceNew`); the API server refuses to resize a claim that no StorageClass
    provisions (the PersistentVolumeClaimResize admission plugin)."""
    (pv, pvc), (new_pv, new_pvc) = _names(), _names(**overrides)
    assert new_pv != pv and new_pvc != pvc
    assert new_pv.removeprefix("training-bucket-pv-") == new_pvc.removeprefix("training-bucket-pvc-")


@pytest.mark.parametrize("constant,value", [
    ("VOLUME_ATTRIBUTES", {**storage.VOLUME_ATTRIBUTES, "gcsfuseMetadataPrefetchOnMount": "false"}),
    ("CSI_DRIVER", "other.csi.example.com"),
    ("STORAGE_CLASS", "other-sc"),
])
def test_a_new_volume_source_or_claim_class_names_a_new_generation(monkeypatch, constant: str, value: object) -> None:
    before = _names()
    monkeypatch.setattr(storage, constant, value)
    assert _names()[0] != before[0] and _names()[1] != before[1]


@pytest.mark.parametrize("constant,value", [
    ("GCSFUSE_MOUNT_OPTIONS", ("implicit-dirs",)),
    ("RECLAIM_POLICY", "Delete"),
])
def test_what_updates_in_place_keeps_the_generation(monkeypatch, constant: str, value: object) -> None:
    """Mount options and the reclaim policy are no replace keys: the volume is updated, its pods kept."""
    before = _names()
    monkeypatch.setattr(storage, constant, value)
    assert _names() == before


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
    assert storage.claim_volume("other-pvc") == {
        "name": "training-bucket-vol",
        "persistentVolumeClaim": {"claimName": "other-pvc"},
    }
    assert storage.bucket_mount() == {"name": "training-bucket-vol", "mountPath": "/data"}


@pytest.mark.parametrize(
    "obj",
    [
        storage.persistent_volume(bucket=BUCKET, namespace="default"),
        storage.persistent_volume_claim(bucket=BUCKET, namespace="default"),
        storage.service_account(name="verl-ksa", namespace="default"),
        storage.namespace("verl-gke"),
    ],
    ids=lambda o: o["kind"],
)
def test_objects_validate_for_kubernetes_1_34(obj: dict) -> None:
    validate_core(obj, k8s_version="1.34")
