"""The KubeRay RayCluster that runs verl: one CPU head and one group of GPU workers.

Spec: the tutorial's ray-cluster-auto.yaml, ray-cluster-standard.yaml (A4, A3 Ultra) and
ray-cluster-a4x.yaml, with the tutorial's bugs fixed: node selector values are strings (bug 3),
the name comes from the caller (bug 4), worker sizes come from the caller, who derives them
from the machine's allocatable resources (bug 5), and the head never runs on Spot (bug 6).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, get_args

from domain import wandb_key
from domain.grpo_spec import verl_path_env
from domain.platforms import A4X_HEAD_CPUS, A4X_HEAD_MEMORY_GI, Mode, has_token_auth, is_pinned_image
from manifests import checkpoints, compute_class, dra
from manifests.network_mapping import GVNIC_NETWORK, rdma_network_name
from manifests.storage import bucket_mount, bucket_volumes, sidecar_annotations


WORKER_GROUP = "gpu-group"
HEAD_NODE_POOL = "verl-cpu"
"""Standard (A4, A3 Ultra): the on-demand CPU pool the head runs on, the tutorial's c2-standard-16 pool.
Not `default-pool`: the provider deletes a pool of that name whenever remove_default_node_pool flips."""
GCS_PORT = 6379
DASHBOARD_PORT = 8265
CLIENT_PORT = 10001

# Not awaited for KubeRay's conditions: the run supervisor suspends the RayCluster when a run is over
# (`spec.suspend`, a field this manifest never sets, so a later `pulumi up` leaves it to the
# supervisor), and KubeRay 1.6.2 then turns `HeadPodReady` and `RayClusterProvisioned` False
# (ray-operator/test/e2e/raycluster_test.go, TestRayClusterSuspend): an update of a suspended cluster
# would wait for them in vain. components/ray_training_cluster.py awaits `status.state` instead
# (READY_WHEN), and the GrpoJob provider's readiness gate waits for the head and every GPU worker,
# with its own deadline (ready_timeout_s).

# Head sizes of the tutorial: the x86 manifests use 32G / 9Gi, the A4X one 32Gi / 20Gi.
# The A4X head shares a GB200 node with a worker, so the platform table sizes workers around it.
HEAD_RESOURCES_X86 = {"cpu": "12", "memory": "32G", "ephemeral-storage": "9Gi"}
HEAD_RESOURCES_A4X = {"cpu": str(A4X_HEAD_CPUS), "memory": f"{A4X_HEAD_MEMORY_GI}Gi", "ephemeral-storage": "20Gi"}

# The A4X image lacks verl's TransferQueue dependency; the tutorial installs this pin at start.
TRANSFER_QUEUE_REQUIREMENT = "TransferQueue==0.1.8"
TRANSFER_QUEUE_SHA256 = "078c4a63ba0c222fe684e96844c937dcd97f45ac94340a9c92eb03cfbc48cffd"
"""Of transferqueue-0.1.8-py3-none-any.whl as PyPI serves it: installed with --require-hashes and
--no-deps, since its requirements (ray, tensordict, pyzmq, hydra-core, numpy, msgspec, psutil,
omegaconf, prometheus_client) are verl's and vLLM's own, which the image ships."""

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
ARM_TOLERATION = {"key": "kubernetes.io/arch", "operator": "Exists", "effect": "NoSchedule"}

# KubeRay refuses longer names or names that are not DNS-1035 labels (validation.go, v1.6.2).
_MAX_NAME = 53
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class RayClusterSpec:
    """Everything the RayCluster depends on, as plain values."""

    name: str
    """RayCluster name, e.g. b200-ray-cluster."""
    namespace: str
    ray_version: str
    """Ray version inside `image` (KubeRay uses it to pick compatible defaults)."""
    image: str
    """verl image with a fixed tag, the same for head and workers."""
    service_account: str
    """Kubernetes service account allowed into the bucket (Workload Identity)."""
    claim_name: str
    """PersistentVolumeClaim of the GCS FUSE bucket, mounted at /data."""
    mode: Mode
    accelerator: str
    """GKE accelerator label, e.g. nvidia-b200."""
    gpus_per_node: int
    worker_replicas: int
    """GPU nodes: one worker pod per node, a fixed-size group."""
    worker_cpus: int
    """CPU request and limit of a worker, also Ray's `num-cpus` for it."""
    worker_memory_gi: int
    worker_ephemeral_gi: int
    shm_gi: int
    """Size limit of the memory-backed /dev/shm (NCCL and vLLM use it)."""
    ld_library_path: str
    rdma_nics: int
    """RDMA NICs per node, all given to the worker (8 on A4/A3 Ultra, 4 on A4X)."""
    arm64: bool = False
    """The nodes are arm64, which GKE taints `kubernetes.io/arch`: every pod tolerates it."""
    a4x: bool = False
    """GB200: the head runs on a GPU node (the image is arm64 only), one worker per host claiming
    the ComputeDomain's IMEX channel, TransferQueue installed at start."""
    head_runs_tasks: bool = True
    """The head offers Ray its CPUs; False: `num-cpus: 0`, so verl's trainer runs on a GPU worker (A4X always,
    the smoke platform to exercise that placement)."""
    dra_nics: bool = False
    """NICs come as DRA claims (A4X with DRANET, the tutorial's path) instead of multi-network
    interfaces named in the `networking.gke.io/interfaces` annotation."""
    worker_spot: bool = False
    compute_class: str | None = None
    """A custom ComputeClass the workers select (it orders their capacity kinds); Autopilot: instead of
    Performance and gke-spot."""
    """Autopilot only: run GPU workers on Spot capacity. On Standard the node pool decides."""
    head_node_pool: str = HEAD_NODE_POOL
    """Standard: the on-demand CPU pool the head runs on."""
    verl_dir: str | None = None
    """A verl tree on the bucket (the staged release or the user's own) first on every Ray process's
    path; None when the image has verl."""
    checkpoint_root: str | None = None
    """The checkpoint folder on the bucket mount: verl saves on each pod's local disk and a copier beside
    every GPU worker copies each save there (workloads/checkpoints.py); None: no local saves."""
    checkpoint_digest: str = ""
    bucket: str = ""
    """The bucket's name, for the checkpoint program's markers (its object generations)."""
    wandb_key: bool = False
    """The Ray containers (not the copiers) read WANDB_API_KEY from the Secret staging writes (domain/wandb_key.py)."""
    """sha256 of the checkpoint program (and its GCS client): on the pod templates, so a new program restarts
    the pods."""

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("invalid RayCluster spec:\n  " + "\n  ".join(problems))

    def problems(self) -> list[str]:
        """Every invalid value, each naming the field, the value and what is allowed."""
        out: list[str] = []
        if len(self.name) > _MAX_NAME or not _DNS1035.match(self.name):
            out.append(
                f"name = {self.name!r}: must be a DNS-1035 label (lowercase letters, digits, '-', "
                f"starting with a letter) of at most {_MAX_NAME} characters"
            )
        if self.mode not in get_args(Mode):
            out.append(f"mode = {self.mode!r}: must be one of {', '.join(get_args(Mode))}")
        # A value that is not a str is resolved at deploy (a digest-pinned ref): the builder only places it.
        if isinstance(self.image, str) and not is_pinned_image(self.image):
            out.append(f"image = {self.image!r}: needs a fixed tag or digest (not 'latest')")
        for field_name in ("gpus_per_node", "worker_replicas", "worker_cpus", "worker_memory_gi",
                           "worker_ephemeral_gi", "shm_gi"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                out.append(f"{field_name} = {value!r}: must be a whole number, at least 1")
        if isinstance(self.rdma_nics, bool) or not isinstance(self.rdma_nics, int) or self.rdma_nics < 0:
            out.append(f"rdma_nics = {self.rdma_nics!r}: must be a whole number, at least 0")
        if (isinstance(self.shm_gi, int) and isinstance(self.worker_memory_gi, int)
                and self.shm_gi >= self.worker_memory_gi):
            # A memory-backed emptyDir is charged to the pod's memory.
            out.append(f"shm_gi = {self.shm_gi!r}: must be below worker_memory_gi ({self.worker_memory_gi!r})")
        if self.dra_nics and not self.a4x:
            out.append("dra_nics = True: DRA NIC claims are set up for A4X (a4x = True) only")
        if self.a4x and self.mode != "standard":
            out.append(f"mode = {self.mode!r}: A4X (GB200) runs only on Standard clusters; use 'standard'")
        if self.worker_spot and self.mode != "autopilot":
            out.append("worker_spot = True: applies to Autopilot only; on Standard the GPU node pool decides Spot")
        if self.verl_dir is not None and not self.verl_dir.startswith("/"):
            out.append(f"verl_dir = {self.verl_dir!r}: must be an absolute path (e.g. /data/verl)")
        if self.checkpoint_root is not None and not self.checkpoint_root.startswith("/"):
            out.append(f"checkpoint_root = {self.checkpoint_root!r}: must be an absolute path on the bucket mount")
        return out


HEAD_SERVICE_SUFFIX = "-head-svc"


def head_service_name(cluster_name: str) -> str:
    """The head Service KubeRay creates for a RayCluster (`<name>-head-svc`)."""
    return f"{cluster_name}{HEAD_SERVICE_SUFFIX}"


def ray_cluster_of(head_service: str) -> str:
    """The RayCluster whose head Service this is (head_service_name's inverse)."""
    return head_service.removesuffix(HEAD_SERVICE_SUFFIX)


WORKER_CAPABILITIES = ("IPC_LOCK",)
"""The one capability a GPU worker keeps: NCCL's RDMA transport (the gIB plugin, ibverbs) registers
and pins its buffers with ibv_reg_mr, which needs CAP_IPC_LOCK past the container's RLIMIT_MEMLOCK.
NCCL over NVLink/TCP, CUDA IPC and Ray need none; the head keeps none."""
POD_SECURITY_CONTEXT = {"seccompProfile": {"type": "RuntimeDefault"}}
"""The container runtime's default seccomp filter, for every Ray pod."""


def container_security(capabilities: tuple[str, ...] = ()) -> dict[str, Any]:
    """No privilege escalation, every capability dropped but `capabilities`."""
    caps: dict[str, list[str]] = {"drop": ["ALL"]}
    if capabilities:
        caps["add"] = list(capabilities)
    return {"allowPrivilegeEscalation": False, "capabilities": caps}


def token_secret(cluster: str, ray_version: str) -> str | None:
    """The Secret holding RayCluster `cluster`'s Ray token, or None where its Ray has no token authentication."""
    return cluster if has_token_auth(ray_version) else None


def ray_cluster(spec: RayClusterSpec) -> dict[str, Any]:
    """The RayCluster custom resource (ray.io/v1). From Ray 2.52 on, with Ray's token authentication:
    KubeRay makes the token Secret and gives every Ray container RAY_AUTH_MODE and RAY_AUTH_TOKEN."""
    body: dict[str, Any] = {
        "rayVersion": spec.ray_version,
        "headGroupSpec": _head_group(spec),
        "workerGroupSpecs": [_worker_group(spec)],
        # A new spec (a new checkpoint program's ConfigMap, an image) recreates every pod, so all run one
        # program: KubeRay 1.6.2 recreates a running cluster's pods only so (shouldRecreatePodsForUpgrade).
        "upgradeStrategy": {"type": "Recreate"},
    }
    if token_secret(spec.name, spec.ray_version):
        body["authOptions"] = {"mode": "token"}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": spec.name,
            "namespace": spec.namespace,
        },
        "spec": body,
    }


def _head_group(spec: RayClusterSpec) -> dict[str, Any]:
    start_params = {"dashboard-host": "0.0.0.0"}
    resources = HEAD_RESOURCES_A4X if spec.a4x else HEAD_RESOURCES_X86
    container: dict[str, Any] = {
        "name": "ray-head",
        "image": spec.image,
        "ports": [
            {"containerPort": GCS_PORT, "name": "gcs-server"},
            {"containerPort": DASHBOARD_PORT, "name": "dashboard"},
            {"containerPort": CLIENT_PORT, "name": "client"},
        ],
        "resources": {"limits": dict(resources), "requests": dict(resources)},
        "securityContext": container_security(),
        "volumeMounts": [
            {"mountPath": "/tmp/ray", "name": "ray-logs"},
            bucket_mount(),
        ],
    }
    env = [*_verl_path_env(spec), *_wandb_env(spec)]
    if env:
        container["env"] = env
    pod: dict[str, Any] = {
        "serviceAccountName": spec.service_account,
        # Ray never calls the Kubernetes API; Workload Identity and the FUSE driver need no token file.
        "automountServiceAccountToken": False,
        "securityContext": dict(POD_SECURITY_CONTEXT),
        "nodeSelector": _head_node_selector(spec),
    }
    if spec.a4x or not spec.head_runs_tasks:
        # No task is scheduled on a head that takes no Ray CPUs (A4X: it shares a GB200 node, no CPU node can
        # run the arm64-only image).
        start_params["num-cpus"] = "0"
    if spec.a4x:
        pod["tolerations"] = [dict(GPU_TOLERATION)]
        container["lifecycle"] = _transfer_queue_hook()
    if spec.arm64:
        pod.setdefault("tolerations", []).append(dict(ARM_TOLERATION))
    pod["containers"] = [container]
    pod["volumes"] = [{"name": "ray-logs", "emptyDir": {}}, *bucket_volumes(spec.claim_name)]
    annotations = sidecar_annotations(spec.mode == "autopilot")
    if spec.checkpoint_root:
        # The job's entrypoint (the checkpoint launcher) runs here; the driver saves data.pt here.
        container["volumeMounts"] += checkpoints.mounts()
        if bucket_env := checkpoints.bucket_env(spec.bucket):
            container["env"] = [*container.get("env", []), *bucket_env]
        pod["volumes"] += checkpoints.volumes(spec.checkpoint_digest)
        annotations[checkpoints.DIGEST_ANNOTATION] = spec.checkpoint_digest
    return {
        "rayStartParams": start_params,
        "template": {"metadata": {"annotations": annotations}, "spec": pod},
    }


def _head_node_selector(spec: RayClusterSpec) -> dict[str, str]:
    if spec.a4x:
        return {"cloud.google.com/gke-accelerator": spec.accelerator}
    if spec.mode == "autopilot":
        # The tutorial's head also asks for gke-spot: a preempted head loses the run (bug 6).
        return {
            "cloud.google.com/machine-family": "c2",
            "cloud.google.com/compute-class": "Performance",
        }
    return {"cloud.google.com/gke-nodepool": spec.head_node_pool}


def _worker_group(spec: RayClusterSpec) -> dict[str, Any]:
    annotations = sidecar_annotations(spec.mode == "autopilot")
    if not spec.dra_nics and spec.rdma_nics:
        annotations["networking.gke.io/default-interface"] = "eth0"
        annotations["networking.gke.io/interfaces"] = json.dumps(interfaces(spec.rdma_nics))
    size = {
        "cpu": str(spec.worker_cpus),
        "memory": f"{spec.worker_memory_gi}Gi",
        "nvidia.com/gpu": str(spec.gpus_per_node),
        "ephemeral-storage": f"{spec.worker_ephemeral_gi}Gi",
    }
    container: dict[str, Any] = {
        "name": "ray-worker",
        "image": spec.image,
        "env": [{"name": "LD_LIBRARY_PATH", "value": spec.ld_library_path}, *_verl_path_env(spec), *_wandb_env(spec)],
        "resources": {"limits": dict(size), "requests": dict(size)},
        "securityContext": container_security(WORKER_CAPABILITIES),
        "volumeMounts": [
            {"name": "nvidia", "mountPath": "/usr/local/nvidia", "readOnly": True},
            {"name": "gib", "mountPath": "/usr/local/gib", "readOnly": True},
            {"name": "shared-memory", "mountPath": "/dev/shm"},
            {"name": "ray-tmp-storage", "mountPath": "/tmp"},
            bucket_mount(),
        ],
    }
    pod: dict[str, Any] = {
        "serviceAccountName": spec.service_account,
        "automountServiceAccountToken": False,
        "securityContext": dict(POD_SECURITY_CONTEXT),
        "nodeSelector": _worker_node_selector(spec),
        "tolerations": [dict(GPU_TOLERATION)],
    }
    if spec.compute_class and spec.mode != "autopilot":
        pod["tolerations"].append(compute_class.toleration(spec.compute_class))
    if spec.a4x:
        container["lifecycle"] = _transfer_queue_hook()
        claims = a4x_claims(spec.rdma_nics if spec.dra_nics else 0)
        container["resources"]["claims"] = [{"name": claim["name"]} for claim in claims]
        pod["resourceClaims"] = claims
    if spec.arm64:
        pod["tolerations"].append(dict(ARM_TOLERATION))
    if spec.a4x:
        # One worker per host: each claims all of its node's NICs and GPUs.
        pod["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": {"ray.io/group": WORKER_GROUP}},
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            }
        }
    pod["containers"] = [container]
    # The tutorial also mounts /lib64, /sys and /proc/sys host paths that no container uses.
    pod["volumes"] = [
        {"name": "gib", "hostPath": {"path": "/home/kubernetes/bin/gib"}},
        {"name": "nvidia", "hostPath": {"path": dra.NVIDIA_DRIVER_ROOT}},
        {"name": "shared-memory", "emptyDir": {"medium": "Memory", "sizeLimit": f"{spec.shm_gi}Gi"}},
        {"name": "ray-tmp-storage", "emptyDir": {}},
        *bucket_volumes(spec.claim_name),
    ]
    if spec.checkpoint_root:
        # verl's ranks save here (the Ray container, first: KubeRay's); the copier takes each save to the bucket.
        container["volumeMounts"] += checkpoints.mounts()
        container["env"] += checkpoints.bucket_env(spec.bucket)  # verl's trainer may run here (A4X)
        pod["containers"].append(checkpoints.copier(image=spec.image, checkpoint_root=spec.checkpoint_root,
                                                    bucket_mount=bucket_mount(), security=container_security(),
                                                    env=checkpoints.bucket_env(spec.bucket)))
        pod["volumes"] += checkpoints.volumes(spec.checkpoint_digest)
        annotations[checkpoints.DIGEST_ANNOTATION] = spec.checkpoint_digest
    return {
        "groupName": WORKER_GROUP,
        "replicas": spec.worker_replicas,
        "minReplicas": spec.worker_replicas,
        "maxReplicas": spec.worker_replicas,
        "rayStartParams": {"num-cpus": str(spec.worker_cpus)},
        "template": {"metadata": {"annotations": annotations}, "spec": pod},
    }


def _worker_node_selector(spec: RayClusterSpec) -> dict[str, str]:
    selector = {"cloud.google.com/gke-accelerator": spec.accelerator}
    if spec.mode == "autopilot":
        # Autopilot provisions nodes from these; the count must be a string (bug 3).
        selector["cloud.google.com/gke-accelerator-count"] = str(spec.gpus_per_node)
        if spec.worker_spot and not spec.compute_class:
            selector["cloud.google.com/gke-spot"] = "true"
        selector["cloud.google.com/compute-class"] = spec.compute_class or "Performance"
    elif spec.compute_class:
        selector["cloud.google.com/compute-class"] = spec.compute_class
    return selector


def interfaces(rdma_nics: int) -> list[dict[str, str]]:
    """The `networking.gke.io/interfaces` list: eth0 default, eth1 gVNIC, eth2.. one per RDMA NIC."""
    nets = ["default", GVNIC_NETWORK, *(rdma_network_name(i) for i in range(rdma_nics))]
    return [{"interfaceName": f"eth{i}", "network": net} for i, net in enumerate(nets)]


def a4x_claims(nic_claims: int) -> list[dict[str, str]]:
    """The A4X worker's pod-level resource claims: `nic_claims` RDMA NICs and the IMEX channel."""
    nics = [
        {"name": f"rdma-nic-{i}", "resourceClaimTemplateName": dra.RDMA_CLAIM_TEMPLATE}
        for i in range(nic_claims)
    ]
    return [*nics, {"name": "compute-domain-channel", "resourceClaimTemplateName": dra.CHANNEL_CLAIM_TEMPLATE}]


def _transfer_queue_hook() -> dict[str, Any]:
    requirement = f"{TRANSFER_QUEUE_REQUIREMENT} --hash=sha256:{TRANSFER_QUEUE_SHA256}"
    command = ["/bin/bash", "-c", "pip3 install --quiet --no-deps --only-binary=:all: --require-hashes "
               f"-r <(echo '{requirement}')"]
    return {"postStart": {"exec": {"command": command}}}


def _wandb_env(spec: RayClusterSpec) -> list[dict[str, Any]]:
    # verl's Tracking runs wherever its trainer lands (the head, or a worker on A4X).
    return [wandb_key.env()] if spec.wandb_key else []


def _verl_path_env(spec: RayClusterSpec) -> list[dict[str, str]]:
    # In the pod env too, for anything else run on the cluster (a `ray job submit` by hand).
    if spec.verl_dir is None:
        return []
    return [{"name": name, "value": value} for name, value in verl_path_env(spec.verl_dir).items()]
