"""The tutorial's "Prepare the model and data", done by the cluster: a Job that writes the model,
GSM8K and verl into the bucket, and that `pulumi up` waits for.

Pass the cluster's Kubernetes provider in `opts` (`providers=[cluster.provider]`) and the
GcsFuseStorage component in `opts.depends_on`: the Job then starts once the bucket, its role
binding, the claim and the token secret's access binding exist. It needs no GPU, so it runs while the GPU node pool
is still being created. Whatever reads the data should take `model_path`, `train_files` or
`val_files` from here: they resolve only once the Job has succeeded.
"""

from __future__ import annotations

from pathlib import Path
from typing import NotRequired, TypedDict, cast

import pulumi
import pulumi_kubernetes as k8s

from components.children import child_options
from domain import staged
from manifests import staging, storage
from workloads import gcs, kube, stage_data


class DataStagingArgs(TypedDict):
    namespace: str
    """Namespace of the bucket claim and the service account."""
    service_account: str
    """Kubernetes service account allowed into the bucket."""
    claim_name: pulumi.Input[str]
    """The bucket's claim (GcsFuseStorage.claim_name), mounted at /data. A new claim replaces the Job
    (its pod template changes), deleting it first, so its pod leaves the old claim before that goes."""
    model_repo: str
    """Hugging Face model, e.g. Qwen/Qwen2.5-32B-Instruct."""
    model_revision: str
    """40-hex commit of the model repository."""
    model_dir: str
    """Directory under /data for the model, e.g. Qwen2.5-32B-Instruct."""
    dataset_repo: str
    """A Hugging Face dataset staging has a recipe for (domain/staged.RECIPES), e.g. openai/gsm8k."""
    dataset_revision: str
    """40-hex commit of the dataset repository."""
    timeout_minutes: int
    """How long `pulumi up` waits for the Job; Kubernetes also stops the Job then."""
    dataset_config: NotRequired[str]
    """The folder of the dataset's shards (default: its recipe's, main for GSM8K, as verl's preprocessing)."""
    verl: NotRequired[staging.VerlRelease | None]
    """The pinned verl wheel to unpack on the bucket; None when the image or the user's tree has verl."""
    hf_token_secret: NotRequired[str | None]
    """`projects/P/secrets/S` holding the Hugging Face token (GcsFuseStorage makes it); None: no token."""
    wandb_key_secret: NotRequired[str | None]
    """`projects/P/secrets/S` holding wandb's API key (the user's; GcsFuseStorage lets staging read it), copied
    into the namespace's Secret staged.WANDB_SECRET; None: no wandb."""
    user_data: NotRequired[tuple[str, ...]]
    """gs:// dataDir's copies into `bucket` (domain/user_data.gs_copies)."""
    bucket: NotRequired[str]


class DataStaging(pulumi.ComponentResource):
    """The script ConfigMap and the staging Job."""

    job_name: pulumi.Output[str]
    model_path: pulumi.Output[str]
    """/data/<model dir>, once staged."""
    train_files: pulumi.Output[str]
    """/data/<recipe dir>/train.parquet (gsm8k, math), once staged."""
    val_files: pulumi.Output[str]
    """/data/<recipe dir>/test.parquet, once staged."""

    def __init__(self, name: str, args: DataStagingArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("verl-gke:index:DataStaging", name, {}, opts)
        # The Job waits for what this component waits for (the storage).
        child = child_options(self, opts)
        ns = args["namespace"]
        cm = staging.script_config_map(
            namespace=ns, script=Path(stage_data.__file__).read_text(), kube=Path(kube.__file__).read_text(),
            gcs=Path(gcs.__file__).read_text(), shared=Path(staged.__file__).read_text())
        recipe = staged.recipe_for(args["dataset_repo"]) or staged.RECIPES[0]
        config_map = k8s.core.v1.ConfigMap(f"{name}-script", metadata=cm["metadata"], data=cm["data"], opts=child)
        job_waits_for: list[pulumi.Resource] = [config_map]
        wandb = args.get("wandb_key_secret")
        if wandb:
            role = staging.wandb_role(ns)
            binding = staging.wandb_role_binding(ns, args["service_account"])
            job_waits_for.append(k8s.rbac.v1.RoleBinding(
                f"{name}-wandb-key", metadata=binding["metadata"], role_ref=binding["roleRef"],
                subjects=binding["subjects"], opts=child.merge(pulumi.ResourceOptions(depends_on=[
                    k8s.rbac.v1.Role(f"{name}-wandb-key", metadata=role["metadata"], rules=role["rules"],
                                     opts=child)]))))

        spec = staging.StagingSpec(
            namespace=ns,
            service_account=args["service_account"],
            # Placed as it is: an Output is resolved by the engine and makes the claim a dependency.
            claim_name=cast(str, args["claim_name"]),
            model_repo=args["model_repo"],
            model_revision=args["model_revision"],
            model_dir=args["model_dir"],
            dataset_repo=args["dataset_repo"],
            dataset_revision=args["dataset_revision"],
            dataset_config=args.get("dataset_config") or recipe.config,
            script_digest=staging.script_digest(cm["data"]),
            deadline_seconds=args["timeout_minutes"] * 60,
            verl=args.get("verl"),
            hf_token_secret=args.get("hf_token_secret"),
            wandb_key_secret=wandb,
            user_data=args.get("user_data", ()),
            bucket=args.get("bucket"),
        )
        manifest = staging.staging_job(spec)
        timeout = f"{args['timeout_minutes']}m"
        job = k8s.batch.v1.Job(
            f"{name}-job",
            metadata=manifest["metadata"],
            spec=manifest["spec"],
            opts=child.merge(
                pulumi.ResourceOptions(
                    depends_on=job_waits_for,
                    # pulumi-kubernetes waits for a Job to complete (and fails the update if the Job
                    # fails); the default 10 minutes is far too short for a 66 GB download.
                    custom_timeouts=pulumi.CustomTimeouts(create=timeout, update=timeout),
                    # The Job has a fixed name: a new one can only exist once the old one is gone.
                    delete_before_replace=True,
                )
            ),
        )

        def once_staged(path: str) -> pulumi.Output[str]:
            return job.metadata.apply(lambda _: path)

        data = storage.MOUNT_PATH
        self.job_name = job.metadata["name"]
        self.model_path = once_staged(f"{data}/{args['model_dir']}")
        self.train_files = once_staged(f"{data}/{recipe.dir}/train.parquet")
        self.val_files = once_staged(f"{data}/{recipe.dir}/test.parquet")
        self.register_outputs(
            {
                "job_name": self.job_name,
                "model_path": self.model_path,
                "train_files": self.train_files,
                "val_files": self.val_files,
            }
        )
