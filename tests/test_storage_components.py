"""GcsFuseStorage and DataStaging under the mock engine: every value the tutorial's "Prepare data and
storage" and "Prepare the model and data" steps fix, the order things wait for each other, and the
Hugging Face token's secret (the token itself never passes through the program)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s
import pytest

from components.data_staging import DataStaging
from domain import staged
from components.gcs_fuse_storage import GcsFuseStorage, ksa_principal
from manifests import staging, storage
from tests.mock_run import MockRun
from verl_gke import synth
from workloads import gcs, kube, stage_data

PROJECT = "my-project-123"
SECRET_ID = "verl-gke-a4-hf-token"
SECRET = f"projects/{PROJECT}/secrets/{SECRET_ID}"
BUCKET = "verl-data-my-project-123"
WRITABLE = ("verl/checkpoints/", "models/", "huggingface_cache/")
MODEL_REV = "5ede1c97bbab6ce5cda5812749b4c0bdf79b18dd"
DATASET_REV = "740312add88f781978c0658806c59bc2815b9866"


def deploy(namespace: str, force_destroy: bool = False) -> MockRun:
    """GcsFuseStorage then DataStaging through one provider."""

    def program() -> None:
        provider = k8s.Provider("k8s", kubeconfig="apiVersion: v1")
        store = GcsFuseStorage(
            "storage",
            {
                "project": PROJECT,
                "project_number": pulumi.Output.from_input(synth.MOCK_PROJECT_NUMBER),
                "region": "us-central1",
                "bucket_name": BUCKET,
                "force_destroy": force_destroy,
                "namespace": namespace,
                "service_account": "verl-ray",
                "staging_service_account": "verl-ray-staging",
                "ray_writable_prefixes": WRITABLE,
                "hf_token_secret_id": SECRET_ID,
                "k8s_provider": provider,
                "labels": {"stack": "a4"},
            },
        )
        data = DataStaging(
            "staging",
            {
                "namespace": namespace,
                "service_account": "verl-ray-staging",
                "claim_name": store.claim_name,
                "model_repo": "Qwen/Qwen2.5-32B-Instruct",
                "model_revision": MODEL_REV,
                "model_dir": "Qwen2.5-32B-Instruct",
                "dataset_repo": "openai/gsm8k",
                "dataset_revision": DATASET_REV,
                "timeout_minutes": 180,
                "hf_token_secret": SECRET,
            },
            opts=pulumi.ResourceOptions(providers=[provider], depends_on=[store]),
        )
        for key in ("bucket_name", "bucket_url", "namespace", "service_account_name", "staging_service_account_name",
                    "claim_name", "hf_token_secret"):
            pulumi.export(f"storage.{key}", getattr(store, key))
        for key in ("job_name", "model_path", "train_files", "val_files"):
            pulumi.export(f"staging.{key}", getattr(data, key))

    return MockRun(program)


@pytest.fixture(scope="module")
def run() -> MockRun:
    return deploy("ml")


@pytest.fixture(scope="module")
def run_default_ns() -> MockRun:
    return deploy("default")


K8S_CHILDREN = ["storage-namespace", "storage-ksa", "storage-staging-ksa", "storage-pv", "storage-pvc", "staging-script",
                "staging-job"]
FOLDERS = ("verl-checkpoints", "models", "logs", "huggingface-cache")


def test_registers_what_the_tutorial_creates(run: MockRun) -> None:
    # Registration order follows when inputs resolve, so compare as a set.
    assert {(r.type, r.name) for r in run.registrations} == {
        ("pulumi:providers:kubernetes", "k8s"),
        ("verl-gke:index:GcsFuseStorage", "storage"),
        ("gcp:storage/bucket:Bucket", "storage-bucket"),
        ("gcp:storage/bucketIAMMember:BucketIAMMember", "storage-bucket-object-user"),
        ("gcp:storage/bucketIAMMember:BucketIAMMember", "storage-ray-bucket-reader"),
        *(("gcp:storage/managedFolder:ManagedFolder", f"storage-ray-writes-{f}") for f in FOLDERS),
        *(("gcp:storage/managedFolderIamMember:ManagedFolderIamMember", f"storage-ray-writes-{f}-user")
          for f in FOLDERS if f != "logs"),
        ("kubernetes:core/v1:Namespace", "storage-namespace"),
        ("kubernetes:core/v1:ServiceAccount", "storage-ksa"),
        ("kubernetes:core/v1:ServiceAccount", "storage-staging-ksa"),
        ("kubernetes:core/v1:PersistentVolume", "storage-pv"),
        ("kubernetes:core/v1:PersistentVolumeClaim", "storage-pvc"),
        ("gcp:secretmanager/secret:Secret", "storage-hf-token"),
        ("gcp:secretmanager/secretIamMember:SecretIamMember", "storage-hf-token-accessor"),
        ("verl-gke:index:DataStaging", "staging"),
        ("kubernetes:core/v1:ConfigMap", "staging-script"),
        ("kubernetes:batch/v1:Job", "staging-job"),
    }
    assert len(run.registrations) == 22  # logs/ has no Ray grant (the supervisor writes it)


def test_no_namespace_is_created_for_default(run_default_ns: MockRun) -> None:
    assert "storage-namespace" not in run_default_ns.by_name
    assert run_default_ns.outputs["storage.namespace"] == "default"
    assert run_default_ns.inputs("storage-pvc")["metadata"]["namespace"] == "default"


def test_bucket(run: MockRun) -> None:
    bucket = run.inputs("storage-bucket")
    assert bucket["name"] == BUCKET
    assert bucket["project"] == PROJECT
    assert bucket["location"] == "US-CENTRAL1"
    assert bucket["uniformBucketLevelAccess"] is True
    assert bucket["hierarchicalNamespace"] == {"enabled": True}
    assert bucket["publicAccessPrevention"] == "enforced"
    assert bucket["forceDestroy"] is False
    assert bucket["labels"] == {"app": "verl-gke", "stack": "a4"}


@pytest.mark.parametrize("labels", [{"stack": "Dev"}, {"stack": "a4.x"}, {"Stack": "a4"}, {"9s": "a4"},
                                    {"stack": "x" * 64}])
def test_labels_gcs_would_refuse_are_refused_by_name(labels: dict[str, str]) -> None:
    # A Pulumi stack may be named `Dev` or `a4.x`; GCS rejects such a label and the bucket with it.
    def program() -> None:
        GcsFuseStorage("storage", {
            "project": PROJECT, "project_number": "1", "region": "us-central1", "bucket_name": BUCKET,
            "force_destroy": False, "namespace": "default", "service_account": "verl-ray",
            "staging_service_account": "verl-ray-staging", "ray_writable_prefixes": WRITABLE,
            "hf_token_secret_id": SECRET_ID,
            "k8s_provider": k8s.Provider("k8s", kubeconfig="apiVersion: v1"), "labels": labels,
        })

    [(key, value)] = labels.items()
    with pytest.raises(Exception, match=re.escape(f"GcsFuseStorage: label {key!r}: {value!r}: keys and values must be")):
        synth.run_in_mocks(program)


def test_destroy_keeps_a_bucket_without_force_destroy_and_deletes_it_with(run: MockRun) -> None:
    assert run.sent("storage-bucket").retain_on_delete is True
    assert run.inputs("storage-bucket")["forceDestroy"] is False
    forced = deploy("default", force_destroy=True)
    assert forced.sent("storage-bucket").retain_on_delete is False
    assert forced.inputs("storage-bucket")["forceDestroy"] is True


def _principal(run: MockRun, ksa: str) -> str:
    """The principal of the KSA object `ksa` of this cluster: its UID, which the API server gave it."""
    uid = run.registrations[[r.name for r in run.registrations].index(ksa)]
    assert uid.inputs["metadata"]["name"]
    return ksa_principal(project_number=synth.MOCK_PROJECT_NUMBER, project=PROJECT,
                         uid=synth.mock_uid("ServiceAccount", uid.inputs["metadata"]["namespace"],
                                            uid.inputs["metadata"]["name"]))


def test_staging_writes_the_whole_bucket_and_the_ray_pods_read_it(run: MockRun) -> None:
    staging_grant = run.inputs("storage-bucket-object-user")
    assert (staging_grant["bucket"], staging_grant["role"]) == (BUCKET, "roles/storage.objectUser")
    assert staging_grant["member"] == _principal(run, "storage-staging-ksa")
    reader = run.inputs("storage-ray-bucket-reader")
    assert (reader["bucket"], reader["role"]) == (BUCKET, "roles/storage.objectViewer")
    assert reader["member"] == _principal(run, "storage-ksa")
    assert _principal(run, "storage-ksa") != _principal(run, "storage-staging-ksa")
    for name in ("storage-bucket-object-user", "storage-ray-bucket-reader"):
        assert run.urn("storage-bucket") in run.by_name[name].dependencies


def test_the_ray_pods_write_only_their_managed_folders(run: MockRun) -> None:
    """The code and the model they run are read-only to them: objectUser only on managed folders
    (GCS: a managed folder's policy applies to the objects under its prefix; uniform bucket-level
    access, which the bucket has, is required)."""
    assert run.inputs("storage-bucket")["uniformBucketLevelAccess"] is True
    ray = _principal(run, "storage-ksa")
    grants = {r.inputs["managedFolder"]: r.inputs for r in run.registrations
              if r.type == "gcp:storage/managedFolderIamMember:ManagedFolderIamMember"}
    assert sorted(grants) == sorted(WRITABLE)
    for folder, grant in grants.items():
        assert (grant["bucket"], grant["role"], grant["member"]) == (BUCKET, "roles/storage.objectUser", ray), folder
    folders = {r.inputs["name"]: r.inputs for r in run.registrations if r.type == "gcp:storage/managedFolder:ManagedFolder"}
    # Removing a folder's policy (destroy) never deletes what the run wrote under it.
    # logs/ too, which only the run supervisor may write (its grant is the supervisor component's).
    assert folders == {f: {"bucket": BUCKET, "name": f, "forceDestroy": True} for f in (*WRITABLE, "logs/")}
    members = [r.inputs["member"] for r in run.registrations if "IAMMember" in r.type or "IamMember" in r.type]
    assert members.count(ray) == 1 + len(WRITABLE)


def test_grants_name_this_clusters_service_account_objects_not_any_clusters_namesake(run: MockRun) -> None:
    """GKE's principal for a KSA by UID (`.../kubernetes.serviceaccount.uid/<uid>`): a KSA of the same
    namespace and name in another cluster of the project, or one recreated here, has another UID."""
    assert _principal(run, "storage-ksa") == (
        "principal://iam.googleapis.com/projects/123456789012/locations/global/workloadIdentityPools/"
        f"my-project-123.svc.id.goog/kubernetes.serviceaccount.uid/{synth.mock_uid('ServiceAccount', 'ml', 'verl-ray')}")
    for grant, ksa in (("storage-bucket-object-user", "storage-staging-ksa"), ("storage-hf-token-accessor",
                       "storage-staging-ksa"), ("storage-ray-bucket-reader", "storage-ksa")):
        assert run.urn(ksa) in run.by_name[grant].dependencies, grant
    assert all("/subject/ns/" not in r.inputs.get("member", "") for r in run.registrations)


def test_kubernetes_objects_are_the_manifest_builders(run: MockRun) -> None:
    assert run.inputs("storage-namespace")["metadata"] == storage.namespace("ml")["metadata"]
    assert run.inputs("storage-ksa")["metadata"] == {"name": "verl-ray", "namespace": "ml"}
    assert run.inputs("storage-staging-ksa")["metadata"] == {"name": "verl-ray-staging", "namespace": "ml"}
    pv = storage.persistent_volume(bucket=BUCKET, namespace="ml")
    assert run.inputs("storage-pv")["metadata"] == pv["metadata"]
    assert run.inputs("storage-pv")["spec"] == pv["spec"]
    pvc = storage.persistent_volume_claim(bucket=BUCKET, namespace="ml")
    assert run.inputs("storage-pvc")["metadata"] == pvc["metadata"]
    assert run.inputs("storage-pvc")["spec"] == pvc["spec"]


def test_volume_keeps_the_tutorials_mount_options(run: MockRun) -> None:
    spec = run.inputs("storage-pv")["spec"]
    assert len(spec["mountOptions"]) == 11
    assert spec["csi"]["volumeHandle"] == BUCKET
    assert spec["persistentVolumeReclaimPolicy"] == "Retain"


def test_every_kubernetes_child_uses_the_one_provider(run: MockRun) -> None:
    provider = run.urn("k8s")
    for name in K8S_CHILDREN:
        assert run.by_name[name].provider == provider, name


def test_children_are_parented(run: MockRun) -> None:
    for name in ("storage-bucket", "storage-bucket-object-user", "storage-hf-token", "storage-hf-token-accessor",
                 "storage-ray-bucket-reader", *K8S_CHILDREN[:5]):
        assert run.by_name[name].parent == run.urn("storage"), name
    for name in K8S_CHILDREN[5:]:
        assert run.by_name[name].parent == run.urn("staging"), name


def test_storage_order(run: MockRun) -> None:
    deps = {name: run.by_name[name].dependencies for name in K8S_CHILDREN}
    assert run.urn("storage-bucket") in deps["storage-pv"]
    assert run.urn("storage-pv") in deps["storage-pvc"]
    for name in ("storage-ksa", "storage-staging-ksa", "storage-pvc"):
        assert run.urn("storage-namespace") in deps[name], name


def test_storage_outputs(run: MockRun) -> None:
    assert {k: v for k, v in run.outputs.items() if k.startswith("storage.")} == {
        "storage.bucket_name": BUCKET,
        "storage.bucket_url": f"gs://{BUCKET}",
        "storage.namespace": "ml",
        "storage.service_account_name": "verl-ray",
        "storage.staging_service_account_name": "verl-ray-staging",
        "storage.claim_name": storage.volume_names(bucket=BUCKET, namespace="ml")[1],
        "storage.hf_token_secret": SECRET,
    }


# --- the token ----------------------------------------------------------------------------------


def test_the_token_secret_is_created_empty_and_only_the_staging_identity_may_read_it(run: MockRun) -> None:
    secret = run.inputs("storage-hf-token")
    assert secret == {"project": PROJECT, "secretId": SECRET_ID, "replication": {"auto": {}},
                      "labels": {"app": "verl-gke", "stack": "a4"}}
    assert not [r for r in run.registrations if r.type.startswith("gcp:secretmanager/secretVersion")]
    access = run.inputs("storage-hf-token-accessor")
    assert access["role"] == "roles/secretmanager.secretAccessor"
    assert access["member"] == _principal(run, "storage-staging-ksa")
    assert access["secretId"] == SECRET_ID
    assert run.urn("storage-hf-token") in run.by_name["storage-hf-token-accessor"].dependencies


def test_no_kubernetes_secret_and_no_token_in_the_job(run: MockRun) -> None:
    assert not [r for r in run.registrations if r.type == "kubernetes:core/v1:Secret"]
    (container,) = run.sent("staging-job").raw_inputs["spec"]["template"]["spec"]["containers"]
    assert "HF_TOKEN" not in json.dumps(container)
    assert container["command"][-2:] == ["--hf-token-secret", SECRET]


# --- staging ------------------------------------------------------------------------------------


def test_config_map_holds_the_script(run: MockRun) -> None:
    assert run.inputs("staging-script")["data"] == {"stage_data.py": Path(stage_data.__file__).read_text(),
                                                    "kube.py": Path(kube.__file__).read_text(),
                                                    "gcs.py": Path(gcs.__file__).read_text(),
                                                    "staged.py": Path(staged.__file__).read_text(),
                                                    "requirements.txt": staging.requirements_text()}
    assert run.inputs("staging-script")["metadata"]["name"] == "stage-data-script"
    assert run.inputs("staging-script")["metadata"]["namespace"] == "ml"


def test_job_is_the_manifest_builders(run: MockRun) -> None:
    expected = staging.staging_job(
        staging.StagingSpec(
            namespace="ml",
            service_account="verl-ray-staging",
            claim_name=storage.volume_names(bucket=BUCKET, namespace="ml")[1],
            model_repo="Qwen/Qwen2.5-32B-Instruct",
            model_revision=MODEL_REV,
            model_dir="Qwen2.5-32B-Instruct",
            dataset_repo="openai/gsm8k",
            dataset_revision=DATASET_REV,
            dataset_config="main",
            script_digest=staging.script_digest(run.inputs("staging-script")["data"]),  # the files: the test above
            deadline_seconds=10800,
            hf_token_secret=SECRET,
        )
    )
    job = run.inputs("staging-job")
    assert job["metadata"] == expected["metadata"]
    assert job["spec"] == expected["spec"]
    assert job["spec"]["activeDeadlineSeconds"] == 10800
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][4:8] == [
        "--model-repo", "Qwen/Qwen2.5-32B-Instruct", "--model-revision", MODEL_REV,
    ]


def test_pulumi_waits_for_the_job_as_long_as_configured(run: MockRun) -> None:
    assert run.sent("staging-job").timeouts == ("180m", "180m")
    assert run.sent("staging-job").delete_before_replace is True
    assert run.sent("staging-script").timeouts == ("", "")


def test_job_waits_for_storage_and_its_script(run: MockRun) -> None:
    deps = run.by_name["staging-job"].dependencies
    for name in ("staging-script", "storage-bucket-object-user", "storage-staging-ksa", "storage-pvc",
                 "storage-hf-token-accessor"):
        assert run.urn(name) in deps, name


def test_job_does_not_wait_for_anything_else(run: MockRun) -> None:
    # Storage's children and the script only: the Job runs while the GPU pool is still created.
    allowed = {run.urn("staging-script"), *(r.urn for r in run.registrations if r.parent == run.urn("storage"))}
    assert set(run.by_name["staging-job"].dependencies) <= allowed


def test_staging_outputs(run: MockRun) -> None:
    assert {k: v for k, v in run.outputs.items() if k.startswith("staging.")} == {
        "staging.job_name": "stage-data",
        "staging.model_path": "/data/Qwen2.5-32B-Instruct",
        "staging.train_files": "/data/gsm8k/train.parquet",
        "staging.val_files": "/data/gsm8k/test.parquet",
    }


@pytest.mark.parametrize("stack, label", [("a4-standard", "a4-standard"), ("Dev.A4x", "dev-a4x"), ("x" * 70, "x" * 63)])
def test_any_stack_name_becomes_a_valid_bucket_label(stack: str, label: str):
    from components.gcs_fuse_storage import _label_problem, label_value

    assert label_value(stack) == label
    assert _label_problem("stack", label_value(stack)) is None


def test_only_the_run_supervisor_may_write_the_runs_logs(synth_stack) -> None:
    """Why 6: with objectUser on `logs/`, any Ray job could forge the log and record copies the CLI and
    CI read once the cluster is gone. Now one grant on that managed folder: the supervisor's."""
    result = synth_stack("a4-standard")
    folders = [r for r in result.registrations if r.type == "gcp:storage/managedFolderIamMember:ManagedFolderIamMember"]
    made = [r.inputs["name"] for r in result.registrations if r.type == "gcp:storage/managedFolder:ManagedFolder"]
    assert sorted(made) == ["huggingface_cache/", "logs/", "models/", "verl/checkpoints/"]  # logs/: no Ray grant
    assert sorted((r.name, r.inputs["managedFolder"]) for r in folders) == [
        ("storage-ray-writes-huggingface-cache-user", "huggingface_cache/"), ("storage-ray-writes-models-user", "models/"),
        ("storage-ray-writes-verl-checkpoints-user", "verl/checkpoints/"), ("supervisor-log-writer", "logs/")]
