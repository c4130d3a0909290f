"""The one table of GPU platform facts; every per-platform setting derives from it.

Sources: the tutorial for images, Ray versions, NCCL variables and
pod sizes; GCP's machine-type docs for machine sizes; GKE's "node allocatable" docs
for the reserved share. Pure data: importable without Pulumi.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Mode = Literal["autopilot", "standard"]

# The tutorial's A4X head; it shares a GB200 node with a worker, so workers are sized around it.
A4X_HEAD_CPUS = 12
A4X_HEAD_MEMORY_GI = 32


@dataclass(frozen=True)
class VllmSource:
    """vLLM's source release on PyPI (its sdist), pinned by content: what an image's vLLM is built from.
    Read only by the tests that hold verl's vLLM calls against it (tests/test_a4x_vllm_pairing.py)."""

    version: str
    sdist_url: str
    sha256: str

    @property
    def dir_name(self) -> str:
        return f"vllm-{self.version}"


# verl's docker/Dockerfile.stable.vllm from 2026-06-18 (commit 14574ecf5) to 2026-07-28 (2cf5706c5), the
# tutorial's ddbcdb7 among them: `ARG VLLM_VERSION=0.23.0`, vLLM cloned at tag v0.23.0 plus two unmerged
# fixes (vLLM PRs #44483, partial wake_up; #45589, FlashInfer-TRTLLM MoE load), built for x86_64 and
# aarch64; verl's CI image of that time is `vllm023.dev1`. The tag's own source is this sdist.
VLLM_0_23_0 = VllmSource(
    "0.23.0",
    "https://files.pythonhosted.org/packages/68/c6/c4dc766b09e93de278693502612de0beba822983d4f609830406ead65cc9/"
    "vllm-0.23.0.tar.gz",
    "760269db3d9611e12e524681df1bca0977d5d2f5fcb4481cc34d33efc4ae7ff5",
)
# verl v0.9.0's docker/Dockerfile.stable.vllm (`Target: verlai/verl:vllm024.dev2`, `ARG VLLM_VERSION=0.24.0`,
# no patches) and every vLLM workflow of verl's CI at v0.9.0 (`vllm024.dev2`).
VLLM_0_24_0 = VllmSource(
    "0.24.0",
    "https://files.pythonhosted.org/packages/d4/17/ea541f9ffb31d438ed6a5a8e1f7b9805410664abf97e326f28416147a5da/"
    "vllm-0.24.0.tar.gz",
    "0862453adc1f3339f1a0c9dca1179c34d6ed6e118f87b6e5bddd120af614ac66",
)


@dataclass(frozen=True)
class VerlRelease:
    """A verl wheel from PyPI, pinned by content. verl's images carry verl's dependencies but not
    verl (their Dockerfiles `pip uninstall -y verl`), so staging puts this wheel on the bucket."""

    version: str
    wheel_url: str
    sha256: str
    nccl_env: dict[str, str] = field(default_factory=dict, hash=False)  # a release hashes by its wheel
    """NCCL variables verl adds to every training process's env where the job's env lacks them
    (verl/trainer/constants_ppo.py, PPO_RAY_RUNTIME_ENV): the fabric check measures with them too."""
    defers_gradient_sync: bool = False
    """The actor's FSDP engine skips the gradient reduce-scatter on every micro-batch of a mini-batch but
    the last, with no switch, so each GPU holds an unsharded fp32 gradient of the whole model meanwhile
    (verl 0.9.0 verl/workers/engine/fsdp/transformer_impl.py, `_gradient_sync_context` in
    `forward_backward_batch`: FSDP2 `set_requires_gradient_sync(False)`, reduce dtype fp32 by default)."""
    ci_vllm: VllmSource | None = field(default=None, hash=False)
    """The vLLM verl's own CI ran this release with, where a platform's image carries another one."""

    @property
    def dir_name(self) -> str:
        """Where it is unpacked under the bucket mount, one directory per version."""
        return f"verl-{self.version}"


_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def has_digest(image: str) -> bool:
    """Pinned to its bytes: `name[:tag]@sha256:<64 hex>`. A tag alone can be moved."""
    return bool(_DIGEST.search(image))


# The digest each tagged image of the platform table and the charts serves, as `python -m
# verl_gke.image_pins` (a maintainer's machine with network) read it from its registry and wrote it here.
# An image without an entry is pinned at the stack's first `pulumi up` (components/pinned_image.py) and
# kept in its state. This machine reaches no registry, so the table starts empty.
# BEGIN IMAGE_DIGESTS (written by python -m verl_gke.image_pins)
IMAGE_DIGESTS: dict[str, str] = {
}
# END IMAGE_DIGESTS


def repository_pin(image: str, stack_digests: Mapping[str, str] | None = None) -> str | None:
    """`image` by digest as the repository pins it (`name:tag@sha256:...`), else as the stack's config
    does (imageDigests), or None when only the first `pulumi up` can."""
    if has_digest(image):
        return image
    digest = IMAGE_DIGESTS.get(image) or (stack_digests or {}).get(image)
    return f"{image}@{digest}" if digest else None


TOKEN_AUTH_RAY = (2, 52, 0)
"""Ray's first release with token authentication of its dashboard, Job API and GCS (RAY_AUTH_MODE=token),
which KubeRay 1.6 turns on with a RayCluster's `authOptions` (docs.ray.io, "Configure Ray clusters to
use token authentication")."""
_RAY_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")


def is_ray_version(text: str) -> bool:
    return bool(_RAY_VERSION.match(text))


def has_token_auth(ray_version: str) -> bool:
    """Whether Ray `ray_version` (X.Y.Z) authenticates its clients with a token."""
    match = _RAY_VERSION.match(ray_version)
    return bool(match) and tuple(int(part) for part in match.groups()) >= TOKEN_AUTH_RAY


def is_pinned_image(image: str) -> bool:
    """A fixed tag (not `latest`) or a digest; a registry port (`host:5000/x`) is not a tag."""
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest")


PlatformName = Literal["a4", "a3u", "a4x", "g2"]


@dataclass(frozen=True)
class PodSize:
    """A pod's requests: vCPUs, memory and ephemeral storage in Gi."""

    cpu: int
    memory_gi: int
    ephemeral_gi: int


AUTOPILOT_SIDECAR = PodSize(cpu=2, memory_gi=16, ephemeral_gi=100)
"""The GCS FUSE sidecar on Autopilot (requests = limits, GKE's guidance for training); its requests
count toward the pod's against Autopilot's per-accelerator maxima."""
CHECKPOINT_COPIER = PodSize(cpu=1, memory_gi=1, ephemeral_gi=1)
"""The checkpoint copier beside every GPU worker (workloads/checkpoints.py `copy`; requests = limits): a
Python loop copying files through the GCS FUSE mount, whose own work is the FUSE sidecar's. Taken from
the worker's share of the node, on Standard and Autopilot alike."""

GPU_POOL_NAME = "gpu-pool"
"""The Standard GPU node pool's name, in every stack with one capacity kind."""


def gpu_pool_name(kind: str) -> str:
    """The Standard GPU node pool of one capacity kind when a ComputeClass orders several: `gpu-flex-start`."""
    return f"gpu-{kind}"

# NCCL variables the tutorial's runtime-env.yaml sets for A4 and A3 Ultra (gIB plugin).
_GIB_NCCL_ENV: dict[str, str] = {
    "NCCL_NET_PLUGIN": "/usr/local/gib/lib64/libnccl-net_internal.so",
    "NCCL_CROSS_NIC": "0",
    "NCCL_NET_GDR_LEVEL": "PIX",
    "NCCL_P2P_NET_CHUNKSIZE": "131072",
    "NCCL_NVLS_CHUNKSIZE": "524288",
    "NCCL_IB_ADAPTIVE_ROUTING": "1",
    "NCCL_IB_QPS_PER_CONNECTION": "4",
    "NCCL_IB_TC": "52",
    "NCCL_IB_FIFO_TC": "84",
}

NCCL_INSTALLER_REPO = "https://raw.githubusercontent.com/GoogleCloudPlatform/container-engine-accelerators"
"""Google's NCCL RDMA installer manifests (the tutorial applies them from here)."""
_INSTALLER_URL = re.compile(rf"^{re.escape(NCCL_INSTALLER_REPO)}/[0-9a-f]{{40}}/gpudirect-rdma/[A-Za-z0-9._-]+\.yaml$")


def is_nccl_installer_url(url: str) -> bool:
    """A manifest of Google's installers at a commit: that repository, a 40-hex commit, a file under
    gpudirect-rdma/; no other host or repository, branch, tag, query or fragment."""
    return bool(_INSTALLER_URL.match(url))


# The images of the NCCL RDMA installers (gIB plugin and its NCCL build) in Google's manifests under
# gpudirect-rdma/ at manifests.nccl.NCCL_INSTALLER_COMMIT: nccl-rdma-installer.yaml (and -autopilot)
# for A4 and A3 Ultra, nccl-rdma-installer-a4x.yaml for A4X. Pinned by digest at the first `pulumi up`.
_GIB_INSTALLER_IMAGE = "us-docker.pkg.dev/gce-ai-infra/gpudirect-gib/nccl-plugin-gib:v1.1.1"
_GIB_INSTALLER_IMAGE_ARM64 = "us-docker.pkg.dev/gce-ai-infra/gpudirect-gib/nccl-plugin-gib-arm64:v1.1.0"

# The tutorial's x86 image is the moving `vllm011.latest`; `vllm011.dev7` is the fixed vLLM 0.11
# build that verl's docs and CI name (verl commit 0958b940b). The arm64 one is the tutorial's.
# rayVersion stays the tutorial's per platform: KubeRay uses it only to gate features.
X86_VERL_IMAGE = "verlai/verl:vllm011.dev7"
ARM_VERL_IMAGE = "verlai/verl:vllm023.aarch64.dev1"
PINNED_IMAGE_ARCH = {X86_VERL_IMAGE: "amd64", ARM_VERL_IMAGE: "arm64"}
"""Each pinned image is built for one CPU architecture only."""
IMAGE_ROLLOUTS = {X86_VERL_IMAGE: ("vllm",), ARM_VERL_IMAGE: ("vllm",)}
"""The rollout engines (verl's `actor_rollout_ref.rollout.name`) each pinned image holds: verl's
Dockerfile.stable.vllm installs vLLM and no SGLang (verl builds SGLang into images of their own)."""


# The release verl's CI runs in verlai/verl:vllm011.dev7 (every workflow at tag v0.6.1).
VERL_0_6_1 = VerlRelease(
    "0.6.1",
    "https://files.pythonhosted.org/packages/c2/56/21bc9c0b0532cd5d94a151d084817080f5597af93755f79c899c61894be8/"
    "verl-0.6.1-py3-none-any.whl",
    "a67dd50fb99b402db0c990d4c92710be9a728cb18607515daa0f1e8552e47983",
    # NVLS and other cuMem-based paths off, for vLLM's weight sync (verl's comment there).
    nccl_env={"NCCL_CUMEM_ENABLE": "0"},
)
# The tutorial builds its A4X image for verl commit ddbcdb7, between releases 0.8.0 and 0.9.0.
# 0.9.0 is the one whose declared vLLM range (>=0.18) holds the image's vLLM 0.23 (0.8.0 stops at
# 0.12), and the run's overrides compose identically with both (tests/test_verl_config.py). verl's CI
# ran 0.9.0 with vLLM 0.24.0; tests/test_a4x_vllm_pairing.py holds every vLLM call 0.9.0 makes against
# both vLLM sources (docs/checkpoints-and-a4x.md).
VERL_0_9_0 = VerlRelease(
    "0.9.0",
    "https://files.pythonhosted.org/packages/b1/48/279b03f544f8c1fe1c86a230ecac8a448a4fa80697a76543917205a1d8f8/"
    "verl-0.9.0-py3-none-any.whl",
    "6e9374db1e2ab346a0aafe9a202bee1b239a042def2f2ccd6db2a4cd04c6308b",
    ci_vllm=VLLM_0_24_0,
    defers_gradient_sync=True,
)


_RDMA_FLOOR_SOURCE = (
    "half the line rate of a node's 8 x 400 Gb/s RoCE NICs (400 GB/s; GCP's A4 and A3 Ultra machine docs): "
    "nccl-tests' all-reduce busbw across nodes is bounded by that rate (nccl-tests doc/PERFORMANCE.md), "
    "so a node with half its rails down cannot reach it; set from line rate, not yet from a measured deploy")

DRANET_MIN_GKE = "1.34.1-gke.1829001"
"""GKE managed DRANET (the A4X NICs as DRA devices) starts here (GKE's DRANET guide)."""


@dataclass(frozen=True)
class Platform:
    """Everything that differs between A4, A3 Ultra, A4X and the G2 smoke platform."""

    name: PlatformName
    title: str
    machine_type: str
    accelerator: str
    gpus_per_node: int
    rdma_nics: int
    arch: Literal["amd64", "arm64"]
    """CPU architecture of the GPU nodes; the image must match it."""
    machine_vcpus: int
    machine_memory_gb: int
    """Machine memory as GCP's machine-type table lists it, read as 10^9 bytes."""
    image: str
    verl: VerlRelease
    """The verl release the image was built for."""
    ray_version: str
    ray_cluster_name: str
    nccl_installer_image: str | None
    """The NCCL RDMA installer's image (name:tag) in Google's manifest for this platform; None: no RDMA (G2),
    NCCL runs over TCP and nothing is installed."""
    nccl_env: dict[str, str] = field(default_factory=dict)
    ld_library_path: str = "/usr/local/nvidia/lib64"
    worker_ephemeral_storage_gi: int = 1000
    shm_size_gi: int = 250
    autopilot_supported: bool = True
    accelerator_topology: str | None = None
    """NVLink domain shape for COMPACT placement (A4X: one 72-GPU NVL72 rack, Cluster Toolkit gke-a4x)."""
    autopilot_nccl_installer: str | None = None
    """Google's Autopilot installer manifest (path under gpudirect-rdma/), applied as written: Autopilot
    admits its privileged, host-path pods only as Google wrote them. Standard clusters get verl-gke's
    own DaemonSet (manifests.nccl.installer_daemonset)."""
    head_on_gpu_node: bool = False
    """The Ray head shares a GPU node with a worker (A4X: its arm64-only image runs on no CPU node)."""
    trainer_on_worker: bool = False
    """The head takes no Ray CPUs, so verl's trainer (its TaskRunner) runs on a GPU worker: A4X's placement, on
    the smoke platform so that its run exercises it (the checkpoint copiers' harder case)."""
    min_gke_version: str | None = None
    """Lowest GKE version the platform's own features need (A4X: DRA resource.k8s.io/v1, GKE 1.34)."""
    fabric_min_busbw_gbps: float = 100.0
    """All-reduce bus bandwidth (GB/s, nccl-tests' busbw) below which the fabric check fails the deploy:
    NCCL over TCP manages a few to ~20 GB/s; RDMA (8 x 400 Gb/s NICs on A4/A3 Ultra, 4 on A4X) and
    NVLink are many times above it. Each platform sets its own, with `fabric_floor_source`."""
    local_ssd_count: int | None = None
    """Local SSDs bundled with the machine type, all backing ephemeral storage (Cluster Toolkit's
    gke-a4 and gke-a3-ultragpu: 32). None: not in our sources; the node pool then sends 0, which
    GKE reads as "the machine type's own count" for series that bundle a fixed count."""
    autopilot_max_pod: PodSize | None = None
    """The largest GPU worker pod (sidecar included) the stack asks Autopilot for. Autopilot rejects a
    pod above its per-accelerator maxima (GKE "Resource requests in Autopilot"); A4's is the tutorial's
    Autopilot worker (220 vCPU, 2800Gi, 1000Gi ephemeral), which Autopilot admits."""
    boot_disk_type: str = "hyperdisk-balanced"
    """Boot disk of the GPU nodes. A4, A3 Ultra and A4X boot from Hyperdisk only (Compute Engine's
    disk support per machine series); Cluster Toolkit's gke-a4x sets hyperdisk-balanced explicitly."""
    boot_disk_gb: int = 100
    """Cluster Toolkit's gke-a4, gke-a3-ultragpu and gke-a4x GPU pools (a4/a3ultra/a4x_node_pool_disk_size_gb)."""
    fabric_floor_source: str = ""
    """Where fabric_min_busbw_gbps comes from."""
    fabric_line_rate_gbps: float = 0.0
    """The most an all-reduce across nodes can reach (GB/s): the line rate of what carries it, `fabric_links`.
    A floor above it fails every fabric."""
    fabric_links: str = ""
    fabric_transports: tuple[str, ...] = ()
    """NCCL transports (as its `via ...` log lines name them) the fabric check must see between nodes;
    any other `NET/...` (NET/Socket: TCP) fails it."""
    secure_boot: bool = True
    """Shielded VM Secure Boot on the GPU nodes (only signed boot components and kernel modules load; GKE's own
    GPU driver install is signed). Cluster Toolkit's gke-a4, gke-a3-ultragpu and gke-a4x blueprints keep
    gke-node-pool's `enable_secure_boot` default, true (cluster-toolkit 1047080, 2026-06-25); False only for a
    family that cannot boot so, or for drivers GKE does not install."""
    gpu_memory_mib: int = 0
    """HBM per GPU as the device reports it (nvidia-smi's memory.total, MiB): what CUDA, PyTorch and vLLM's
    gpu_memory_utilization count in. GCP's machine table rounds it (180 / 141 / 186 "GB" a GPU)."""
    peak_bf16_flops: float = 0.0
    """Dense bf16 tensor-core FLOP/s of one GPU (no sparsity), from NVIDIA's specifications: the run-time
    model's ceiling (domain/run_time.py)."""
    image_vllm: VllmSource | None = None
    """The source of the image's vLLM where it is not the one verl's CI ran `verl` with (A4X)."""

    @property
    def gpu_memory_bytes(self) -> int:
        return self.gpu_memory_mib * 2**20

    @property
    def gpu_memory_gib(self) -> float:
        return self.gpu_memory_mib / 1024

    @property
    def allocatable_cpu(self) -> float:
        """vCPUs left to pods after GKE's kube-reserved share (GKE node-allocatable docs)."""
        return self.machine_vcpus - _reserved_cpu(self.machine_vcpus)

    @property
    def allocatable_memory_gib(self) -> float:
        """Memory left to pods after GKE's kube-reserved share and the 100 MiB eviction threshold."""
        memory_gib = self.machine_memory_gb * 1e9 / 2**30
        return memory_gib - _reserved_memory_gib(memory_gib) - 100 / 1024

    @property
    def autopilot_worker(self) -> PodSize | None:
        """The Autopilot worker container's requests: the pod ceiling less the GCS FUSE sidecar."""
        if self.autopilot_max_pod is None:
            return None
        top, car, copier = self.autopilot_max_pod, AUTOPILOT_SIDECAR, CHECKPOINT_COPIER
        return PodSize(top.cpu - car.cpu - copier.cpu, top.memory_gi - car.memory_gi - copier.memory_gi,
                       top.ephemeral_gi - car.ephemeral_gi - copier.ephemeral_gi)

    def worker_ephemeral_gi(self, mode: Mode) -> int:
        worker = self.autopilot_worker if mode == "autopilot" else None
        return worker.ephemeral_gi if worker else self.worker_ephemeral_storage_gi

    @property
    def max_placement_nodes(self) -> int | None:
        """Nodes one COMPACT placement holds: a 1x72 topology is one 72-GPU NVLink rack (18 A4X nodes)."""
        if self.accelerator_topology is None:
            return None
        return int(self.accelerator_topology.split("x")[1]) // self.gpus_per_node

    @property
    def head_cpus(self) -> int:
        """vCPUs the Ray head takes on a GPU node (0 where it runs on a CPU node)."""
        return A4X_HEAD_CPUS if self.head_on_gpu_node else 0

    @property
    def head_memory_gi(self) -> int:
        return A4X_HEAD_MEMORY_GI if self.head_on_gpu_node else 0

    @property
    def max_worker_cpus(self) -> int:
        """The largest CPU request a worker can get scheduled with (beside its checkpoint copier, and the head
        where it shares the node)."""
        return math.floor(self.allocatable_cpu - self.head_cpus - CHECKPOINT_COPIER.cpu)

    @property
    def max_worker_memory_gi(self) -> int:
        return math.floor(self.allocatable_memory_gib - self.head_memory_gi - CHECKPOINT_COPIER.memory_gi)

    @property
    def worker_cpus(self) -> int:
        """CPU request of a Ray worker: allocatable minus room for DaemonSets, the gcsfuse sidecar, the
        checkpoint copier and, where it shares the node, the Ray head."""
        return math.floor(self.allocatable_cpu) - WORKER_CPU_HEADROOM - self.head_cpus - CHECKPOINT_COPIER.cpu

    @property
    def worker_memory_gi(self) -> int:
        """Memory request of a Ray worker, with headroom for DaemonSets, the gcsfuse sidecar and, where it
        shares the node, the Ray head."""
        return (math.floor(self.allocatable_memory_gib * WORKER_MEMORY_FRACTION) - self.head_memory_gi
                - CHECKPOINT_COPIER.memory_gi)


# Room left on a GPU node for GKE's DaemonSets (device plugin, NCCL installer, logging,
# gcsfuse sidecar): 3 vCPUs and 5% of allocatable memory.
WORKER_CPU_HEADROOM = 3
WORKER_MEMORY_FRACTION = 0.95


def _reserved_cpu(vcpus: int) -> float:
    """GKE reserves 6% of the first core, 1% of the next, 0.5% of the next 2, 0.25% above 4."""
    tiers = [(1, 0.06), (1, 0.01), (2, 0.005), (math.inf, 0.0025)]
    return _tiered(vcpus, tiers)


def _reserved_memory_gib(memory_gib: float) -> float:
    """GKE reserves 25% of the first 4 GiB, 20% of the next 4, 10% of the next 8,
    6% of the next 112 and 2% of everything above 128 GiB."""
    tiers = [(4, 0.25), (4, 0.20), (8, 0.10), (112, 0.06), (math.inf, 0.02)]
    return _tiered(memory_gib, tiers)


def _tiered(amount: float, tiers: list[tuple[float, float]]) -> float:
    reserved, left = 0.0, amount
    for size, rate in tiers:
        step = min(left, size)
        reserved += step * rate
        left -= step
        if left <= 0:
            break
    return reserved


PLATFORMS: dict[str, Platform] = {
    "a4": Platform(
        name="a4",
        title="A4 (8x NVIDIA B200)",
        machine_type="a4-highgpu-8g",
        accelerator="nvidia-b200",
        gpus_per_node=8,
        rdma_nics=8,
        arch="amd64",
        machine_vcpus=224,
        machine_memory_gb=3968,
        image=X86_VERL_IMAGE,
        verl=VERL_0_6_1,
        ray_version="2.47.0",
        ray_cluster_name="b200-ray-cluster",
        nccl_installer_image=_GIB_INSTALLER_IMAGE,
        fabric_min_busbw_gbps=200.0,
        fabric_floor_source=_RDMA_FLOOR_SOURCE,
        fabric_line_rate_gbps=400.0,
        fabric_links="8 x 400 Gb/s RoCE NICs",
        fabric_transports=("NET/gIB", "NET/IB"),
        # nvidia-smi on B200: 183359MiB (179 GiB); NVIDIA HGX B200 (1,000 W): 2.25 PFLOP/s dense bf16.
        gpu_memory_mib=183_359,
        peak_bf16_flops=2.25e15,
        nccl_env={**_GIB_NCCL_ENV, "NCCL_TUNER_CONFIG_PATH": "/usr/local/gib/configs/tuner_config_a4.txtpb"},
        autopilot_nccl_installer="gpudirect-rdma/nccl-rdma-installer-autopilot.yaml",
        local_ssd_count=32,
        autopilot_max_pod=PodSize(cpu=220, memory_gi=2800, ephemeral_gi=1000),
    ),
    "a3u": Platform(
        name="a3u",
        title="A3 Ultra (8x NVIDIA H200)",
        machine_type="a3-ultragpu-8g",
        accelerator="nvidia-h200-141gb",
        gpus_per_node=8,
        rdma_nics=8,
        arch="amd64",
        machine_vcpus=224,
        machine_memory_gb=2952,
        image=X86_VERL_IMAGE,
        verl=VERL_0_6_1,
        ray_version="2.47.0",
        # The tutorial names it b200-ray-cluster for H200 too.
        ray_cluster_name="h200-ray-cluster",
        nccl_installer_image=_GIB_INSTALLER_IMAGE,
        fabric_min_busbw_gbps=200.0,
        fabric_floor_source=_RDMA_FLOOR_SOURCE,
        fabric_line_rate_gbps=400.0,
        fabric_links="8 x 400 Gb/s RoCE NICs",
        fabric_transports=("NET/gIB", "NET/IB"),
        # nvidia-smi on H200: 143771MiB (140 GiB); NVIDIA H200 SXM: 989 TFLOP/s dense bf16 (1,979 sparse).
        gpu_memory_mib=143_771,
        peak_bf16_flops=0.989e15,
        # H200 needs the a3u tuner file, not the tutorial's a4 one.
        nccl_env={**_GIB_NCCL_ENV, "NCCL_TUNER_CONFIG_PATH": "/usr/local/gib/configs/tuner_config_a3u.txtpb"},
        autopilot_nccl_installer="gpudirect-rdma/nccl-rdma-installer-autopilot.yaml",
        local_ssd_count=32,
    ),
    "a4x": Platform(
        name="a4x",
        title="A4X (4x NVIDIA GB200, arm64)",
        machine_type="a4x-highgpu-4g",
        accelerator="nvidia-gb200",
        gpus_per_node=4,
        rdma_nics=4,
        arch="arm64",
        machine_vcpus=140,
        machine_memory_gb=884,
        image=ARM_VERL_IMAGE,
        verl=VERL_0_9_0,
        image_vllm=VLLM_0_23_0,
        ray_version="2.49.0",
        ray_cluster_name="gb200-ray-cluster",
        nccl_installer_image=_GIB_INSTALLER_IMAGE_ARM64,
        fabric_min_busbw_gbps=400.0,
        fabric_line_rate_gbps=900.0,
        fabric_links="NVLink 5: 900 GB/s per GPU and direction",
        fabric_floor_source=(
            "above what the 4 x 400 Gb/s RoCE NICs of a node carry (200 GB/s), so a fallback from NVLink "
            "fails; below NVLink 5's 900 GB/s per GPU and direction (NVIDIA GB200 NVL72 specifications)"),
        # Inside one NVL72 rack NCCL reaches the other nodes' GPUs over NVLink (MNNVL); the tutorial
        # tells users to look for `via P2P/MNNVL` in the log.
        fabric_transports=("P2P/MNNVL",),
        # nvidia-smi on GB200: 189471MiB (185 GiB); NVIDIA GB200 NVL72: 2.5 PFLOP/s dense bf16 a GPU (5 sparse).
        gpu_memory_mib=189_471,
        peak_bf16_flops=2.5e15,
        # The tutorial's A4X runtime env: the gcp NCCL env plugin picks the rest.
        nccl_env={"NCCL_ENV_PLUGIN": "gcp"},
        ld_library_path="/usr/local/nvidia/lib64:/usr/local/gib/lib64",
        worker_ephemeral_storage_gi=500,
        shm_size_gi=200,
        autopilot_supported=False,
        accelerator_topology="1x72",
        # The tutorial's A4X head runs on a GB200 node beside a worker (120 + 12 vCPUs there).
        head_on_gpu_node=True,
        min_gke_version="1.34",
    ),
    # The smoke platform: the cheapest GPUs verl runs on, to prove the whole path before paying for the
    # others. One L4 a node, so two nodes put verl's trainer on a worker and NCCL across nodes, over TCP
    # (no RDMA NICs, no DRA/IMEX; amd64). g2-standard-8 (GCP's accelerator-optimized machines: 8 vCPUs,
    # 32 GB, one L4, one bundled 375 GB Local SSD, up to 16 Gbps egress): g2-standard-4's 16 GB leaves the
    # worker ~10 GiB beside the fp32 actor, vLLM's host side and the export's merge.
    "g2": Platform(
        name="g2",
        title="G2 (1x NVIDIA L4, smoke)",
        machine_type="g2-standard-8",
        accelerator="nvidia-l4",
        gpus_per_node=1,
        rdma_nics=0,
        arch="amd64",
        machine_vcpus=8,
        machine_memory_gb=32,
        # The A4/A3 Ultra image: vLLM 0.11 and its torch 2.8 wheels are built for sm_89 (CUDA 12.8 arch list
        # 7.0-12.0), and FlashAttention 2 runs on Ada (sm_80 and up); only FlashAttention 3 (Hopper) and FP8
        # MoE kernels are not, which a dense bf16 0.5B run does not use.
        image=X86_VERL_IMAGE,
        verl=VERL_0_6_1,
        ray_version="2.47.0",
        ray_cluster_name="l4-ray-cluster",
        nccl_installer_image=None,
        # NCCL over TCP on the pod's own interface (NET/Socket); no plugin, no RDMA.
        nccl_env={"NCCL_SOCKET_IFNAME": "eth0"},
        worker_ephemeral_storage_gi=200,
        shm_size_gi=8,
        autopilot_supported=False,
        fabric_min_busbw_gbps=0.5,
        fabric_line_rate_gbps=2.0,
        fabric_links="one gVNIC of up to 16 Gbps per g2-standard-8 (TCP)",
        fabric_floor_source=(
            "a quarter of the 2 GB/s (16 Gbps) a g2-standard-8 sends (GCP's G2 machine docs): NCCL over TCP "
            "between two pods reaches a share of it; set from line rate, not yet from a measured deploy"),
        fabric_transports=("NET/Socket",),
        # nvidia-smi on L4: 23034MiB (22.5 GiB); NVIDIA L4 datasheet: 121 TFLOP/s dense bf16 (242 sparse).
        gpu_memory_mib=23_034,
        peak_bf16_flops=0.121e15,
        local_ssd_count=1,
        # G2 boots from Persistent Disk (Compute Engine's disk support per machine series: no Hyperdisk Balanced).
        boot_disk_type="pd-balanced",
        boot_disk_gb=200,
        trainer_on_worker=True,
    ),
}
SMOKE_PLATFORM = "g2"
SMOKE_CANNOT_EXERCISE = "RDMA (NCCL runs over TCP), DRA/IMEX and ComputeDomains (A4X), arm64 images (A4X)"
"""What the smoke platform cannot exercise of the others, said once in synth's output and the docs."""


CPU_MACHINE_SERIES: dict[str, tuple[str, ...]] = {
    "c2": ("standard",), **{series: ("standard", "highcpu", "highmem")
                            for series in ("c2d", "c3", "c3d", "c4", "e2", "n1", "n2", "n2d", "n4")},
}
"""x86 machine series (and their types) the CPU pool takes, `<series>-<type>-<vCPUs>`: the pool runs the
amd64 Ray head and staging (Compute Engine's general-purpose and compute-optimized machine families,
https://cloud.google.com/compute/docs/machine-resource). Which vCPU counts a series offers is
checked by GKE when it creates the pool."""
LOCAL_SSD_SERIES = ("c3", "c3d", "c4")
"""Series with `-lssd` machine types (bundled Local SSD)."""


@dataclass(frozen=True)
class Duration:
    """How long creating one resource of a kind takes in a first `pulumi up`, and why we think so."""

    seconds: float
    source: str


_ESTIMATE = "first-deploy estimate, not yet measured by verl-gke"
DEPLOY_DURATIONS: dict[str, Duration] = {
    "gcp:projects/service:Service": Duration(60, f"Service Usage enable operation; {_ESTIMATE}"),
    "gcp:compute/router:Router": Duration(30, f"regional Compute Engine operation; {_ESTIMATE}"),
    "gcp:compute/routerNat:RouterNat": Duration(30, f"regional Compute Engine operation; {_ESTIMATE}"),
    "gcp:compute/network:Network": Duration(30, f"global Compute Engine operation; {_ESTIMATE}"),
    "gcp:compute/subnetwork:Subnetwork": Duration(20, f"regional Compute Engine operation; {_ESTIMATE}"),
    "gcp:compute/firewall:Firewall": Duration(10, f"global Compute Engine operation; {_ESTIMATE}"),
    "gcp:compute/resourcePolicy:ResourcePolicy": Duration(10, f"regional Compute Engine operation; {_ESTIMATE}"),
    "gcp:serviceaccount/account:Account": Duration(10, f"IAM call; {_ESTIMATE}"),
    "gcp:projects/iAMMember:IAMMember": Duration(10, f"IAM policy read-modify-write; {_ESTIMATE}"),
    "gcp:storage/bucket:Bucket": Duration(5, f"one Cloud Storage call; {_ESTIMATE}"),
    "gcp:storage/bucketIAMMember:BucketIAMMember": Duration(5, f"one Cloud Storage call; {_ESTIMATE}"),
    "gcp:storage/managedFolder:ManagedFolder": Duration(5, f"one Cloud Storage call; {_ESTIMATE}"),
    "gcp:storage/managedFolderIamMember:ManagedFolderIamMember": Duration(5, f"one Cloud Storage call; {_ESTIMATE}"),
    "gcp:container/cluster:Cluster": Duration(
        540, "GKE Standard or Autopilot regional control plane with its initial node; GKE quotes 'several "
        f"minutes'; {_ESTIMATE}"),
    "gcp:container/nodePool:NodePool": Duration(180, f"the CPU pool's e2/n2 nodes; {_ESTIMATE}"),
    "gcp:artifactregistry/repository:Repository": Duration(10, f"one Artifact Registry operation; {_ESTIMATE}"),
    "gcp:secretmanager/secret:Secret": Duration(5, f"one Secret Manager call; {_ESTIMATE}"),
    "gcp:secretmanager/secretIamMember:SecretIamMember": Duration(5, f"IAM call; {_ESTIMATE}"),
    "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember": Duration(5, f"IAM call; {_ESTIMATE}"),
    "kubernetes:helm.sh/v3:Release": Duration(
        120, f"helm install with --wait: the operator's image pull and rollout on a CPU node; {_ESTIMATE}"),
    "kubernetes:yaml/v2:ConfigFile": Duration(
        120, f"Google's NCCL installer DaemonSet's rollout on the GPU nodes (awaited); {_ESTIMATE}"),
    "kubernetes:apps/v1:DaemonSet": Duration(
        120, f"the NCCL installer DaemonSet's rollout on the GPU nodes (awaited); {_ESTIMATE}"),
    "kubernetes:batch/v1:Job": Duration(
        600, f"staging: ~65 GB of Qwen2.5-32B from the Hugging Face Hub into the bucket; {_ESTIMATE}"),
    # (A model of another size: staging_duration.)
    "kubernetes:apps/v1:Deployment": Duration(60, f"a small image's pull and rollout on a CPU node; {_ESTIMATE}"),
    "pulumi-python:dynamic:GrpoJob": Duration(
        90, "the readiness gate, the fabric check (an all-reduce of 256 MB, seconds, after NCCL set-up) and "
        f"the submission until RUNNING; {_ESTIMATE}"),
    "pulumi-python:dynamic:UpgradeExclusionStart": Duration(1, "reads the deploying machine's clock, no cloud call"),
    "pulumi-python:dynamic:PinnedImage": Duration(
        2, f"two small HTTPS requests to the image's registry (a token, a manifest HEAD); {_ESTIMATE}"),
    "pulumi-python:dynamic:PinnedChart": Duration(
        2, f"one download of a chart archive (tens of KB) and its sha256; {_ESTIMATE}"),
}
"""Create time per resource type; a Kubernetes object not listed is one API write (KUBE_WRITE)."""
STAGING_FIXED_S = 60.0
"""Staging's pod start, GSM8K and the verl wheel, besides the model; an estimate."""
_STAGED_32B_BYTES = 65.5e9
"""Qwen2.5-32B-Instruct's bf16 safetensors, which DEPLOY_DURATIONS' staging Job figure is for."""


def staging_duration(model_bytes: float) -> Duration:
    """The staging Job for a model of `model_bytes`, at the Hub-to-bucket rate of the 32B estimate above."""
    rate = _STAGED_32B_BYTES / (DEPLOY_DURATIONS["kubernetes:batch/v1:Job"].seconds - STAGING_FIXED_S)
    return Duration(STAGING_FIXED_S + model_bytes / rate,
                    f"staging: {model_bytes / 1e9:.1f} GB from the Hugging Face Hub at {rate / 1e6:.0f} MB/s (the "
                    f"32B estimate's rate) + {STAGING_FIXED_S:g} s; {_ESTIMATE}")
KUBE_WRITE = Duration(2, "one Kubernetes API write, not awaited further")
GPU_POOL_CREATE = Duration(
    600, "GKE node pool of reserved A4 / A3 Ultra / A4X machines: VM creation, GPU driver install, node "
    f"registration; {_ESTIMATE}")
RAY_PODS_FROM_DOCKER_HUB = Duration(
    300, "the ~20 GB verl image pulled whole by every GPU node from Docker Hub through Cloud NAT before the "
    f"Ray containers start; {_ESTIMATE}")
RAY_PODS_STREAMED = Duration(
    90, "GKE image streaming from Artifact Registry: containers start before the image is fully "
    f"downloaded (GKE docs: 'Use Image streaming to pull container images'); {_ESTIMATE}")
AUTOPILOT_GPU_NODES = Duration(
    600, f"Autopilot provisions the GPU nodes once the Ray pods are pending (as GPU_POOL_CREATE); {_ESTIMATE}")
