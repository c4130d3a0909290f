"""The tutorial's "Deploy the RayCluster custom resource" step, and on A4X its namespace-scoped
KubeRay operator (where GKE's Ray operator add-on is off: both own the ray.io CRDs).

Pass the cluster's Kubernetes provider in `opts` (`providers=[cluster.provider]`) and in
`depends_on` everything the pods need first: the GPU node pool, the bucket's claim and service
account, the NCCL installer / network mapping, and on A4X the `A4xDra` component.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import NotRequired, TypedDict, cast

import pulumi
import pulumi_kubernetes as k8s

from components.children import child_options, custom_resource
from components.helm_release import pinned_release
from components.pinned_image import pinned_ref
from domain.image_mirror import mirrored
from domain.platforms import CHECKPOINT_COPIER, PLATFORMS, Platform, PlatformName
from manifests import checkpoints, kuberay
from manifests.helm import image_values
from manifests.network_policy import ray_ingress_policy
from manifests.ray_cluster import HEAD_NODE_POOL, RayClusterSpec, head_service_name, ray_cluster
from domain.platforms import Mode
from workloads import checkpoints as checkpoint_workload

# GPU nodes appearing, a ~20 GB image pulled on each, Ray started: well past pulumi-kubernetes'
# default of 10 minutes.
DEFAULT_READY_TIMEOUT_MINUTES = 60


class RayTrainingClusterArgs(TypedDict):
    platform: PlatformName
    """a4, a3u or a4x: accelerator, GPUs and NICs per node, disk and /dev/shm sizes, Ray version."""
    mode: Mode
    gpu_nodes: int
    """GPU nodes, one Ray worker each; the worker group is fixed at this size."""
    namespace: str
    service_account: str
    """Kubernetes service account bound to the bucket (Workload Identity)."""
    claim: k8s.core.v1.PersistentVolumeClaim
    """PersistentVolumeClaim of the GCS FUSE bucket, mounted at /data. The RayCluster waits for it and
    is replaced with it: KubeRay never moves running pods to a new claim, and the old claim can go
    only once no pod mounts it."""
    name: NotRequired[str]
    """RayCluster name; default the platform's (b200-ray-cluster, h200-ray-cluster, gb200-ray-cluster)."""
    image: NotRequired[str]
    """verl image, `name:tag` or `name@sha256:...`; default the platform's (a tag). A tag is pinned by
    digest at the first `pulumi up` (components.pinned_image) and kept until this value changes."""
    image_mirror: NotRequired[str | None]
    """Registry prefix of a remote repository of Docker Hub (domain.image_mirror): a Docker Hub image
    is pulled through it, by the digest Docker Hub serves (a remote repository serves the same).
    Default None: pulled from its own registry."""
    ray_version: NotRequired[str]
    """Ray version inside `image`; default the platform's."""
    worker_cpus: NotRequired[int]
    """Default: from the machine's allocatable CPUs (Platform.worker_cpus)."""
    worker_memory_gi: NotRequired[int]
    """Default: from the machine's allocatable memory (Platform.worker_memory_gi)."""
    worker_spot: NotRequired[bool]
    """Autopilot: GPU workers on Spot capacity. Default False; the head is never on Spot."""
    compute_class: NotRequired[str | None]
    """A custom ComputeClass the GPU workers select (it orders their capacity kinds). Default None."""
    nic_claims: NotRequired[bool]
    """A4X: NICs as DRA claims (DRANET), not multi-network interfaces. Default True on A4X."""
    head_node_pool: NotRequired[str]
    """Standard (A4/A3 Ultra): the on-demand CPU pool of the head. Default verl-cpu."""
    verl_dir: NotRequired[str | None]
    """A verl tree on the bucket first on every Ray process's path; None (default) when the image has verl."""
    checkpoint_root: NotRequired[str | None]
    bucket: NotRequired[str]
    """The training bucket's name: the checkpoint program's markers rest on its object generations."""
    """The checkpoint folder on the bucket mount (verl-gke:verl.trainer.default_local_dir): verl saves on each pod's local disk and
    a copier beside every GPU worker copies each save there; the job runs verl through the checkpoint
    launcher (domain.grpo_spec.entrypoint). None (default): neither."""
    install_kuberay: NotRequired[bool]
    """Install the namespace-scoped KubeRay operator Helm chart (only without the Ray add-on)."""
    operator_depends_on: NotRequired[list[pulumi.Resource]]
    """What the operator's release and the checkpoint program's ConfigMap wait for (their namespace's
    owner), instead of everything the RayCluster waits for: they need no GPU node, so they are written
    while the GPU pool is created."""
    ready_timeout_minutes: NotRequired[int]
    """How long `pulumi up` waits for the head and every worker to run."""
    network_policy: NotRequired[bool]
    """Let only the cluster's own pods reach its pods (default True); see manifests.network_policy."""
    job_api_clients: NotRequired[dict[str, str] | None]
    """Labels of pods that may also reach the head's Job API (the run supervisor)."""
    wandb_key: NotRequired[bool]
    """The Ray containers get WANDB_API_KEY from the Secret staging writes (default False)."""
    dashboard_cidrs: NotRequired[list[str]]
    """With the network policy: CIDRs that may also reach the dashboard and Job API (port 8265)."""


def cluster_spec(args: RayTrainingClusterArgs, claim_name: str) -> RayClusterSpec:
    """The RayCluster's inputs: the args and the claim's name, with the platform's facts for what they
    leave out.

    Raises ValueError naming every invalid value.
    """
    if args["platform"] not in PLATFORMS:
        raise ValueError(f"platform = {args['platform']!r}: must be one of {', '.join(PLATFORMS)}")
    platform = PLATFORMS[args["platform"]]
    a4x = platform.name == "a4x"
    spec = RayClusterSpec(
        name=args.get("name") or platform.ray_cluster_name,
        namespace=args["namespace"],
        ray_version=args.get("ray_version") or platform.ray_version,
        image=args.get("image") or platform.image,
        service_account=args["service_account"],
        claim_name=claim_name,
        mode=args["mode"],
        accelerator=platform.accelerator,
        gpus_per_node=platform.gpus_per_node,
        worker_replicas=args["gpu_nodes"],
        worker_cpus=args.get("worker_cpus") or platform.worker_cpus,
        worker_memory_gi=args.get("worker_memory_gi") or platform.worker_memory_gi,
        worker_ephemeral_gi=platform.worker_ephemeral_gi(args["mode"]),
        shm_gi=platform.shm_size_gi,
        ld_library_path=platform.ld_library_path,
        rdma_nics=platform.rdma_nics,
        arm64=platform.arch == "arm64",
        a4x=a4x,
        head_runs_tasks=not platform.trainer_on_worker,
        dra_nics=a4x and args.get("nic_claims", True),
        worker_spot=args.get("worker_spot", False),
        compute_class=args.get("compute_class"),
        head_node_pool=args.get("head_node_pool") or HEAD_NODE_POOL,
        verl_dir=args.get("verl_dir"),
        checkpoint_root=args.get("checkpoint_root"),
        checkpoint_digest=checkpoints.digest(checkpoint_program() + checkpoint_client())
        if args.get("checkpoint_root") else "",
        bucket=args.get("bucket", ""),
        wandb_key=args.get("wandb_key", False),
    )
    if platform.head_on_gpu_node:
        _check_room_for_head(spec, platform)
    return spec


def checkpoint_program() -> str:
    """workloads/checkpoints.py as the pods run it."""
    return Path(checkpoint_workload.__file__).read_text()


def checkpoint_client() -> str:
    """workloads/gcs.py, which the checkpoint program loads beside it."""
    return Path(checkpoint_workload.__file__).with_name("gcs.py").read_text()


def _check_room_for_head(spec: RayClusterSpec, platform: Platform) -> None:
    """A head that shares a GPU node with a worker must fit beside it, or it never schedules and
    the RayCluster never becomes ready."""
    cpus, memory_gi = platform.max_worker_cpus, platform.max_worker_memory_gi
    problems = []
    if spec.worker_cpus > cpus:
        problems.append(
            f"worker_cpus = {spec.worker_cpus}: an A4X node has {platform.allocatable_cpu:.2f} allocatable vCPUs "
            f"and also runs the Ray head ({platform.head_cpus}) and the checkpoint copier ({CHECKPOINT_COPIER.cpu}); "
            f"request at most {cpus}"
        )
    if spec.worker_memory_gi > memory_gi:
        problems.append(
            f"worker_memory_gi = {spec.worker_memory_gi}: an A4X node has {platform.allocatable_memory_gib:.2f}Gi "
            f"allocatable and also runs the Ray head ({platform.head_memory_gi}Gi) and the checkpoint copier "
            f"({CHECKPOINT_COPIER.memory_gi}Gi); request at most {memory_gi}"
        )
    if problems:
        raise ValueError("invalid RayCluster spec:\n  " + "\n  ".join(problems))


PATCH_FORCE = "pulumi.com/patchForce"
"""pulumi-kubernetes' annotation for a server-side apply with force (conflicting fields taken over)."""
WAIT_FOR = "pulumi.com/waitFor"
"""pulumi-kubernetes' annotation naming what a custom resource is awaited for (none is by default)."""
READY_WHEN = "jsonpath={.status.state}"
"""Until KubeRay reports a state: KubeRay 1.6.2 sets it only to `ready` (every pod running) and to
`suspended` (no pod left of a suspended cluster), so a create waits for every pod, and an update of a
cluster the run supervisor released never waits for pods that only the next run brings back."""


class RayTrainingCluster(pulumi.ComponentResource):
    """The verl RayCluster (awaited until every pod runs) and, if asked, its KubeRay operator."""

    ray_cluster: k8s.apiextensions.CustomResource
    """The RayCluster itself: the run is replaced with it."""
    name: pulumi.Output[str]
    head_service: pulumi.Output[str]
    """`<name>-head-svc`: GCS 6379, dashboard and job API 8265, client 10001."""
    namespace: pulumi.Output[str]

    def __init__(self, name: str, args: RayTrainingClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("verl-gke:index:RayTrainingCluster", name, {}, opts)
        # The builder only places the claim's name; an Output is resolved there by the engine, so the
        # rest of the manifest stays known in preview and the claim becomes a dependency.
        spec = cluster_spec(args, cast(str, args["claim"].metadata["name"]))
        child = child_options(self, opts)
        cluster_opts = child
        if args.get("install_kuberay", False):
            operator_opts = child
            if "operator_depends_on" in args:
                operator_opts = pulumi.ResourceOptions(parent=self, depends_on=args["operator_depends_on"])
            # Its digest needs nothing of the cluster, so it waits for nothing.
            operator_image = pulumi.Output.from_input(pinned_ref(
                f"{name}-kuberay-operator-image", kuberay.CHART.image, pulumi.ResourceOptions(parent=self)))
            operator = pinned_release(f"{name}-kuberay-operator", kuberay.CHART, namespace=spec.namespace,
                                      values=kuberay.helm_values(namespace=spec.namespace,
                                                                 image=operator_image.apply(image_values)),
                                      opts=operator_opts)
            # The chart brings the ray.io CRDs and the operator that acts on the RayCluster.
            cluster_opts = child.merge(pulumi.ResourceOptions(depends_on=[operator]))
        prefix = args.get("image_mirror")

        def pull_ref(image: str) -> str:
            return mirrored(image, prefix) if prefix else image

        # Resolved against the upstream name; it needs nothing of the cluster, so it waits for nothing.
        image = pulumi.Output.from_input(pinned_ref(f"{name}-image", spec.image,
                                                    pulumi.ResourceOptions(parent=self))).apply(pull_ref)
        if spec.checkpoint_root:
            # Needs only the namespace, as the operator: written while the GPU pool is created.
            program_opts = child
            if "operator_depends_on" in args:
                program_opts = pulumi.ResourceOptions(parent=self, depends_on=args["operator_depends_on"])
            program = checkpoints.program_config_map(namespace=spec.namespace, program=checkpoint_program(),
                                                     client=checkpoint_client())
            # Named by its content: a new program is created beside the old, which goes at the end of the `up`.
            program_map = k8s.core.v1.ConfigMap(f"{name}-checkpoint-program", metadata=program["metadata"],
                                                immutable=program["immutable"], data=program["data"],
                                                opts=program_opts)
            cluster_opts = cluster_opts.merge(pulumi.ResourceOptions(depends_on=[program_map]))
        timeout = f"{args.get('ready_timeout_minutes', DEFAULT_READY_TIMEOUT_MINUTES)}m"
        # The builder only places the pinned ref (resolved by the engine, like the claim's name).
        manifest = ray_cluster(replace(spec, image=cast(str, image)))
        # Takes back fields another manager owns: verl-gke 0.3.0's supervisor released workers by
        # writing the (atomic) worker group list, which a plain apply would now conflict on. The
        # program never sends spec.suspend, so the release stays the run lifecycle's.
        manifest["metadata"].setdefault("annotations", {})[PATCH_FORCE] = "true"
        manifest["metadata"]["annotations"][WAIT_FOR] = READY_WHEN
        self.ray_cluster = cluster = custom_resource(
            f"{name}-ray-cluster",
            manifest,
            opts=cluster_opts.merge(pulumi.ResourceOptions(
                custom_timeouts=pulumi.CustomTimeouts(create=timeout, update=timeout),
                # Deleted first (with its pods: deletes are Foreground) and created on a new claim, so
                # the old claim, deleted at the end of the `up`, is no longer mounted by then.
                replace_with=[args["claim"]],
            )),
        )
        if args.get("network_policy", True):
            policy = ray_ingress_policy(cluster=spec.name, namespace=spec.namespace,
                                        dashboard_cidrs=args.get("dashboard_cidrs", []),
                                        job_api_clients=args.get("job_api_clients"))
            k8s.networking.v1.NetworkPolicy(f"{name}-ingress-policy", metadata=policy["metadata"],
                                            spec=policy["spec"], opts=child)
        self.name = cluster.metadata["name"]
        self.head_service = self.name.apply(head_service_name)
        self.namespace = cluster.metadata["namespace"]
        self.register_outputs({"name": self.name, "head_service": self.head_service, "namespace": self.namespace})
