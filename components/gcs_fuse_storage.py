"""The tutorial's "Prepare data and storage": the training bucket, the two identities allowed into it,
the GCS FUSE volume every pod mounts at /data, and the (empty) Secret Manager secret for the HF token.

Staging's service account writes the whole bucket and alone reads the token; the Ray pods' reads the
bucket and writes only domain.bucket's managed folders. Each is granted by its object's UID, so a
same-named account elsewhere gets nothing (docs/security.md). Takes the cluster's Kubernetes provider
in its args, not `opts.providers`, so the bucket does not wait for the cluster; dependents wait on the
component or on `service_account_name`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import NotRequired, TypedDict

import pulumi
import pulumi_kubernetes as k8s
from pulumi_gcp import secretmanager
from pulumi_gcp import storage as gcs

from components.children import child_options
from domain.bucket import LOGS_DIR
from manifests import storage

BUCKET_ROLE = "roles/storage.objectUser"
"""Read, write and delete objects: staging's on the whole bucket, the Ray pods' on their managed folders."""
READ_ROLE = "roles/storage.objectViewer"
"""Read and list objects: the Ray pods' on the whole bucket (the model, the data, the code they run)."""
TOKEN_ROLE = "roles/secretmanager.secretAccessor"
"""Read the secret's versions: what staging needs of the token secret, on that secret only."""
DEFAULT_LABELS = {"app": "verl-gke"}


class GcsFuseStorageArgs(TypedDict):
    project: str
    """Project that owns the bucket; its Workload Identity pool is `<project>.svc.id.goog`."""
    project_number: NotRequired[pulumi.Input[str]]
    """The project's number, which the principal names; default: the bucket's own `project_number`
    output (no invoke that a project whose APIs are still off would fail)."""
    region: str
    """Bucket location: the cluster's region, as the tutorial's `--location=${REGION}`."""
    bucket_name: str
    """Bucket that every Ray pod and the staging Job mount at /data."""
    force_destroy: bool
    """Let `pulumi destroy` delete the bucket with its checkpoints and model copy."""
    namespace: str
    """Namespace of the service account and the claim; created (with Pod Security labels) unless `default`."""
    service_account: str
    """The Ray pods' Kubernetes service account: reads the bucket, writes `ray_writable_prefixes`."""
    staging_service_account: str
    """The staging Job's Kubernetes service account: writes the bucket, reads the token."""
    ray_writable_prefixes: Sequence[str]
    """Managed folders (`prefix/`) the Ray pods may write (domain.bucket.ray_writable_prefixes)."""
    hf_token_secret_id: str
    """Secret Manager secret id for the Hugging Face token; the user adds its value with gcloud."""
    k8s_provider: k8s.Provider
    """The cluster's Kubernetes provider; every Kubernetes child uses it."""
    capacity: NotRequired[str]
    """Size the volume and the claim declare (default 768Gi, the tutorial's). GCS does not enforce it."""
    labels: NotRequired[Mapping[str, str]]
    """Extra bucket labels, added to `app: verl-gke`."""


def _label_problem(key: str, value: str) -> str | None:
    """GCS's label rule: keys and values of at most 63 lowercase letters, digits, '_' or '-', keys
    starting with a letter. GCS refuses the bucket otherwise (e.g. a stack named `Dev` or `a4.x`)."""
    for text, is_key in ((key, True), (value, False)):
        if (len(text) > 63 or text != text.lower() or not all(c.isalnum() or c in "-_" for c in text)
                or (is_key and not text[:1].isalpha())):
            return (f"GcsFuseStorage: label {key!r}: {value!r}: keys and values must be at most 63 lowercase "
                    "letters, digits, '_' or '-', and keys must start with a letter")
    return None


def label_value(text: str) -> str:
    """Any text (e.g. a stack name such as `Dev.A4x`) as a value GCS accepts: `dev-a4x`."""
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in text.lower())[:63]


def ksa_principal(*, project_number: str, project: str, uid: str) -> str:
    """The IAM principal of one Kubernetes service account object, by its UID, without a Google service
    account. The tutorial's `.../subject/ns/<namespace>/sa/<name>` names every cluster's namesake
    ("identity sameness" across the project's clusters); GKE's principal identifiers include this UID form
    (cloud.google.com/kubernetes-engine/docs/concepts/workload-identity, "Kubernetes ServiceAccount UID")."""
    return (
        f"principal://iam.googleapis.com/projects/{project_number}/locations/global/workloadIdentityPools/"
        f"{project}.svc.id.goog/kubernetes.serviceaccount.uid/{uid}"
    )


def _folder_slug(prefix: str) -> str:
    """`verl/checkpoints/` -> `verl-checkpoints`: a Pulumi resource name part."""
    return re.sub(r"[^a-z0-9]+", "-", prefix.lower()).strip("-")


class GcsFuseStorage(pulumi.ComponentResource):
    """A bucket, the identity allowed into it, and the FUSE volume every Ray pod mounts."""

    bucket_name: pulumi.Output[str]
    bucket_url: pulumi.Output[str]
    project_number: pulumi.Output[str]
    """`gs://<bucket>`."""
    namespace: pulumi.Output[str]
    service_account_name: pulumi.Output[str]
    """The Ray pods' service account's name, known only once it may read the bucket."""
    staging_service_account_name: pulumi.Output[str]
    """The staging Job's service account's name, known only once it may write the bucket and read the token."""
    claim: k8s.core.v1.PersistentVolumeClaim
    """The claim to mount at /data. Whatever mounts it is replaced with it (`replace_with`)."""
    claim_name: pulumi.Output[str]
    """Its name, `training-bucket-pvc-<generation>` (manifests.storage.volume_names)."""
    hf_token_secret: pulumi.Output[str]
    """`projects/<project>/secrets/<id>`, known once the staging identity may read it."""

    def __init__(self, name: str, args: GcsFuseStorageArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("verl-gke:index:GcsFuseStorage", name, {}, opts)
        child = child_options(self, opts)
        ns = args["namespace"]
        capacity = args.get("capacity", storage.DEFAULT_CAPACITY)
        labels = {**DEFAULT_LABELS, **args.get("labels", {})}
        problem = next(filter(None, (_label_problem(k, v) for k, v in labels.items())), None)
        if problem:
            raise ValueError(problem)

        bucket = gcs.Bucket(
            f"{name}-bucket",
            name=args["bucket_name"],
            project=args["project"],
            location=args["region"].upper(),
            uniform_bucket_level_access=True,
            hierarchical_namespace={"enabled": True},
            # Model weights and checkpoints are never meant to be public.
            public_access_prevention="enforced",
            force_destroy=args["force_destroy"],
            labels=labels,
            # Without force_destroy the bucket and its checkpoints outlive `pulumi destroy`: Pulumi
            # forgets it instead of failing on a non-empty bucket partway (maybe before the cluster,
            # which would keep billing). A forced replacement (a new location, say) creates first:
            # its create fails on the name in use while the state still holds the bucket; deleting
            # first would forget it (or, with force_destroy, delete the checkpoints) before that.
            opts=child.merge(pulumi.ResourceOptions(retain_on_delete=not args["force_destroy"],
                                                    delete_before_replace=False)),
        )
        project_number = pulumi.Output.from_input(args.get("project_number") or bucket.project_number)
        k8s_child = child.merge(pulumi.ResourceOptions(provider=args["k8s_provider"]))
        self.namespace = pulumi.Output.from_input(ns)
        in_namespace = k8s_child
        if ns != "default":
            namespace = k8s.core.v1.Namespace(f"{name}-namespace", metadata=storage.namespace(ns)["metadata"],
                                              opts=k8s_child)
            in_namespace = k8s_child.merge(pulumi.ResourceOptions(depends_on=[namespace]))
            self.namespace = namespace.metadata["name"]

        def principal(account: k8s.core.v1.ServiceAccount) -> pulumi.Output[str]:
            # A UID the API server gave this object: known once it exists, so the grant waits for it.
            return pulumi.Output.all(project_number, account.metadata["uid"]).apply(
                lambda v: ksa_principal(project_number=str(v[0]), project=args["project"], uid=v[1]))

        def account_of(resource: str, ksa_name: str) -> k8s.core.v1.ServiceAccount:
            manifest = storage.service_account(name=ksa_name, namespace=ns)
            return k8s.core.v1.ServiceAccount(resource, metadata=manifest["metadata"], opts=in_namespace)

        account = account_of(f"{name}-ksa", args["service_account"])
        staging_account = account_of(f"{name}-staging-ksa", args["staging_service_account"])
        ray, staging = principal(account), principal(staging_account)
        reads = gcs.BucketIAMMember(f"{name}-ray-bucket-reader", bucket=bucket.name, role=READ_ROLE, member=ray,
                                    opts=child)
        writes: list[pulumi.Resource] = [reads]
        for prefix in args["ray_writable_prefixes"]:
            # A managed folder's policy covers the objects under its prefix; removing it keeps them.
            folder = gcs.ManagedFolder(f"{name}-ray-writes-{_folder_slug(prefix)}", bucket=bucket.name, name=prefix,
                                       force_destroy=True, opts=child)
            writes.append(gcs.ManagedFolderIamMember(f"{name}-ray-writes-{_folder_slug(prefix)}-user",
                                                     bucket=bucket.name, managed_folder=folder.name, role=BUCKET_ROLE,
                                                     member=ray, opts=child))
        # The run supervisor's alone (components/run_supervisor.py grants it): no Ray grant. Its resource
        # name is the one it had when the Ray pods could write it, so the folder is kept, not replaced.
        gcs.ManagedFolder(f"{name}-ray-writes-{_folder_slug(LOGS_DIR)}", bucket=bucket.name, name=f"{LOGS_DIR}/",
                          force_destroy=True, opts=child)
        access = gcs.BucketIAMMember(
            f"{name}-bucket-object-user", bucket=bucket.name, role=BUCKET_ROLE, member=staging, opts=child
        )

        # Named by what neither can change in place (manifests.storage.volume_generation): a new bucket
        # creates a new pair beside the old one, which the `up` deletes last, once nothing mounts it.
        pv = storage.persistent_volume(bucket=args["bucket_name"], namespace=ns, capacity=capacity)
        # The volume names the bucket by a plain string: make it wait for the bucket explicitly.
        volume = k8s.core.v1.PersistentVolume(
            f"{name}-pv",
            metadata=pv["metadata"],
            spec=pv["spec"],
            opts=k8s_child.merge(pulumi.ResourceOptions(depends_on=[bucket])),
        )
        pvc = storage.persistent_volume_claim(bucket=args["bucket_name"], namespace=ns, capacity=capacity)
        claim = k8s.core.v1.PersistentVolumeClaim(
            f"{name}-pvc",
            metadata=pvc["metadata"],
            spec=pvc["spec"],
            # After the account too: one registration order on every run (both wait for the namespace).
            opts=in_namespace.merge(pulumi.ResourceOptions(depends_on=[volume, account, staging_account])),
        )

        # No version: `gcloud secrets versions add` puts the token there, outside Pulumi's state.
        token_secret = secretmanager.Secret(
            f"{name}-hf-token", project=args["project"], secret_id=args["hf_token_secret_id"],
            replication={"auto": {}}, labels=labels, opts=child)
        token_access = secretmanager.SecretIamMember(
            f"{name}-hf-token-accessor", project=args["project"], secret_id=token_secret.secret_id,
            role=TOKEN_ROLE, member=staging, opts=child)

        self.bucket_name = bucket.name
        self.bucket_url = bucket.url
        self.project_number = bucket.project_number
        self.service_account_name = pulumi.Output.all(account.metadata["name"], *(w.id for w in writes)).apply(
            lambda v: v[0])
        self.staging_service_account_name = pulumi.Output.all(staging_account.metadata["name"], access.id).apply(
            lambda v: v[0])
        self.claim = claim
        self.claim_name = claim.metadata["name"]
        self.hf_token_secret = pulumi.Output.all(token_secret.secret_id, token_access.id).apply(
            lambda v: f"projects/{args['project']}/secrets/{v[0]}")
        self.register_outputs(
            {
                "bucket_name": self.bucket_name,
                "bucket_url": self.bucket_url,
                "project_number": self.project_number,
                "namespace": self.namespace,
                "service_account_name": self.service_account_name,
                "staging_service_account_name": self.staging_service_account_name,
                "claim_name": self.claim_name,
                "hf_token_secret": self.hf_token_secret,
            }
        )
