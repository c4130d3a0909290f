"""The deploy's time to the first training step, modeled from the program's own dependency graph.

Input: the resources synth records (resources.json: type, name, dependencies, provider, inputs).
Each resource starts when the last thing it waits for (its dependencies and its provider) is done
and takes its type's duration from the platform table (domain.platforms.DEPLOY_DURATIONS, each with
its source); the longest chain is the critical path. GKE's floor is what no ordering can avoid:
the cluster, the GPU nodes, their RDMA set-up (GKE's NCCL installer DaemonSet, where the stack
applies it) and the job's start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from domain.platforms import (
    AUTOPILOT_GPU_NODES,
    DEPLOY_DURATIONS,
    GPU_POOL_CREATE,
    GPU_POOL_NAME,
    KUBE_WRITE,
    RAY_PODS_FROM_DOCKER_HUB,
    RAY_PODS_STREAMED,
    Duration,
    gpu_pool_name,
)
from domain.pricing import CAPACITY_KINDS
from domain.run_time import RunTime

CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"
RAY_CLUSTER = "kubernetes:ray.io/v1:RayCluster"
GRPO_JOB = "pulumi-python:dynamic:GrpoJob"
CONFIG_FILE = "kubernetes:yaml/v2:ConfigFile"
DAEMONSET = "kubernetes:apps/v1:DaemonSet"
"""The NCCL installer where verl-gke builds it (Standard); Google's manifest (a CONFIG_FILE) on Autopilot."""
AR_REPOSITORY = "gcp:artifactregistry/repository:Repository"
STAGING_JOB = "kubernetes:batch/v1:Job"
UNKNOWN = "[unknown]"
"""How synth records a value the engine does not know yet (verl_gke.synth)."""
FLOOR_SLACK = 0.10
"""How far above GKE's floor the modeled critical path may be (the program's target)."""
CRITICAL_PATH = "  critical path"
"""Starts the line listing the critical path (a detail: synth shows it with --verbose)."""
_NO_TIME = Duration(0, "a component or a provider: no cloud call of its own")
_AR_HOST_SUFFIX = "-docker.pkg.dev"


@dataclass(frozen=True)
class Step:
    name: str
    type: str
    start_s: float
    duration: Duration

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration.seconds


@dataclass(frozen=True)
class DeployModel:
    path: tuple[Step, ...]
    """The critical path, first resource first."""
    floor_s: float
    """Cluster + GPU nodes + their RDMA set-up + job start (the RayCluster's pods and the GrpoJob)."""
    unknown_types: tuple[str, ...]
    """Custom resource types with no duration in the table (counted as 0)."""

    @property
    def total_s(self) -> float:
        return self.path[-1].end_s if self.path else 0.0

    def lines(self, run: RunTime | None = None, usd_per_hour: float | None = None) -> list[str]:
        """The deploy's time, and with the run's model the time to its first step and to released GPUs."""
        job = (f"the job RUNNING at {self.total_s / 60:.1f} min; GKE's floor (cluster + GPU nodes + RDMA set-up + "
               f"job start) {self.floor_s / 60:.1f} min ({self.total_s / self.floor_s - 1:+.0%})")
        if run is None:
            out = [f"Time to first training step (modeled): not made (the model is not in the model table); {job}"]
        else:
            first = self.total_s + run.verl_startup_s
            out = [f"Time to first training step (modeled): {first / 60:.1f} min; {job}; then {run.startup_line()}"]
            out += _to_release(first, run, usd_per_hour)
        steps = [s for s in self.path if s.duration.seconds]
        out.append(f"{CRITICAL_PATH}: " + " -> ".join(f"{s.name} {s.duration.seconds / 60:.1f}" for s in steps)
                   + " (min)")
        if self.unknown_types:
            out.append("  no duration known for: " + ", ".join(self.unknown_types))
        return out


def _to_release(first_step_s: float, run: RunTime, usd_per_hour: float | None) -> list[str]:
    """From `pulumi up` to released GPUs: the first step, the run, the export and the release, and its cost."""
    if run.run_s is None:
        return []
    total = first_step_s + run.run_s + run.export_s + RELEASE.seconds
    cost = (f"~${total / 3600 * usd_per_hour:.2f} at ${usd_per_hour:.2f}/h (every node for the whole time: an "
            "upper bound)" if usd_per_hour is not None else "cost unknown (no price)")
    return [f"From `pulumi up` to released GPUs (modeled): {total / 60:.0f} min, {cost}: first step "
            f"{first_step_s / 60:.1f} + run {run.run_s / 60:.1f} + export {run.export_s / 60:.1f} + release "
            f"{RELEASE.seconds / 60:.1f} min"]


RELEASE = Duration(660, "the supervisor suspends the RayCluster once the export is done; GKE's cluster "
                   "autoscaler removes a GPU node unneeded for 10 minutes (GKE's cluster autoscaler docs, scale-down) "
                   "and deleting it takes about a minute; an estimate, not measured")
"""From the run's end to the GPU nodes gone (no longer billed)."""


def duration(resource: Mapping[str, Any], has_gpu_pool: bool, streaming: bool = True,
             staging: Duration | None = None) -> Duration | None:
    """The resource's create time; None for a custom type the table lacks. `streaming`: GKE image
    streaming is on for the GPU nodes (Autopilot: always); `staging`: the staging Job's, for the stack's model."""
    kind = resource["type"]
    if kind == STAGING_JOB and staging is not None:
        return staging
    if kind == CONFIG_FILE:
        return DEPLOY_DURATIONS[kind]
    if not resource.get("custom") or kind.startswith("pulumi:providers:"):
        return _NO_TIME
    if is_gpu_pool(resource):
        return GPU_POOL_CREATE
    if kind == RAY_CLUSTER:
        pods = RAY_PODS_STREAMED if streaming and _streamed(resource) else RAY_PODS_FROM_DOCKER_HUB
        if has_gpu_pool:
            return pods
        return Duration(AUTOPILOT_GPU_NODES.seconds + pods.seconds, f"{AUTOPILOT_GPU_NODES.source}; {pods.source}")
    if kind in DEPLOY_DURATIONS:
        return DEPLOY_DURATIONS[kind]
    return KUBE_WRITE if kind.startswith("kubernetes:") else None


def _streamed(ray_cluster: Mapping[str, Any]) -> bool:
    """Whether the GPU workers' image is served from Artifact Registry (GKE streams only those). A
    first preview does not know an image pinned at `pulumi up` (components.pinned_image): it is
    served from there when the RayCluster waits for an Artifact Registry repository (the mirror)."""
    groups = ray_cluster["inputs"].get("spec", {}).get("workerGroupSpecs", [])
    images = [c.get("image", "") for g in groups for c in g["template"]["spec"]["containers"]]
    if UNKNOWN in images:
        return any(_urn_type(urn) == AR_REPOSITORY for urn in ray_cluster.get("dependencies", []))
    return bool(images) and all(i.split("/", 1)[0].endswith(_AR_HOST_SUFFIX) for i in images)


def _urn_type(urn: str) -> str:
    """A resource's type from its URN, `urn:pulumi:<stack>::<project>::<parent types$>type::<name>`
    (Pulumi docs, "Resource URNs")."""
    parts = urn.split("::")
    return parts[2].rsplit("$", 1)[-1] if len(parts) == 4 else ""


def model(resources: Sequence[Mapping[str, Any]], staging: Duration | None = None) -> DeployModel:
    """The critical path of `resources` (in registration order: dependencies come first); `staging`: the
    staging Job's time for the stack's model (platforms.staging_duration), else the 32B model's."""
    by_urn = {r["urn"]: r for r in resources}
    pools = [r for r in resources if is_gpu_pool(r)]
    has_gpu_pool = bool(pools)
    streaming = all(((p["inputs"].get("nodeConfig") or {}).get("gcfsConfig") or {}).get("enabled") for p in pools)
    ends: dict[str, float] = {}
    steps: dict[str, Step] = {}
    before: dict[str, str | None] = {}
    unknown: set[str] = set()
    # Waiting for a component waits for all its children (Pulumi), but the recorded dependencies name
    # only custom ones: a yaml ConfigFile (a component whose objects the mock engine never sees) is
    # added wherever a sibling of it is waited for.
    remote = {}
    for r in resources:
        if r["type"] == CONFIG_FILE and r.get("parent"):
            remote.setdefault(r["parent"], []).append(r["urn"])
    for r in resources:
        waits = [d for d in r.get("dependencies", []) if d in by_urn]
        waits += [u for d in list(waits) for u in remote.get(by_urn[d].get("parent"), []) if u != r["urn"]]
        if r.get("provider") in by_urn:
            waits.append(r["provider"])
        first = max(waits, key=lambda u: ends[u], default=None)
        took = duration(r, has_gpu_pool, streaming, staging)
        if took is None:
            unknown.add(r["type"])
            took = Duration(0, "unknown")
        step = Step(r["name"], r["type"], ends[first] if first else 0.0, took)
        steps[r["urn"]], ends[r["urn"]], before[r["urn"]] = step, step.end_s, first
    path: list[Step] = []
    urn = max(ends, key=lambda u: ends[u], default=None)
    while urn is not None:
        path.append(steps[urn])
        urn = before[urn]
    # The GPU pools of several capacity kinds are created side by side: one counts.
    floor = sum(_floor_part(r, has_gpu_pool, streaming) for r in resources) + (GPU_POOL_CREATE.seconds if pools else 0)
    return DeployModel(tuple(reversed(path)), floor, tuple(sorted(unknown)))


GPU_POOLS = {GPU_POOL_NAME, *(f"{gpu_pool_name(kind)}-pool" for kind in CAPACITY_KINDS)}
"""The GPU node pools' resource names: `gpu-pool`, or `gpu-<kind>-pool` for each kind a ComputeClass orders."""


def is_gpu_pool(resource: Mapping[str, Any]) -> bool:
    return resource["type"] == NODE_POOL and resource["name"] in GPU_POOLS


def _floor_part(resource: Mapping[str, Any], has_gpu_pool: bool, streaming: bool) -> float:
    if resource["type"] in (CLUSTER, RAY_CLUSTER, GRPO_JOB, CONFIG_FILE, DAEMONSET):
        took = duration(resource, has_gpu_pool, streaming)
        return took.seconds if took else 0.0
    return 0.0
