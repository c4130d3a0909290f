"""`verl-gke verify`: the verification matrix's checks that a live stack can answer, read-only.

Two halves. `gather` asks GCP (gcloud, with deadlines), the cluster's Kubernetes API and the bucket for
the facts, each bounded; a fact it could not get stays None with the reason in `Facts.missing`.
`checks` are pure functions of those facts: each returns PASS, FAIL or NOT CHECKED with what it saw
and what it expected, and names the row of docs/verification.md (or the "only on GCP" section) it
answers. Exit 1 on any FAIL; the JSON copy goes to gs://<bucket>/logs/<run>/verify.json.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from domain import gke_versions
from domain.network import MAX_PORTS_PER_VM, MIN_PORTS_PER_VM, VPC_MTU
from domain.platforms import PLATFORMS, Platform
from manifests.dra import COMPUTE_DOMAIN
from verl_gke import gke_facts, stack_outputs
from verl_gke.commands import run_tool
from verl_gke.console import CliError, one_line, progress
from verl_gke.stack_outputs import OutputsError, StackOutputs
from workloads.checkpoints import MARKER
from workloads.run_logs import attempt_file, run_folder
from workloads.run_record import RunRecord

Status = Literal["PASS", "FAIL", "NOT CHECKED"]
GCLOUD_TIMEOUT_S = 60.0
KUBE_TIMEOUT_S = 30.0
ADVANCED_DATAPATH = "ADVANCED_DATAPATH"
"""GKE Dataplane V2: it enforces NetworkPolicy (networkConfig.datapathProvider)."""
GKE_METADATA = "GKE_METADATA"
"""A node pool's Workload Identity metadata server (config.workloadMetadataConfig.mode)."""
IMEX_DRIVER = "compute-domain.nvidia.com"
"""The NVIDIA DRA driver's ComputeDomain driver: it allocates each worker's IMEX channel claim."""
GCSFUSE_SIDECAR = "gke-gcsfuse-sidecar"
"""The container GKE's GCS FUSE CSI driver injects (GKE docs, "Configure the sidecar container")."""
VERIFY_FILE = "verify.json"
_SAVED = re.compile(r"verl-gke checkpoints: step (\d+): saved by verl on every node")
_TRAINER = re.compile(r"verl-gke checkpoints: step (\d+): verl's last save \(its trainer ran on ([^)\s]+)\)")
_STEP_DIR = re.compile(r"/global_step_(\d+)/")


@dataclass(frozen=True)
class NodePool:
    name: str
    disk_type: str
    metadata_mode: str
    gpu: bool
    """Its machines carry accelerators (config.accelerators), or are the platform's machine type."""


@dataclass(frozen=True)
class Nat:
    router: str
    name: str
    network: str
    dynamic_ports: bool
    min_ports: int
    max_ports: int


@dataclass(frozen=True)
class Container:
    pod: str
    name: str
    image: str
    image_id: str
    """status.containerStatuses[].imageID: what the node runs, `repo@sha256:...` ('' before it started)."""


@dataclass(frozen=True)
class ComputeDomainState:
    status: str
    """status.status of the ComputeDomain ('' while the driver has not set it)."""
    nodes: int
    """Nodes in status.nodes."""
    imex_claims: int
    """The namespace's ResourceClaims allocated by the ComputeDomain driver (one IMEX channel per worker)."""


@dataclass(frozen=True)
class Facts:
    """What the live stack answered; None: not read (the reason in `missing`)."""

    platform: str
    gpu_nodes: int
    gke_version: str | None = None
    autopilot: bool | None = None
    datapath: str | None = None
    workload_pool: str | None = None
    node_pools: tuple[NodePool, ...] | None = None
    dranet: bool | None = None
    """A4X: NICs by DRANET (no additionalNodeNetworkConfigs on the GPU pool)."""
    networks: dict[str, int] | None = None
    """The cluster's VPCs (its own and the node pools' additional ones) and their MTU."""
    cluster_network: str | None = None
    nats: tuple[Nat, ...] | None = None
    containers: tuple[Container, ...] | None = None
    ray_version: str | None = None
    run_log: str | None = None
    """Every attempt's driver log of the stack's run, as the bucket keeps it."""
    released: bool | None = None
    """The run's record (its bucket copy) says its GPU workers were released."""
    ray_pods: int | None = None
    """Pods of the RayCluster (label ray.io/cluster) that still exist."""
    workers: tuple[tuple[str, str], ...] | None = None
    """Each GPU worker pod of the RayCluster: (name, 'Running' or why it is not: its PodScheduled message)."""
    bucket_steps: tuple[int, ...] | None = None
    """Steps of the run with their completion marker in the bucket."""
    fabric_busbw_gbps: float | None = None
    compute_domain: ComputeDomainState | None = None
    missing: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Result:
    check: str
    status: Status
    seen: str
    expected: str
    answers: str
    """The row of docs/verification.md (or the page's "only on GCP" section) it answers."""

    def line(self) -> str:
        return f"{self.status:<11}  {self.check}: seen {self.seen}; expected {self.expected}"


def _not_checked(check: str, fact: str, facts: Facts, expected: str, answers: str) -> Result:
    return Result(check, "NOT CHECKED", f"nothing ({facts.missing.get(fact, f'{fact} not read')})", expected, answers)


def _platform(facts: Facts) -> Platform | None:
    return PLATFORMS.get(facts.platform)


# --- the checks: pure functions of the facts ----------------------------------------------------


def check_gke_version(facts: Facts) -> list[Result]:
    answers = "GKE creates a cluster at a version prefix; the platform's DRA and DRANET floors"
    platform = _platform(facts)
    needs = gke_versions.floors(platform, bool(facts.dranet)) if platform else []
    if not needs:
        needs = [("the cluster", "1.34")]
    out = []
    for feature, floor in needs:
        name = f"gke-version ({feature})"
        if facts.gke_version is None:
            out.append(_not_checked(name, "gke_version", facts, f">= {floor}", answers))
            continue
        bad = gke_versions.below_floor(facts.gke_version, floor)
        out.append(Result(name, "FAIL" if bad else "PASS", facts.gke_version, f">= {floor}", answers))
    return out


def check_network_policy(facts: Facts) -> Result:
    name, answers = "network-policy-enforced", "The NetworkPolicy under Dataplane V2"
    if facts.datapath is None:
        return _not_checked(name, "datapath", facts, ADVANCED_DATAPATH, answers)
    return Result(name, "PASS" if facts.datapath == ADVANCED_DATAPATH else "FAIL",
                  f"datapathProvider {facts.datapath}", f"{ADVANCED_DATAPATH} (Dataplane V2 enforces NetworkPolicy)",
                  answers)


def check_workload_identity(facts: Facts) -> Result:
    name, answers = "workload-identity", "docs/security.md: grants, GCS FUSE with Workload Identity"
    expected = f"a workload pool and every node pool at {GKE_METADATA}"
    if facts.workload_pool is None or facts.node_pools is None:
        return _not_checked(name, "node_pools" if facts.workload_pool else "workload_pool", facts, expected, answers)
    off = [f"{p.name} {p.metadata_mode or 'unset'}" for p in facts.node_pools if p.metadata_mode != GKE_METADATA]
    if not facts.workload_pool or off:
        seen = f"workload pool {facts.workload_pool or 'none'}" + (f"; {', '.join(off)}" if off else "")
        return Result(name, "FAIL", seen, expected, answers)
    return Result(name, "PASS", f"{facts.workload_pool}; {len(facts.node_pools)} node pools at {GKE_METADATA}",
                  expected, answers)


def check_mtu(facts: Facts) -> Result:
    name, answers = "vpc-mtu", "The cluster on its own VPC (MTU 8896)"
    if facts.networks is None:
        return _not_checked(name, "networks", facts, f"MTU {VPC_MTU} on every VPC", answers)
    seen = ", ".join(f"{net} {mtu}" for net, mtu in sorted(facts.networks.items()))
    ok = bool(facts.networks) and all(mtu == VPC_MTU for mtu in facts.networks.values())
    return Result(name, "PASS" if ok else "FAIL", seen or "no VPC", f"MTU {VPC_MTU} on every VPC", answers)


def check_nat(facts: Facts) -> Result:
    name, answers = "cloud-nat", "the router and Cloud NAT with dynamic port allocation (4096 to 65536 ports per VM)"
    expected = (f"a NAT on {facts.cluster_network or 'the cluster network'} with dynamic port allocation, "
                f"{MIN_PORTS_PER_VM}-{MAX_PORTS_PER_VM} ports per VM")
    if facts.nats is None or facts.cluster_network is None:
        return _not_checked(name, "nats", facts, expected, answers)
    mine = [n for n in facts.nats if n.network == facts.cluster_network]
    if not mine:
        return Result(name, "FAIL", f"no NAT on {facts.cluster_network}", expected, answers)
    good = [n for n in mine if n.dynamic_ports and (n.min_ports, n.max_ports) == (MIN_PORTS_PER_VM, MAX_PORTS_PER_VM)]
    nat = (good or mine)[0]
    seen = (f"{nat.router}/{nat.name}: dynamic port allocation {'on' if nat.dynamic_ports else 'off'}, "
            f"{nat.min_ports}-{nat.max_ports} ports per VM")
    return Result(name, "PASS" if good else "FAIL", seen, expected, answers)


def check_boot_disks(facts: Facts) -> Result:
    name, answers = "boot-disk", "hyperdisk-balanced boot disks of 100 GB on A4, A3 Ultra and A4X GPU nodes"
    platform = _platform(facts)
    expected = platform.boot_disk_type if platform else "the platform's boot disk type"
    if facts.autopilot:
        return Result(name, "NOT CHECKED", "Autopilot (GKE picks the GPU nodes' boot disk)", expected, answers)
    if facts.node_pools is None or platform is None:
        return _not_checked(name, "node_pools", facts, expected, answers)
    gpu = [p for p in facts.node_pools if p.gpu]
    if not gpu:
        return Result(name, "FAIL", "no GPU node pool", f"GPU node pools on {expected}", answers)
    seen = ", ".join(f"{p.name} {p.disk_type}" for p in gpu)
    return Result(name, "PASS" if all(p.disk_type == expected for p in gpu) else "FAIL", seen, expected, answers)


def _digest(reference: str) -> str:
    return reference.rsplit("@", 1)[1] if "@sha256:" in reference else ""


def check_image_digests(facts: Facts) -> Result:
    name, answers = "images-by-digest", "docs/security.md: images by digest; containerd pulls name:tag@sha256"
    expected = "every container's image pinned @sha256 and running that digest"
    if facts.containers is None:
        return _not_checked(name, "containers", facts, expected, answers)
    if not facts.containers:
        return Result(name, "FAIL", "no container running in the stack's namespace", expected, answers)
    wrong = []
    for c in facts.containers:
        pinned = _digest(c.image)
        if not pinned:
            wrong.append(f"{c.pod}/{c.name} {c.image} (no digest)")
        elif c.image_id and _digest(c.image_id) != pinned:
            wrong.append(f"{c.pod}/{c.name} runs {_digest(c.image_id) or c.image_id}, pinned {pinned}")
    if wrong:
        return Result(name, "FAIL", "; ".join(wrong), expected, answers)
    return Result(name, "PASS", f"{len(facts.containers)} containers by digest", expected, answers)


def check_ray_version(facts: Facts) -> Result:
    name, answers = "ray-version", "The Ray version inside the pinned verl images"
    platform = _platform(facts)
    expected = platform.ray_version if platform else "the platform's rayVersion"
    if facts.ray_version is None or platform is None:
        return _not_checked(name, "ray_version", facts, expected, answers)
    return Result(name, "PASS" if facts.ray_version == expected else "FAIL", f"the head reports Ray {facts.ray_version}",
                  expected, answers)


def check_trainer_placement(facts: Facts) -> Result:
    name, answers = "trainer-placement", "Where Ray places verl's trainer"
    platform = _platform(facts)
    on_worker = platform is not None and platform.head_on_gpu_node
    expected = "a GPU worker (the head takes no Ray CPUs)" if on_worker else "the head or a GPU worker"
    if facts.run_log is None:
        return _not_checked(name, "run_log", facts, expected, answers)
    found = _TRAINER.findall(facts.run_log)
    if not found:
        return Result(name, "NOT CHECKED", "no `verl's last save (its trainer ran on POD)` line in the run's logs "
                      "(no attempt has ended after a save yet)", expected, answers)
    step, pod = found[-1]
    bad = on_worker and "-head" in pod
    return Result(name, "FAIL" if bad else "PASS", f"step {step}: trainer on {pod}", expected, answers)


def check_saves_in_bucket(facts: Facts) -> Result:
    name, answers = "saves-in-bucket", "Where Ray places verl's trainer ...: saves reach the bucket"
    expected = "every save verl made (newer than the oldest kept) complete in the bucket"
    if facts.run_log is None or facts.bucket_steps is None:
        return _not_checked(name, "run_log" if facts.run_log is None else "bucket_steps", facts, expected, answers)
    saved = sorted({int(s) for s in _SAVED.findall(facts.run_log)})
    if not saved:
        return Result(name, "NOT CHECKED", "no save in the run's logs yet", expected, answers)
    kept = sorted(set(facts.bucket_steps))
    # The bucket keeps the newest max_actor_ckpt_to_keep: saves older than the oldest kept were rotated away.
    missing = [s for s in saved if s not in kept and (not kept or s > kept[0])]
    seen = f"saved {_steps(saved)}; complete in the bucket {_steps(kept) if kept else 'none'}"
    return Result(name, "FAIL" if missing else "PASS",
                  seen + (f"; missing {_steps(missing)}" if missing else ""), expected, answers)


def _steps(steps: Sequence[int]) -> str:
    return "steps " + ", ".join(map(str, steps))


def check_fabric(facts: Facts) -> Result:
    name, answers = "fabric-busbw", "The NCCL installer ...: the NCCL figure and the per-platform floors only on GPUs"
    platform = _platform(facts)
    expected = f">= {platform.fabric_min_busbw_gbps:g} GB/s" if platform else "the platform's floor"
    if facts.fabric_busbw_gbps is None or platform is None:
        return _not_checked(name, "fabric_busbw_gbps", facts, expected, answers)
    ok = facts.fabric_busbw_gbps >= platform.fabric_min_busbw_gbps
    return Result(name, "PASS" if ok else "FAIL", f"{facts.fabric_busbw_gbps:g} GB/s all-reduce bus bandwidth",
                  expected, answers)


def check_compute_domain(facts: Facts) -> list[Result]:
    """A4X only: the ComputeDomain Ready over every GPU node, and one IMEX channel claim per worker."""
    platform = _platform(facts)
    if platform is None or not platform.head_on_gpu_node:
        return []
    answers = "The NVIDIA DRA driver on GKE, the ComputeDomain, the IMEX channels"
    cd = facts.compute_domain
    domain_expected = f"status Ready over {facts.gpu_nodes} nodes"
    claims_expected = f">= {facts.gpu_nodes} IMEX channel claims allocated by {IMEX_DRIVER}"
    if cd is None:
        return [_not_checked("compute-domain", "compute_domain", facts, domain_expected, answers),
                _not_checked("imex-channels", "compute_domain", facts, claims_expected, answers)]
    ready = cd.status == "Ready" and cd.nodes >= facts.gpu_nodes
    return [
        Result("compute-domain", "PASS" if ready else "FAIL",
               f"{COMPUTE_DOMAIN} status {cd.status or 'unset'} over {cd.nodes} nodes", domain_expected, answers),
        Result("imex-channels", "PASS" if cd.imex_claims >= facts.gpu_nodes else "FAIL",
               f"{cd.imex_claims} IMEX channel claims allocated", claims_expected, answers),
    ]


def check_workers_admitted(facts: Facts) -> Result:
    name, answers = "gpu-workers-admitted", "Autopilot admits the A4 worker pod ...; GKE scaling the GPU pool"
    expected = f"{facts.gpu_nodes} GPU worker pods Running"
    if facts.workers is None:
        return _not_checked(name, "workers", facts, expected, answers)
    if facts.released:
        return Result(name, "NOT CHECKED", "the run is released (its workers are gone by design)", expected, answers)
    running = [w for w, state in facts.workers if state == "Running"]
    waiting = [f"{w}: {state}" for w, state in facts.workers if state != "Running"]
    seen = f"{len(running)} Running" + (f"; {'; '.join(waiting)}" if waiting else "")
    return Result(name, "PASS" if len(running) >= facts.gpu_nodes else "FAIL", seen, expected, answers)


def check_release(facts: Facts) -> Result:
    name, answers = "release", "KubeRay deletes a suspended RayCluster's pods"
    expected = "no pod of the RayCluster once the record says released"
    if facts.released is None or facts.ray_pods is None:
        return _not_checked(name, "released" if facts.released is None else "ray_pods", facts, expected, answers)
    if not facts.released:
        return Result(name, "NOT CHECKED", "the run is not released yet", expected, answers)
    return Result(name, "PASS" if facts.ray_pods == 0 else "FAIL", f"released; {facts.ray_pods} Ray pods left",
                  expected, answers)


CHECKS: tuple[Callable[[Facts], Result | list[Result]], ...] = (
    check_gke_version, check_network_policy, check_workload_identity, check_mtu, check_nat, check_boot_disks,
    check_image_digests, check_ray_version, check_trainer_placement, check_saves_in_bucket, check_fabric,
    check_workers_admitted, check_release, check_compute_domain,
)


def checks(facts: Facts) -> list[Result]:
    out: list[Result] = []
    for check in CHECKS:
        found = check(facts)
        out.extend(found if isinstance(found, list) else [found])
    return out


def report(results: Sequence[Result], outputs: StackOutputs) -> dict[str, Any]:
    """The JSON form (`--json` and the bucket's copy)."""
    return {"stack": outputs.cluster_name, "run": outputs.run_id, "platform": outputs.gpu_platform,
            "failed": sum(r.status == "FAIL" for r in results),
            "results": [asdict(r) for r in results]}


# --- the facts: bounded reads of the live stack -------------------------------------------------


class _Lookup(Exception):
    pass


def gcloud_json(args: list[str]) -> Any:
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        raise _Lookup("gcloud not found on PATH")
    shown = "gcloud " + " ".join(args)
    return json.loads(run_tool([gcloud, *args, "--format", "json"], shown, GCLOUD_TIMEOUT_S, _Lookup) or "null")


def _region(location: str) -> str:
    """`us-central1-b` -> `us-central1`; a region stays itself."""
    return location.rsplit("-", 1)[0] if location.count("-") == 2 else location


def _last(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def cluster_facts(cluster: dict[str, Any], platform: Platform | None) -> dict[str, Any]:
    """The facts `gcloud container clusters describe --format json` answers (GKE's Cluster resource)."""
    pools = []
    extra_networks = set()
    for pool in cluster.get("nodePools") or []:
        config = pool.get("config") or {}
        machine = config.get("machineType", "")
        for extra in (pool.get("networkConfig") or {}).get("additionalNodeNetworkConfigs") or []:
            extra_networks.add(_last(extra.get("network", "")))
        pools.append(NodePool(name=pool.get("name", ""), disk_type=config.get("diskType", ""),
                              metadata_mode=(config.get("workloadMetadataConfig") or {}).get("mode", ""),
                              gpu=bool(config.get("accelerators")) or (platform is not None
                                                                       and machine == platform.machine_type)))
    return {
        "gke_version": cluster.get("currentMasterVersion"),
        "autopilot": bool((cluster.get("autopilot") or {}).get("enabled")),
        "datapath": (cluster.get("networkConfig") or {}).get("datapathProvider", "LEGACY_DATAPATH"),
        "workload_pool": (cluster.get("workloadIdentityConfig") or {}).get("workloadPool", ""),
        "node_pools": tuple(pools),
        "dranet": platform is not None and platform.head_on_gpu_node and not extra_networks,
        "cluster_network": _last(cluster.get("network", "")),
        "_networks": sorted({_last(cluster.get("network", "")), *extra_networks} - {""}),
    }


def nats_of(routers: Sequence[dict[str, Any]]) -> tuple[Nat, ...]:
    """The NATs `gcloud compute routers list --format json` answers (Compute Engine's Router resource)."""
    return tuple(Nat(router=r.get("name", ""), name=n.get("name", ""), network=_last(r.get("network", "")),
                     dynamic_ports=bool(n.get("enableDynamicPortAllocation")),
                     min_ports=int(n.get("minPortsPerVm", 0)), max_ports=int(n.get("maxPortsPerVm", 0)))
                 for r in routers for n in r.get("nats") or [])


def containers_of(pods: dict[str, Any]) -> tuple[Container, ...]:
    """Every container of the running pods in a PodList, with the image its node runs; not the GCS FUSE
    sidecar GKE injects (its image is GKE's to pin, not the stack's)."""
    out = []
    for pod in pods.get("items") or []:
        if (pod.get("status") or {}).get("phase") != "Running":
            continue
        ran = {s.get("name"): s.get("imageID", "") for s in (pod.get("status") or {}).get("containerStatuses") or []}
        for c in (pod.get("spec") or {}).get("containers") or []:
            if c.get("name") == GCSFUSE_SIDECAR:
                continue
            out.append(Container(pod["metadata"]["name"], c.get("name", ""), c.get("image", ""), ran.get(c.get("name"), "")))
    return tuple(out)


def ray_pods_of(pods: dict[str, Any]) -> dict[str, Any]:
    """The RayCluster's pods (a PodList by its ray.io/cluster label): how many, and each worker's state
    (KubeRay labels ray.io/node-type=worker; a pod not Running says why in its PodScheduled condition)."""
    items = pods.get("items") or []
    workers = []
    for pod in items:
        if ((pod.get("metadata") or {}).get("labels") or {}).get("ray.io/node-type") != "worker":
            continue
        status = pod.get("status") or {}
        why = next((c.get("message") or c.get("reason", "") for c in status.get("conditions") or []
                    if c.get("type") == "PodScheduled" and c.get("status") != "True"), "")
        state = "Running" if status.get("phase") == "Running" else why or status.get("phase", "Unknown")
        workers.append((pod["metadata"]["name"], state))
    return {"ray_pods": len(items), "workers": tuple(workers)}


def compute_domain_of(domain: dict[str, Any] | None, claims: dict[str, Any]) -> ComputeDomainState:
    status = (domain or {}).get("status") or {}
    imex = sum(1 for claim in claims.get("items") or []
               if any(r.get("driver") == IMEX_DRIVER
                      for r in (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {})
                      .get("results") or []))
    return ComputeDomainState(status=str(status.get("status", "")), nodes=len(status.get("nodes") or []),
                              imex_claims=imex)


def bucket_steps_of(listing: str) -> tuple[int, ...]:
    """Steps whose completion marker `gcloud storage ls` listed."""
    return tuple(sorted({int(m) for m in _STEP_DIR.findall(listing)}))


def gather(outputs: StackOutputs, api: Any | None, bucket_read: Callable[[str], str | None],
           bucket_list: Callable[[str], str]) -> Facts:
    """Every fact, each read on its own: one that fails is left None with its reason."""
    platform = PLATFORMS.get(outputs.gpu_platform)
    got: dict[str, Any] = {"platform": outputs.gpu_platform, "gpu_nodes": outputs.gpu_nodes,
                           "fabric_busbw_gbps": outputs.fabric_busbw_gbps}
    missing: dict[str, str] = {}
    if outputs.fabric_busbw_gbps is None:
        missing["fabric_busbw_gbps"] = "no fabricBusBandwidthGbps output (fabricCheck off, or the job not created)"

    def attempt(keys: Sequence[str], read: Callable[[], dict[str, Any]]) -> None:
        try:
            got.update(read())
        except Exception as error:  # noqa: BLE001 - a fact not read is NOT CHECKED with why
            for key in keys:
                missing[key] = one_line(error)

    progress(f"reading cluster {outputs.cluster_name} from GKE")
    cluster_keys = ("gke_version", "autopilot", "datapath", "workload_pool", "node_pools", "dranet",
                    "cluster_network")
    attempt(cluster_keys, lambda: cluster_facts(
        gcloud_json(["container", "clusters", "describe", outputs.cluster_name, "--location", outputs.cluster_location]),
        platform))
    networks = got.pop("_networks", None)
    if networks is not None:
        attempt(["networks"], lambda: {"networks": {
            n: int(gcloud_json(["compute", "networks", "describe", n]).get("mtu", 1460)) for n in networks}})
        attempt(["nats"], lambda: {"nats": nats_of(gcloud_json(
            ["compute", "routers", "list", "--regions", _region(outputs.cluster_location)]) or [])})
    else:
        missing["networks"] = missing["nats"] = "the cluster was not read"
    if api is None:
        for key in ("containers", "ray_version", "compute_domain", "ray_pods", "workers"):
            missing[key] = "no Kubernetes API"
    else:
        ns = outputs.namespace
        attempt(["containers"], lambda: {"containers": containers_of(
            api.request("GET", f"/api/v1/namespaces/{ns}/pods") or {})})
        attempt(["ray_pods", "workers"], lambda: ray_pods_of(api.request(
            "GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=ray.io%2Fcluster%3D{outputs.ray_cluster}") or {}))
        attempt(["ray_version"], lambda: {"ray_version": str((api.request(
            "GET", f"/api/v1/namespaces/{ns}/services/{outputs.ray_head_service}:dashboard/proxy/api/version")
            or {})["ray_version"])})
        if platform is not None and platform.head_on_gpu_node:
            attempt(["compute_domain"], lambda: {"compute_domain": compute_domain_of(
                api.request("GET", f"/apis/resource.nvidia.com/v1beta1/namespaces/{ns}/computedomains/{COMPUTE_DOMAIN}"),
                api.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims") or {})})
    attempt(["run_log", "released"], lambda: _run_log(outputs.run_id, bucket_read))
    attempt(["bucket_steps"], lambda: {"bucket_steps": bucket_steps_of(
        bucket_list(f"{outputs.checkpoint_uri.rstrip('/')}/global_step_*/{MARKER}"))})
    return Facts(**got, missing=missing)


def _run_log(run_id: str, read: Callable[[str], str | None]) -> dict[str, Any]:
    text = read("record.json")
    if text is None:
        raise _Lookup(f"no copy of run {run_id} in the bucket's {run_folder(run_id)}/ yet")
    record = RunRecord.from_json(text)
    return {"run_log": "".join(read(attempt_file(a.index)) or "" for a in record.attempts),
            "released": record.released}


# --- the command -------------------------------------------------------------------------------


def add_parser(subparsers: Any, parents: list[argparse.ArgumentParser]) -> None:
    """`parents`: the CLI's shared flags verify reads (verl_gke/cli.py COMMAND_FLAGS)."""
    parser = subparsers.add_parser(
        "verify", parents=parents, help="check the live stack against the verification matrix: PASS / FAIL / NOT CHECKED",
        description="Read the live stack (GKE, its VPCs and NAT, the cluster's pods, the Ray head, the run's "
                    "logs and checkpoints in the bucket) and print each check of docs/verification.md it can "
                    "answer: PASS, FAIL or NOT CHECKED, with the value seen and the one expected. Read-only, "
                    "but for the JSON copy written to gs://<bucket>/logs/<run>/verify.json. Exit 1 on any FAIL.")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--no-upload", action="store_true", help="do not write verify.json to the bucket")
    parser.set_defaults(handler=run)


def nothing_deployed(outputs: StackOutputs, command: str) -> str | None:
    """Why there is nothing to verify (or report), naming the missing output; None when something is deployed."""
    if outputs.offline:
        return f"nothing to {command}: {outputs.source} holds synth's offline outputs (clusterCaCertificate is a " \
               "stand-in)"
    for key, value in (("bucketName", outputs.bucket_name), ("clusterEndpoint", outputs.cluster_endpoint),
                       ("runId", outputs.run_id)):
        if not value:
            return f"nothing to {command}: the stack outputs in {outputs.source} have no {key} (is the stack deployed?)"
    return None


def storage_ls(args: list[str]) -> str:
    """`gcloud storage ls ARGS`' listing; '' when nothing matched (gcloud exits 1 then)."""
    shown = "gcloud storage ls " + " ".join(args)
    try:
        return run_tool(["gcloud", "storage", "ls", *args], shown, GCLOUD_TIMEOUT_S, _Lookup)
    except _Lookup as error:
        if "matched no objects" in str(error):
            return ""
        raise
    except FileNotFoundError:
        raise _Lookup("gcloud not found on PATH") from None


def _bucket(outputs: StackOutputs) -> tuple[Callable[[str], str | None], Callable[[str], str]]:
    from verl_gke.runs import BucketCopy

    return BucketCopy(outputs.run_id, outputs.bucket_name).read, lambda pattern: storage_ls([pattern])


def _api(args: argparse.Namespace, outputs: StackOutputs) -> Any | None:
    from access.cluster_api import cluster_api
    from workloads.kube import KubernetesApi

    if args.kube_api_url:
        return KubernetesApi(args.kube_api_url, timeout_s=KUBE_TIMEOUT_S)
    try:
        found = gke_facts.describe(outputs.cluster_name, outputs.cluster_location)
    except gke_facts.GkeLookupError as error:
        progress(f"no Kubernetes API ({error}): its checks are NOT CHECKED")
        return None
    return cluster_api(found.endpoint, found.ca_certificate, KUBE_TIMEOUT_S)


def upload(document: dict[str, Any], outputs: StackOutputs) -> str:
    target = f"gs://{outputs.bucket_name}/{run_folder(outputs.run_id)}/{VERIFY_FILE}"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / VERIFY_FILE
        path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        run_tool(["gcloud", "storage", "cp", str(path), target], f"gcloud storage cp {VERIFY_FILE} {target}",
                 GCLOUD_TIMEOUT_S, CliError)
    return target


def run(args: argparse.Namespace) -> int:
    try:
        outputs = stack_outputs.load(args.outputs, args.stack)
    except OutputsError as error:
        raise CliError(f"nothing to verify: {error}") from None
    why = nothing_deployed(outputs, "verify")
    if why:
        raise CliError(why)
    facts = gather(outputs, _api(args, outputs), *_bucket(outputs))
    results = checks(facts)
    document = report(results, outputs)
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        for result in results:
            print(result.line())
    if not args.no_upload:
        try:
            progress(f"wrote {upload(document, outputs)}")
        except CliError as error:
            progress(f"the JSON copy was not written: {error}")
    return 1 if document["failed"] else 0
