"""Stack configuration: one typed, immutable object, validated before any resource exists.

`load_config(raw, ...)` is pure and turns raw Pulumi config values (strings, as the engine hands them
over) into a `StackConfig` or raises `ConfigError` listing every problem, each naming the key, the bad
value and what is allowed. Per-field rules are the field types of domain/config_fields.py; rules that
read several fields are model validators here. `from_pulumi()` reads the running stack's config.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import posixpath
import re
import shlex
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from domain import algorithms, grpo_spec, reward_fn, start_from, run_memory, upgrade_exclusion, user_data, verl_settings, wandb_key
from domain import gke_versions, pricing
from domain.bucket import DEFAULT_CAPACITY, MOUNT_PATH, ray_writable_prefixes
from domain.config_fields import (
    GCE_NAME, MAX_GCE_NAME, PROJECT_ID, QUANTITY, SHA256, Attempts, BucketName, Cidr, ClusterName, Commit,
    CpuMachineType, DashboardUrl, ExclusionStart, Hours, Image, KubernetesVersion, Minutes, MlflowUri,
    Namespace, NcclInstallerUrl, NodePrices, PrivateCidr, ProjectId, Quantity, RayClusterName, RayVersion, Seconds,
    ServiceAccount, VpcName, is_image_reference, network_prefix, refuse, rule,
)
from domain.grpo_spec import verl_problems
from domain.platforms import (
    AUTOPILOT_SIDECAR, CHECKPOINT_COPIER, PINNED_IMAGE_ARCH, PLATFORMS, Mode, Platform, PlatformName, VerlRelease,
    has_digest, has_token_auth, is_pinned_image,
)
from domain.pricing import CAPACITY_KINDS, CapacityKind
from domain.problems import ConfigError, problem_line
from domain.pulumi_config import Declared, TypeProblem, from_engine
from domain.run_identity import DELETES_BEFORE_SAVE_BELOW, legacy_trainer_for_deadline, verl_version_tuple
from domain.stack_files import declared_types
from domain.verl_settings import VerlSettings
from domain.verl_wheel import VerlUnavailable
from domain.staged import (
    RECIPES,
    DEFAULT_DATASET_REPO,
    Recipe,
    DEFAULT_DATASET_REVISION,
    DEFAULT_MODEL_REPO,
    DEFAULT_MODEL_REVISION,
    dataset_problem,
    is_repo_id,
    model_dir_for,
    recipe_for,
)

NAMESPACE = "verl-gke"
PLACEHOLDER_MARK = "replace-me"
HF_TOKEN_KEY = f"{NAMESPACE}:hfToken"
INTERNAL_SOURCE_RANGE_KEY = f"{NAMESPACE}:internalSourceRange"
"""Retired: the gVNIC firewall admits gvnicSubnetCidr only (the VPC holds nothing else)."""
VERL_KEY = f"{NAMESPACE}:verl"
"""verl's own settings by verl's config paths (domain/verl_settings.py)."""
GCP_FIELDS = ("project", "region", "zone")
"""The StackConfig fields read from the `gcp:` namespace."""
GCP_KEYS = tuple(f"gcp:{field}" for field in GCP_FIELDS)
USER_VERL_DIR = "verl"
"""verlSourceInstall: the user's own verl tree, at gs://<bucket>/verl."""
MAX_VALUE_BYTES = 131_072
"""Linux's MAX_ARG_STRLEN (32 pages, include/uapi/linux/binfmts.h): the longest single argument a process
takes. The run's command line (the job's entrypoint, verl's overrides in it) is one argument of `sh -c`,
so no config value can be longer."""
SCHEMA_MINOR = "1.34"
"""The Kubernetes schemas manifests are checked against offline when no minor is configured."""

_REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
_ZONE = re.compile(r"^([a-z]+-[a-z]+[0-9]+)-[a-z]$")
_CHART_KEY = re.compile(r"^[a-z0-9][a-z0-9-]*:[0-9A-Za-z.+-]+$")
"""A chart of chartDigests: name:version."""
# A node pool's specific reservation affinity value (Compute Engine ReservationAffinity.values: a name in the
# project, or projects/<owner>/reservations/<name> for a shared one), or a block of it (GKE's A4/A3 Ultra guides).
_RESERVATION = re.compile(r"^(?:projects/(?P<project>[^/]+)/reservations/)?(?P<name>[^/]+)"
                          r"(?:/reservationBlocks/(?P<block>[^/]+))?$")
_CLUSTER_RANGE_FIELDS = ("node_subnet_cidr", "pod_cidr", "service_cidr")
DASHBOARD_CIDR_MIN_PREFIX = 16
"""The widest range rayDashboardCidrs admits to the Ray Job API (a /16): a VPN's or a bastion's range."""
# The verl paths grpo_spec.verl_problems sizes against the GPU count.
_SIZING_PATHS = frozenset({"data.train_batch_size", "actor_rollout_ref.rollout.n",
                           "actor_rollout_ref.actor.ppo_mini_batch_size"})
# What verl-gke offers per platform: A4X's pool holds a whole NVLink rack under one COMPACT placement
# (fixed size, Cluster Toolkit's gke-a4x), which flex-start's autoscaled, queued nodes do not give.
PLATFORM_CAPACITY: dict[str, tuple[CapacityKind, ...]] = {
    "a4": CAPACITY_KINDS, "a3u": CAPACITY_KINDS, "a4x": ("reservation", "spot"), "g2": CAPACITY_KINDS,
}


def camel(snake: str) -> str:
    """`a4x_networking` -> `a4xNetworking` (pydantic's to_camel would give `a4XNetworking`)."""
    first, *rest = snake.split("_")
    return first + "".join(part[:1].upper() + part[1:] for part in rest)


def config_key(field: str) -> str:
    """The full config key of a StackConfig field name or a `verl.<verl path>`."""
    if field in GCP_FIELDS:
        return f"gcp:{field}"
    if field.startswith("verl."):
        return f"{NAMESPACE}:{field}"
    return f"{NAMESPACE}:{camel(field)}"


def _line(field: str, value: Any, message: str) -> str:
    return problem_line(config_key(field), value, message)


# Here, not in domain/config_fields.py: their rules are the staging program's (workloads/stage_data.py).
RepoId = Annotated[str, rule(lambda v: None if is_repo_id(v) else "a Hugging Face repo id such as "
                             "Qwen/Qwen2.5-32B-Instruct: owner/name of letters, digits, '.', '_' or '-', without '--' "
                             "or '..'.")]
Dataset = Annotated[RepoId, rule(dataset_problem)]
"""A repo staging turns into verl's rows."""


def _cross_field(check: Callable[[StackConfig], Iterator[str]]) -> Any:
    """A model validator for a rule over several fields. Its problems join the other rules' in the context's
    `problems` (load_config's), so that one run names them all; without that list, the first ones raise."""
    def validate(self: StackConfig, info: ValidationInfo) -> StackConfig:
        if lines := list(check(self)):
            collected = (info.context or {}).get("problems")
            if collected is None:
                raise ValueError("; ".join(lines))
            collected.extend(lines)
        return self
    validate.__name__, validate.__doc__ = check.__name__, check.__doc__
    return model_validator(mode="after")(validate)


class StackConfig(BaseModel):
    """The whole stack config, defaults resolved per platform. Keys are `verl-gke:<camelName>`
    except project/region/zone, which come from the `gcp:` namespace."""

    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=camel,
                              populate_by_name=True, arbitrary_types_allowed=True)

    # Empty: reported as not set by load_config; the rest is still checked.
    project: ProjectId = ""
    region: str = ""
    zone: str = ""

    platform: PlatformName = "a4"
    cluster_mode: Mode = "standard"
    cluster_name: ClusterName = "verl-gke"
    existing_cluster: bool = False
    cluster_location: str = ""
    release_channel: Literal["RAPID", "REGULAR", "STABLE"] = "REGULAR"
    kubernetes_version: KubernetesVersion = ""
    deletion_protection: bool = False
    enable_apis: bool = True
    master_authorized_cidrs: tuple[PrivateCidr, ...] = ()
    control_plane_endpoint: Literal["dns", "ip"] = "dns"
    gpu_metrics: bool = True
    dedicated_node_service_account: bool = True
    private_nodes: bool = True
    cloud_nat: bool = True
    image_streaming: bool = True
    image_mirror: bool = True
    binary_authorization: bool = False
    upgrade_exclusion_start: ExclusionStart = upgrade_exclusion.AT_FIRST_UP
    ray_operator: Literal["addon", "helm"] = "addon"
    cpu_machine_type: CpuMachineType = "c2-standard-16"
    cpu_min_nodes: int = Field(1, ge=0)
    cpu_max_nodes: int = Field(5, ge=1)

    gvnic_network_prefix: Annotated[str, network_prefix("-internal")] = ""
    rdma_network_prefix: Annotated[str, network_prefix("-sub-7")] = ""
    gvnic_subnet_cidr: PrivateCidr = "192.168.0.0/24"
    """Also its firewall's source: a range that admits traffic."""
    rdma_subnet_cidrs: tuple[Cidr, ...] = ()
    a4x_networking: Literal["dranet", "multi-network"] = "dranet"
    cluster_network: VpcName = ""
    node_subnet_cidr: Cidr = "10.0.0.0/20"
    pod_cidr: Cidr = "10.4.0.0/14"
    service_cidr: Cidr = "10.0.32.0/20"

    gpu_nodes: int = Field(2, ge=1)
    gpu_max_nodes: int = Field(10, ge=1)
    gpu_spot: bool = False
    reservation: str = ""
    capacity: tuple[CapacityKind, ...] = ()
    """Where GPU nodes come from, in order of preference; empty: from gpuSpot and reservation."""
    gpu_node_hourly_usd: NodePrices = Field(default_factory=dict)
    worker_cpus: int = Field(0, ge=0)
    worker_memory_gi: int = Field(0, ge=0)

    namespace: Namespace = "verl-gke"
    service_account: ServiceAccount = ""
    """Empty: `verl-ray-<stack slug>` (domain/names.py), so the bucket grant names no other stack's."""
    bucket_name: BucketName = ""
    bucket_force_destroy: bool = False
    volume_capacity: Quantity = DEFAULT_CAPACITY

    model: RepoId = DEFAULT_MODEL_REPO
    model_revision: Commit = DEFAULT_MODEL_REVISION
    dataset: Dataset = DEFAULT_DATASET_REPO
    dataset_revision: Commit = DEFAULT_DATASET_REVISION
    staging_timeout_minutes: Minutes = Field(180, ge=1)

    ray_cluster_name: RayClusterName = ""
    verl_image: Image = ""
    image_digests: dict[str, str] = Field(default_factory=dict)
    chart_digests: dict[str, str] = Field(default_factory=dict)
    ray_version: RayVersion = ""
    verl_source_install: bool = False
    verl_in_image: bool = False
    ray_network_policy: bool = True
    ray_dashboard_cidrs: tuple[PrivateCidr, ...] = ()
    nccl_installer_url: NcclInstallerUrl = ""

    job_ready_timeout_seconds: Seconds = Field(1800, ge=1)
    job_wait_for_completion: bool = False
    job_startup_grace_seconds: Seconds = Field(60, ge=0)
    job_outage_window_seconds: Seconds = Field(600, ge=1)
    job_attempt: int = Field(0, ge=0)
    job_dashboard_url: DashboardUrl = ""
    fabric_check: bool = True
    run_supervisor: bool = True
    run_max_retries: Attempts = 2
    run_retry_backoff_seconds: Seconds = Field(120, ge=0)
    run_max_preemptions: Attempts = 10
    run_head_outage_seconds: Seconds = Field(1800, ge=60)
    run_stall_seconds: Seconds = Field(10800, ge=0)
    run_replace_window_seconds: Seconds = Field(600, ge=0)
    run_budget_hours: Hours = Field(0, ge=0)
    run_budget_usd: int = Field(0, ge=0)
    release_workers_when_done: bool = True
    export_model: bool = True
    mlflow_tracking_uri: MlflowUri = ""
    wandb_api_key_secret: str = ""
    data_dir: str = ""
    reward_function: str = ""
    fabric_min_bus_bandwidth_gbps: int = Field(0, ge=0)
    start_from: dict[str, Any] = Field(default_factory=dict)
    """A warm start (domain/start_from.py); its verl settings are in `verl`."""

    verl: VerlSettings
    """The run's verl config: the platform's defaults under verl-gke:verl, composed with the pinned verl's."""

    @model_validator(mode="before")
    @classmethod
    def _resolve_defaults(cls, data: Any) -> Any:
        """Fill the values whose defaults depend on the platform or the project."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        # An unknown platform is reported by its own field; derive the rest as for a4 meanwhile.
        platform = PLATFORMS.get(str(data.get("platform", "a4")), PLATFORMS["a4"])
        if not data.get("clusterLocation") and data.get("region"):
            data["clusterLocation"] = data["region"]
        nics = _rdma_nics(platform, str(data.get("a4xNetworking", "dranet")))
        if _unset(data.get("rdmaSubnetCidrs")):
            data["rdmaSubnetCidrs"] = [f"192.168.{i + 1}.0/24" for i in range(nics)]
        # Autopilot: sized to its per-accelerator maximum with the sidecar; Standard: to the machine.
        worker = platform.autopilot_worker if data.get("clusterMode") == "autopilot" else None
        for key, default in (("rayClusterName", platform.ray_cluster_name), ("verlImage", platform.image),
                             ("workerCpus", worker.cpu if worker else platform.worker_cpus),
                             ("workerMemoryGi", worker.memory_gi if worker else platform.worker_memory_gi)):
            if _unset(data.get(key)):
                data[key] = default
        recipe = recipe_for(str(data.get("dataset") or DEFAULT_DATASET_REPO))
        if _unset(data.get("datasetRevision")):  # the recipe's pin; a copy's unset is GSM8K's, refused below
            data.pop("datasetRevision", None)
            if recipe and recipe.repo == data.get("dataset"):
                data["datasetRevision"] = recipe.revision
        if not isinstance(data.get("verl"), VerlSettings):
            given, _ = verl_given(data.get("verl", {}), platform)
            staged = ({} if recipe is None or recipe.repo == DEFAULT_DATASET_REPO else  # GSM8K's are verl's defaults
                      {path: f"{MOUNT_PATH}/{recipe.dir}/{name}" for path, name in user_data.FILES.items()})
            given = {**staged, **user_data.verl_paths(str(data.get("dataDir") or "")),  # the user's own paths win
                     **reward_fn.verl_paths(str(data.get("rewardFunction") or "")), **given}
            start = data.get("startFrom")
            if isinstance(start, dict):
                checkpoints = given.get(grpo_spec.CHECKPOINT_DIR, grpo_spec.DEFAULT_CHECKPOINT_DIR)
                given = {**start_from.overrides(start, str(checkpoints)), **given}
            data["verl"] = grpo_spec.run_settings(platform, str(data.get("model", DEFAULT_MODEL_REPO)),
                                                  _nodes(data.get("gpuNodes")), given)
        return data

    @field_validator("*", mode="before")
    @classmethod
    def _from_pulumi_text(cls, value: Any, info: ValidationInfo) -> Any:
        """The engine hands every value over as text: read it as the Pulumi CLI reads the key's type as
        Pulumi.yaml declares it (domain/pulumi_config.py), refusing what `pulumi up` would refuse."""
        key = config_key(info.field_name or "")
        declared = ((info.context or {}).get("declared") or declared_types()).get(key)
        if not isinstance(value, str) or declared is None:
            return value
        try:
            return from_engine(value, declared)
        except TypeProblem as problem:
            raise refuse(str(problem)) from None


    @property
    def facts(self) -> Platform:
        return PLATFORMS[self.platform]

    @property
    def recipe(self) -> Recipe:
        """How staging preprocesses verl-gke:dataset (domain/staged.py)."""
        return recipe_for(self.dataset) or RECIPES[0]

    @property
    def image_ray_version(self) -> str:
        """The Ray version inside verlImage: rayVersion, else the platform table's for its image."""
        return self.ray_version or next((p.ray_version for p in PLATFORMS.values() if p.image == self.verl_image),
                                        self.facts.ray_version)

    @property
    def autopilot(self) -> bool:
        return self.cluster_mode == "autopilot"

    @property
    def capacity_kinds(self) -> tuple[CapacityKind, ...]:
        """The capacity kinds GPU nodes come from, in order; unset, what gpuSpot and reservation always
        meant: Spot, else the reservation on Standard, on-demand on Autopilot."""
        if self.capacity:
            return self.capacity
        if self.gpu_spot:
            return ("spot",)
        return ("on-demand",) if self.autopilot else ("reservation",)

    @property
    def hourly_costs(self) -> list[pricing.HourlyCost]:
        """The stack's price per hour on each of its capacity kinds (domain.pricing's table)."""
        shape = pricing.StackShape(
            machine_type=self.facts.machine_type, cpu_machine_type=self.cpu_machine_type, region=self.region,
            gpu_nodes=self.gpu_nodes, cpu_nodes=0 if self.autopilot else self.cpu_min_nodes,
            nat=self.private_nodes and self.cloud_nat and not self.existing_cluster,
            bucket_gb=_gigabytes(self.volume_capacity), autopilot=self.autopilot,
            your_prices=self.gpu_node_hourly_usd)
        return [pricing.hourly_cost(shape, kind) for kind in self.capacity_kinds]

    @property
    def price_unknown(self) -> str | None:
        """Why the stack's hourly price is unknown (domain.pricing.unknown_price), or None when it is known."""
        kinds = [c.kind for c in self.hourly_costs if c.usd is None]
        return pricing.unknown_price(self.facts.machine_type, kinds, self.region) if kinds else None

    @property
    def supervised_attempts(self) -> int:
        """The most attempts the run supervisor submits after the first (retries and resubmissions
        after lost nodes); 0 without it."""
        return self.run_max_retries + self.run_max_preemptions if self.run_supervisor else 0

    @property
    def hourly_usd(self) -> float | None:
        """What the stack may cost per hour: the dearest of its capacity kinds; None when one is unknown."""
        return pricing.worst_case(self.hourly_costs)

    @property
    def run_budget_h(self) -> float | None:
        """The run's budget in hours: the earliest of runBudgetHours, runBudgetUsd at the hourly price and
        flex-start's seven days; None for no bound."""
        return pricing.run_hours(self.run_budget_hours, self.run_budget_usd, self.hourly_usd,
                                 "flex-start" in self.capacity_kinds)

    @property
    def run_budget_s(self) -> float:
        """The run's budget in seconds, as the supervisor and the job provider take it (0: none)."""
        return round(self.run_budget_h * 3600) if self.run_budget_h is not None else 0

    @property
    def rdma_nics(self) -> int:
        """RDMA subnets this stack creates, one per RDMA NIC (8 on A4/A3 Ultra, 4 on A4X with multi-network),
        none on A4X with DRANET."""
        return _rdma_nics(self.facts, self.a4x_networking)

    @property
    def staged_verl(self) -> VerlRelease | None:
        """The pinned verl release staging puts on the bucket, unless the user brings their own."""
        return None if self.verl_in_image or self.verl_source_install else self.facts.verl

    @property
    def verl_dir(self) -> str | None:
        """The verl tree first on every Ray process's path; None when the image has verl."""
        if self.verl_source_install:
            return f"{MOUNT_PATH}/{USER_VERL_DIR}"
        release = self.staged_verl
        return f"{MOUNT_PATH}/{release.dir_name}" if release else None

    @property
    def kubernetes_minor(self) -> str:
        """`1.34` of `1.34.1-gke.1829001` (SCHEMA_MINOR when the channel picks): the API schema version
        manifests are checked against."""
        if not self.kubernetes_version:
            return SCHEMA_MINOR
        return ".".join(self.kubernetes_version.split("-")[0].split(".")[:2])

    @property
    def fabric_floor_gbps(self) -> float:
        """The fabric check's floor: the config's, or the platform table's when 0."""
        return self.fabric_min_bus_bandwidth_gbps or self.facts.fabric_min_busbw_gbps

    @property
    def gke_floors(self) -> list[tuple[str, str]]:
        """(feature, lowest GKE version) for each feature of this stack that needs one."""
        return gke_versions.floors(self.facts, self.platform == "a4x" and self.a4x_networking == "dranet")

    @_cross_field
    def _region_and_zone(self) -> Iterator[str]:
        """gcp:zone in gcp:region; a bad region suggests no zone made from it."""
        zone = _ZONE.match(self.zone)
        if not _REGION.match(self.region):  # no zone can be named from it: the zone's own region is the hint
            yield _line("region", self.region, "a GCP region such as us-central1" + (
                f" (the region of gcp:zone {self.zone})." if zone else "."))
            if not zone:
                yield _line("zone", self.zone, "a GCP zone such as us-central1-b.")
        elif not zone or zone.group(1) != self.region:
            yield _line("zone", self.zone, f"must be a zone of region {self.region}, such as {self.region}-b.")

    @_cross_field
    def _cluster_rules(self) -> Iterator[str]:
        """The cluster's mode, version, place and node counts against the platform and each other."""
        p = self.facts
        if self.autopilot and not p.autopilot_supported:
            yield _line("cluster_mode", self.cluster_mode, f"{p.title} runs only on Standard clusters; use "
                        "\"standard\".")
        if self.autopilot and self.ray_operator != "addon":
            yield _line("ray_operator", self.ray_operator, "Autopilot clusters use GKE's Ray operator add-on; use "
                        "\"addon\".")
        yield from [_line("kubernetes_version", self.kubernetes_version, f"{feature} needs {floor} or newer.")
                    for feature, floor in self.gke_floors
                    if self.kubernetes_version and gke_versions.below_floor(self.kubernetes_version, floor)][:1]
        if self.cpu_min_nodes > self.cpu_max_nodes:
            yield _line("cpu_min_nodes", self.cpu_min_nodes, f"must be <= cpuMaxNodes ({self.cpu_max_nodes}).")
        if p.max_placement_nodes and self.gpu_max_nodes > p.max_placement_nodes:
            yield _line("gpu_max_nodes", self.gpu_max_nodes, f"{p.title} nodes share one {p.accelerator_topology} "
                        f"NVLink domain: at most {p.max_placement_nodes}.")
        if self.gpu_nodes > self.gpu_max_nodes:
            yield _line("gpu_nodes", self.gpu_nodes, f"must be <= gpuMaxNodes ({self.gpu_max_nodes}).")
        if self.region and self.cluster_location not in (self.region, *_zones_of(self.cluster_location, self.region)):
            yield _line("cluster_location", self.cluster_location, f"the region {self.region} (gcp:region) or one of "
                        f"its zones such as {self.region}-b: the subnets, NAT and GPU nodes are there.")

    @_cross_field
    def _capacity_rules(self) -> Iterator[str]:
        """verl-gke:capacity against the platform, the legacy gpuSpot/reservation keys and the budget."""
        if self.existing_cluster:
            return
        kinds, p, key = self.capacity_kinds, self.facts, config_key("capacity")
        if self.capacity:
            if len(set(kinds)) != len(kinds):
                yield problem_line(key, list(kinds), "name each kind at most once, in order of preference.")
            offered = PLATFORM_CAPACITY[self.platform]
            if refused := [k for k in kinds if k not in offered]:
                yield problem_line(key, list(kinds), f"{p.title} takes only {', '.join(offered)} in verl-gke (not "
                                   f"{', '.join(refused)}).")
            if p.accelerator_topology and len(kinds) > 1:
                # Its pool has a fixed size (a whole rack): a pool per kind would hold every kind's nodes at once.
                yield problem_line(key, list(kinds), f"{p.title} nodes come from one kind at a time (a fixed-size "
                                   f"{p.accelerator_topology} placement); name one.")
            if self.gpu_spot and kinds != ("spot",):
                yield _line("gpu_spot", True, f"gpuSpot means capacity [\"spot\"]; with capacity "
                            f"{json.dumps(list(kinds))} set, drop gpuSpot.")
        reserve = "reservation" in kinds
        if self.reservation and (malformed := reservation_problem(self.reservation)):
            yield malformed
        if reserve and not self.reservation:
            yield _line("reservation", self.reservation, "capacity lists \"reservation\": set the reservation's name."
                        if self.capacity else
                        "Standard GPU node pools consume a reservation; set its name (or use gpuSpot).")
        elif self.reservation and not reserve and (self.capacity or not self.autopilot):
            yield _line("reservation", self.reservation, "Spot VMs cannot consume a reservation; leave it empty with "
                        "gpuSpot." if not self.capacity else f"capacity {json.dumps(list(kinds))} takes no "
                        "reservation; add \"reservation\" or leave this empty.")
        if self.run_budget_usd and self.price_unknown:
            yield _line("run_budget_usd", self.run_budget_usd, f"needs the stack's hourly price, which is "
                        f"{self.price_unknown}; or set runBudgetHours.")

    @_cross_field
    def _network_rules(self) -> Iterator[str]:
        """The cluster's ranges are disjoint; the Job API's callers are neither the cluster, nor a whole address
        space, nor unauthenticated."""
        nets: list[tuple[str, ipaddress.IPv4Network]] = []
        fields = [("node_subnet_cidr", self.node_subnet_cidr), ("pod_cidr", self.pod_cidr),
                  ("service_cidr", self.service_cidr), ("gvnic_subnet_cidr", self.gvnic_subnet_cidr)]
        for field, text in fields + [("rdma_subnet_cidrs", c) for c in self.rdma_subnet_cidrs]:
            net = ipaddress.IPv4Network(text)
            yield from [_line(field, text, f"overlaps {other} ({config_key(other_field)}).")
                        for other_field, other in nets if net.overlaps(other)]
            nets.append((field, net))
        for text in self.ray_dashboard_cidrs:
            net = ipaddress.IPv4Network(text)
            yield from [_line("ray_dashboard_cidrs", text, f"overlaps {other} ({config_key(field)}): it would admit "
                              "the cluster's own nodes or pods, of every namespace, to the Ray Job API.")
                        for field, other in nets if field in _CLUSTER_RANGE_FIELDS and net.overlaps(other)]
            if net.prefixlen < DASHBOARD_CIDR_MIN_PREFIX:
                yield _line("ray_dashboard_cidrs", text, f"at most {2 ** (32 - DASHBOARD_CIDR_MIN_PREFIX)} addresses "
                            f"(a /{DASHBOARD_CIDR_MIN_PREFIX} or narrower): the callers of the Job API are a VPN's or "
                            "a bastion's range, not a whole private address space.")
            if net.prefixlen != 32 and not has_token_auth(self.image_ray_version):
                yield _line("ray_dashboard_cidrs", text, f"a single host (/32) behind an authenticated front: Ray "
                            f"{self.image_ray_version} of this stack's image has no token authentication, so any host "
                            "of the range could run jobs (CVE-2023-48022); or an image with Ray >= 2.52 (verlImage, "
                            "rayVersion).")
        if len(self.rdma_subnet_cidrs) != self.rdma_nics:
            yield _line("rdma_subnet_cidrs", list(self.rdma_subnet_cidrs),
                        f"{self.facts.title} needs exactly {self.rdma_nics} RDMA subnets, one per NIC.")

    @_cross_field
    def _worker_rules(self) -> Iterator[str]:
        """A worker pod fits its node, and on Autopilot its per-accelerator maximum."""
        p = self.facts
        beside_head = " beside the Ray head" if p.head_on_gpu_node else ""
        if self.worker_cpus > p.max_worker_cpus:
            yield _line("worker_cpus", self.worker_cpus, f"each {p.machine_type} node has {p.allocatable_cpu:.2f} "
                        f"allocatable vCPUs; request at most {p.max_worker_cpus}{beside_head} (default "
                        f"{p.worker_cpus}).")
        if self.worker_memory_gi > p.max_worker_memory_gi:
            yield _line("worker_memory_gi", self.worker_memory_gi, f"each {p.machine_type} node has "
                        f"{p.allocatable_memory_gib:.0f}Gi allocatable; request at most {p.max_worker_memory_gi}"
                        f"{beside_head} (default {p.worker_memory_gi}).")
        elif self.worker_memory_gi <= p.shm_size_gi:
            yield _line("worker_memory_gi", self.worker_memory_gi,
                        f"must exceed the {p.shm_size_gi}Gi /dev/shm that counts against it.")
        if self.autopilot and p.autopilot_max_pod and p.autopilot_worker:
            top, car, copier, most = p.autopilot_max_pod, AUTOPILOT_SIDECAR, CHECKPOINT_COPIER, p.autopilot_worker
            for field, value, limit, unit in (("worker_cpus", self.worker_cpus, most.cpu, " vCPUs"),
                                              ("worker_memory_gi", self.worker_memory_gi, most.memory_gi, "Gi")):
                if value > limit:
                    yield _line(field, value, f"Autopilot admits a {p.accelerator} worker pod of at most {top.cpu} "
                                f"vCPUs / {top.memory_gi}Gi, the GCS FUSE sidecar's {car.cpu} vCPUs / "
                                f"{car.memory_gi}Gi and the checkpoint copier's {copier.cpu} vCPU / "
                                f"{copier.memory_gi}Gi included: at most {limit}{unit}.")

    @_cross_field
    def _image_rules(self) -> Iterator[str]:
        """verl comes from one place; the image fits the nodes; its Ray version and digests are its own."""
        p, image = self.facts, self.verl_image
        if self.verl_in_image and self.verl_source_install:
            yield _line("verl_in_image", True, "verlInImage and verlSourceInstall each bring verl; set at most one of "
                        "them.")
        table = next((q.ray_version for q in PLATFORMS.values() if q.image == image), None)
        if self.ray_version and table and self.ray_version != table:
            yield _line("ray_version", self.ray_version, f"{image} has Ray {table}: leave rayVersion unset, or set "
                        "it with an image of your own.")
        if self.verl_in_image and image in PINNED_IMAGE_ARCH:
            yield _line("verl_in_image", True, f"{image} ships verl's dependencies without verl; set verlImage to an "
                        "image you built with verl, or leave verlInImage false (staging installs it).")
        for tagged, digest in self.image_digests.items():
            if not (is_image_reference(tagged) and is_pinned_image(tagged)) or has_digest(tagged):
                yield _line("image_digests", {tagged: digest}, "keys are tagged images as the stack names them "
                            "(name:tag, e.g. verlai/verl:vllm011.dev7), values their sha256:<64 hex> digest.")
            elif not SHA256.match(digest):
                yield _line("image_digests", {tagged: digest}, "each digest is sha256:<64 lowercase hex> (the "
                            "registry's manifest digest, as `python -m verl_gke.image_pins --stack <stack>` prints "
                            "it).")
        for chart, digest in self.chart_digests.items():
            if not (_CHART_KEY.match(chart) and SHA256.match(digest)):
                yield _line("chart_digests", {chart: digest}, "keys are charts as name:version (e.g. "
                            "kuberay-operator:1.6.2), values the sha256:<64 lowercase hex> of its archive, as `python "
                            "-m verl_gke.image_pins --stack <stack>` prints it.")
        built_for = PINNED_IMAGE_ARCH.get(image)
        if built_for and built_for != p.arch:
            yield _line("verl_image", image, f"is built for {built_for} only; {p.title} nodes are {p.arch}: use "
                        f"{p.image} or an image built for {p.arch}.")

    @_cross_field
    def _job_api_rules(self) -> Iterator[str]:
        """jobDashboardUrl reaches a head that only its callers can reach."""
        url = self.job_dashboard_url
        if url and not self.ray_network_policy and not has_token_auth(self.image_ray_version):
            yield _line("job_dashboard_url", url, f"with Ray {self.image_ray_version} (no token authentication) only "
                        "with rayNetworkPolicy on and rayDashboardCidrs single hosts behind an authenticated front; or "
                        "an image with Ray >= 2.52 (verlImage, rayVersion).")
        elif url and self.ray_network_policy and not self.ray_dashboard_cidrs:
            yield _line("job_dashboard_url", url, "the stack's NetworkPolicy admits only the Ray pods to port 8265; "
                        "add the caller's range to rayDashboardCidrs, or set rayNetworkPolicy to false.")

    @_cross_field
    def _data_rules(self) -> Iterator[str]:
        """A repo of one's own names its own commit; verl's paths are plain, under the bucket mount; what the Ray
        pods may write (domain.bucket's layout) stays apart from what they run."""
        pinned = [("model", DEFAULT_MODEL_REPO, DEFAULT_MODEL_REVISION),
                  *(("dataset", r.repo, r.revision) for r in RECIPES)]
        for field, default_repo, default_revision in pinned:
            repo, revision = getattr(self, field), getattr(self, f"{field}_revision")
            if repo != default_repo and revision == default_revision:
                yield _line(f"{field}_revision", revision, f"is the commit of the default {field} {default_repo}; set "
                            f"the commit of {repo} to stage.")
        plain = []
        for path in grpo_spec.BUCKET_PATHS:
            value = self.verl.get(path)
            if isinstance(value, str) and posixpath.normpath(value) == value and value.startswith(f"{MOUNT_PATH}/"):
                plain.append(path)
            else:
                yield _line(f"verl.{path}", value, f"an absolute path under the bucket mount {MOUNT_PATH}/ that every "
                            "node shares, written plainly (no '..', '.', '//' or trailing '/').")
        if grpo_spec.CHECKPOINT_DIR not in plain:
            return
        staged = [f"{MOUNT_PATH}/{model_dir_for(self.model)}", f"{MOUNT_PATH}/{self.recipe.dir}",
                  *([f"{MOUNT_PATH}/{user_data.BUCKET_DIR}"] if self.data_dir or self.reward_function else [])]
        if self.staged_verl is not None:
            staged.append(f"{MOUNT_PATH}/{self.staged_verl.dir_name}")
        checkpoint_dir = self.verl.get(grpo_spec.CHECKPOINT_DIR)
        if any(_under(checkpoint_dir, folder) for folder in staged):
            yield _line(f"verl.{grpo_spec.CHECKPOINT_DIR}", checkpoint_dir, f"outside what staging writes "
                        f"({', '.join(staged)}): the Ray pods may write the checkpoint dir, never the model, the data "
                        "or the code they run.")
            return
        writable = ray_writable_prefixes(checkpoint_dir)
        # startFrom's exported model is under models/, which the export (a Ray job) writes: the user chose it.
        chosen = start_from.overrides(self.start_from, "").get(start_from.MODEL_PATH)
        yield from [_line(f"verl.{path}", self.verl.get(path), f"outside the folders the Ray pods may write "
                          f"({', '.join(writable)}): a job could replace what the next run loads.")
                    for path in plain if path != grpo_spec.CHECKPOINT_DIR and self.verl.get(path) != chosen
                    and any(_under(self.verl.get(path), f"{MOUNT_PATH}/{prefix}") for prefix in writable)]

    @_cross_field
    def _fabric_rules(self) -> Iterator[str]:
        """The fabric check's floor is one a fabric can pass."""
        p = self.facts
        if self.fabric_min_bus_bandwidth_gbps > p.fabric_line_rate_gbps:
            yield _line("fabric_min_bus_bandwidth_gbps", self.fabric_min_bus_bandwidth_gbps, f"above the "
                        f"{p.fabric_line_rate_gbps:g} GB/s an {p.title} node's fabric carries ({p.fabric_links}), so "
                        f"no fabric passes: at most {p.fabric_line_rate_gbps:g} (0: the platform's "
                        f"{p.fabric_min_busbw_gbps:g}).")

    @_cross_field
    def _run_rules(self) -> Iterator[str]:
        """A budget something enforces and whose stop keeps the run; a checkpoint to export; a rotation that keeps
        one checkpoint through a lost node."""
        budgets = [(f, getattr(self, f)) for f in ("run_budget_hours", "run_budget_usd") if getattr(self, f)]
        if not self.run_supervisor:
            yield from [_line(field, budget, "needs runSupervisor: true: only the run supervisor stops a run at its "
                              "budget.") for field, budget in budgets]
        save_freq = self.verl.get("trainer.save_freq")
        if budgets and save_freq <= 0:
            yield _line("verl.trainer.save_freq", save_freq, f"must be a positive number of steps with "
                        f"{camel(budgets[0][0])}: verl writes its deadline checkpoint only when it saves at all, so "
                        "the stop would lose the whole run.")
        if self.export_model and save_freq <= 0:
            export = config_key("export_model")
            yield _line("verl.trainer.save_freq", save_freq, f"must be a positive number of steps with {export} = true "
                        "(the default): verl writes no checkpoint otherwise, and the run would succeed with no model "
                        f"to export; set {export} to false to train without one")
        version = self.verl.version
        if verl_version_tuple(version) < DELETES_BEFORE_SAVE_BELOW:
            yield from [_line(f"verl.{path}", 1, f"verl {version} deletes its oldest checkpoint before it writes the "
                              "next: keeping 1 loses the only one when a node is lost during a save; keep at least 2.")
                        for path in ("trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep")
                        if self.verl.get(path) == 1]

    @_cross_field
    def _logger_rules(self) -> Iterator[str]:
        """verl's loggers (trainer.logger) the job can run: each gets what verl's Tracking reads
        (domain/grpo_spec.py)."""
        loggers, given = grpo_spec.loggers(self.verl), self.verl.get("trainer.logger")
        if unwired := [name for name in loggers if name not in grpo_spec.TRACKERS]:
            yield _line("verl.trainer.logger", given, f"verl-gke wires {', '.join(grpo_spec.TRACKERS[:-1])} and "
                        f"{grpo_spec.TRACKERS[-1]} (not {', '.join(unwired)}).")
        elif "wandb" in loggers and not self.wandb_api_key_secret:
            yield _line("verl.trainer.logger", given, "wandb needs its API key, which staging copies from Secret "
                        f"Manager: set {wandb_key.CONFIG_KEY} to the secret's id, or drop wandb.")
        if self.wandb_api_key_secret and (problem := wandb_key.id_problem(self.wandb_api_key_secret)):
            yield problem_line(wandb_key.CONFIG_KEY, self.wandb_api_key_secret, problem)
        if "mlflow" in loggers and not self.mlflow_tracking_uri:
            yield _line("mlflow_tracking_uri", "", "trainer.logger has mlflow, which without a tracking server writes "
                        "to sqlite:////tmp/mlruns.db on a pod, lost at release: set the server's http(s):// URL.")

    @_cross_field
    def _start_rules(self) -> Iterator[str]:
        """verl-gke:startFrom's form (domain/start_from.py), and one place naming the model."""
        yield from start_from.problems(self.start_from)
        if self.verl.get(start_from.MODEL_PATH) != start_from.overrides(self.start_from, "").get(
                start_from.MODEL_PATH, self.verl.get(start_from.MODEL_PATH)):
            yield _line("start_from", self.start_from, f"names the model, and so does "
                        f"{config_key('verl.' + start_from.MODEL_PATH)}; set one of them.")

    @_cross_field
    def _dataset_rules(self) -> Iterator[str]:
        """A staged dataset other than GSM8K: verl's default reward scores its data_source on this stack's verl, and
        no prompt longer than data.max_prompt_length stops the run (their lengths are not known offline)."""
        recipe = self.recipe
        if self.data_dir and self.dataset != DEFAULT_DATASET_REPO:
            yield problem_line(user_data.KEY, self.data_dir, f"the run trains on it, not on {config_key('dataset')} "
                               f"{self.dataset}: set one of them.")
            return
        if recipe.repo == DEFAULT_DATASET_REPO:
            return
        names, prefixes = user_data.known_sources(self.facts.verl)
        if not self.verl.get(user_data.CUSTOM_REWARD) and not (
                recipe.data_source in names or recipe.data_source.startswith(prefixes)):
            yield _line("dataset", self.dataset, f"verl {self.verl.version}'s default reward does not score "
                        f"{recipe.data_source}; set {config_key('reward_function')}.")
        if self.verl.get("data.truncation") == "error" and not self.verl.get("data.filter_overlong_prompts"):
            yield _line("verl.data.filter_overlong_prompts", False, f"with data.truncation \"error\" verl stops the "
                        f"run on the first {self.dataset} prompt longer than data.max_prompt_length "
                        f"({self.verl.get('data.max_prompt_length')}), after the GPUs are up, and their lengths need "
                        "the model's tokenizer and the rows, which synth does not read: set it to true, as verl's MATH "
                        "examples do, or data.truncation to \"left\" or \"right\".")

    @_cross_field
    def _user_file_rules(self) -> Iterator[str]:
        """verl-gke:dataDir and rewardFunction (domain/user_data.py, domain/reward_fn.py): the verl paths each sets
        left to it, then its files (the reward called on a row per data_source of the data, when there is some)."""
        reward_paths = reward_fn.verl_paths(self.reward_function)  # reads the file for its digest: once
        for key, value, ours, check in (
                (user_data.KEY, self.data_dir, user_data.verl_paths(self.data_dir),
                 lambda: user_data.problems(self.data_dir, self.facts.verl, self.verl)),
                (reward_fn.KEY, self.reward_function, reward_paths,
                 # gs:// data: imported and bound here, called on its own rows at preview (domain/preflight.py)
                 lambda: reward_fn.problems(self.reward_function, self.verl.release,
                                            reward_fn.recipe_sample(self.recipe),
                                            rows=() if user_data.gs_data(self.data_dir) else
                                            user_data.folder_rows(self.data_dir, self.verl)))):
            if both := [path for path, v in ours.items() if self.verl.get(path) != v]:
                yield problem_line(key, value, f"sets {' and '.join(both)} itself: remove "
                                   f"{', '.join(config_key(f'verl.{p}') for p in both)}, or this key.")
            elif value:
                yield from check()
        for path in reward_fn.VERL_PATHS:
            if path in self.verl.given and self.verl.get(path) is not None and path not in reward_paths:
                yield _line(f"verl.{path}", self.verl.get(path), f"use {reward_fn.KEY} (checked and uploaded).")

    @_cross_field
    def _verl_sizing_rules(self) -> Iterator[str]:
        """verl's batch sizes fit the GPUs, and each phase of a step fits their memory."""
        p = self.facts
        sizing = verl_problems(self.verl, p.gpus_per_node, self.gpu_nodes)
        if sizing and not ({q.path for q in sizing} | _SIZING_PATHS) & self.verl.given:
            # verl's sizes are the defaults the user left alone: the node count they set is what to change.
            fits = [str(n) for n in range(1, self.gpu_max_nodes + 1)
                    if not verl_problems(self.verl, p.gpus_per_node, n)]
            paths = " and ".join(config_key(f"verl.{path}") for path in dict.fromkeys(q.path for q in sizing))
            why = "; ".join(q.message.rstrip(".") for q in sizing)
            yield _line("gpu_nodes", self.gpu_nodes, f"verl's defaults, which the stack does not set, do not fit its "
                        f"{self.gpu_nodes * p.gpus_per_node} GPUs ({why}): "
                        + (f"use gpuNodes {', '.join(fits[:-1])} or {fits[-1]}, or " if len(fits) > 1 else
                           f"use gpuNodes {fits[0]}, or " if fits else "") + f"set {paths} to sizes that fit.")
            sizing = []
        legacy = legacy_trainer_for_deadline(self.verl.version, self.run_budget_hours > 0)  # as domain/stack_run.py
        for problem in [*sizing, *grpo_spec.token_budget_problems(self.verl),
                        *grpo_spec.stack_problems(self.verl, p, self.model, self.verl_image),
                        *algorithms.problems(self.verl, legacy)]:
            yield _line(f"verl.{problem.path}", problem.value, problem.message)
        # One line per phase that would not fit, naming the paths that size it.
        for paths, message in run_memory.problems(self.verl, p, self.model, self.gpu_nodes):
            yield ", ".join(f"{config_key('verl.' + path)} = {json.dumps(self.verl.get(path))}" for path in paths) + (
                f": {message}")


_QUANTITY_BYTES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}


def _gigabytes(quantity: str) -> float:
    """`768Gi` -> 824.6 (GB of 10^9 bytes, as storage is priced); 0 for a malformed one (reported apart)."""
    match = QUANTITY.match(quantity)
    return int(quantity[:-2]) * _QUANTITY_BYTES[match.group(1)] / 1e9 if match else 0.0


def _rdma_nics(platform: Platform, a4x_networking: str) -> int:
    if platform.name == "a4x" and a4x_networking == "dranet":
        return 0
    return platform.rdma_nics


def verl_given(value: Any, platform: Platform) -> tuple[dict[str, Any], list[verl_settings.Problem]]:
    """verl-gke:verl's entries that verl takes, as it takes them, and the problems of the others."""
    flat, problems = verl_settings.decode(value)
    accepted, more = verl_settings.check(flat, platform.verl, grpo_spec.OWNED, grpo_spec.BOUNDS,
                                        algorithms.ELSEWHERE)
    return accepted, problems + more


def _nodes(value: Any) -> int:
    """gpuNodes as given, or its default when unreadable (reported by its own field)."""
    try:
        return max(int(value), 1)
    except (TypeError, ValueError):
        return StackConfig.model_fields["gpu_nodes"].default


def _unset(value: Any) -> bool:
    """Config sentinels for "derive it": empty string, 0, "auto", empty list."""
    if isinstance(value, bool):
        return False
    return value in (None, "", 0, "0", "auto", "[]", [], ())



def reservation_problem(reservation: str) -> str | None:
    """The forms GKE takes for a specific reservation, each name a GCE name; None when `reservation` is one."""
    match = _RESERVATION.match(reservation)
    names = [match.group("name"), *([match.group("block")] if match.group("block") else [])] if match else []
    if match and all(GCE_NAME.match(n) and len(n) <= MAX_GCE_NAME for n in names) and (
            match.group("project") is None or PROJECT_ID.match(match.group("project"))):
        return None
    return problem_line(config_key("reservation"), reservation,
                        "the reservation's name (my-reservation), a block of it (my-reservation/reservationBlocks/"
                        "<block>), or a shared one as projects/<owner project>/reservations/<name>[/reservationBlocks/"
                        "<block>]: names of 1-63 lowercase letters, digits or hyphens, starting with a letter.")


def _zones_of(location: str, region: str) -> tuple[str, ...]:
    zone = _ZONE.match(location)
    return (location,) if zone and zone.group(1) == region else ()


def _under(path: str, folder: str) -> bool:
    return path == folder.rstrip("/") or path.startswith(folder.rstrip("/") + "/")


# Namespaces Pulumi passes to providers and the engine: not ours to judge, beyond a warning for gcp.
_PASSED_ON = ("kubernetes", "pulumi")


def _key_problems(raw: Mapping[str, Any]) -> list[str]:
    """Keys no one reads: no namespace, or a namespace that is not verl-gke's or a provider's."""
    out = []
    for key in raw:
        ns, colon, _ = key.partition(":")
        if not colon:
            out.append(f"{key}: a config key needs its namespace; write {NAMESPACE}:{key}")
        elif ns not in (NAMESPACE, "gcp", *_PASSED_ON):
            out.append(f"{key}: unknown namespace {ns!r}; verl-gke reads {NAMESPACE}:<key> and "
                       f"{', '.join(GCP_KEYS)}")
    return out


def config_warnings(raw: Mapping[str, Any]) -> list[str]:
    """gcp: keys verl-gke does not read: Pulumi passes them to the gcp provider, which may."""
    return [f"{key} is not read by verl-gke; Pulumi passes it on to the gcp provider"
            for key in sorted(raw) if key.startswith("gcp:") and key not in GCP_KEYS]


def nearest_key(key: str, known: Iterable[str]) -> str | None:
    """The known key a misspelt `key` most likely meant (compared without the namespace, ignoring case)."""
    names = {k.partition(":")[2].lower(): k for k in known if k.partition(":")[0] == key.partition(":")[0]}
    found = difflib.get_close_matches(key.partition(":")[2].lower(), names, n=1, cutoff=0.8)
    return names[found[0]] if found else None


def _as_field_values(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Raw `namespace:key` strings -> model input (aliases); verl-gke:verl as given, the
    keys it replaced and verl paths set without --path left out (reported by _verl_key_problem)."""
    data: dict[str, Any] = {}
    for full_key, value in raw.items():
        ns, _, key = full_key.partition(":")
        if ns == "gcp" and key in GCP_FIELDS:
            data[key] = value
        elif ns != NAMESPACE or full_key in (HF_TOKEN_KEY, INTERNAL_SOURCE_RANGE_KEY) or _verl_key_problem(full_key, value):
            continue
        elif full_key == VERL_KEY:
            data["verl"] = value
        else:
            data[key] = value
    return data


def _verl_key_problem(full_key: str, value: Any) -> str | None:
    """A key of the old grpo* family, or a verl path set without --path: what to do instead."""
    key = full_key.partition(":")[2]
    if key in grpo_spec.RENAMED:
        return _renamed_line(full_key, value, grpo_spec.RENAMED[key])
    if full_key.startswith(VERL_KEY + "."):
        return (f"{full_key}: a verl path is set inside verl-gke:verl: `pulumi config rm {full_key}`, then "
                f"`pulumi config set --path {full_key} {shlex.quote(str(value))}`")
    return None


def _renamed_line(full_key: str, value: Any, paths: tuple[str, ...]) -> str:
    """`verl-gke:grpoX = v: replaced by verl-gke:verl.<path>: <the commands>`."""
    if not paths:  # grpoExtraOverrides: each `key=value` item is a path of its own
        items = _decoded(value)
        items = [i for i in items if isinstance(i, str) and "=" in i] if isinstance(items, list) else []
        sets = [f"`pulumi config set --path {VERL_KEY}.{k.lstrip('+')} {shlex.quote(v)}`"
                for k, _, v in (i.partition("=") for i in items)]
        return problem_line(full_key, _decoded(value), f"replaced by {VERL_KEY}.<verl path>, one per override: "
                            f"`pulumi config rm {full_key}`" + "".join(f", then {c}" for c in sets))
    new = " and ".join(f"{VERL_KEY}.{p}" for p in paths)
    if _unset(value):  # 0 / auto / "": the platform's default, which is now what an unset path means
        return problem_line(full_key, value, f"replaced by {new}; unset means the platform's default: "
                            f"`pulumi config rm {full_key}`")
    sets = ", then ".join(f"`pulumi config set --path {VERL_KEY}.{p} {shlex.quote(str(value))}`" for p in paths)
    return problem_line(full_key, value, f"replaced by {new}: `pulumi config rm {full_key}`, then {sets}")


def load_config(raw: Mapping[str, Any], source: str = "The stack config", secret_keys: Iterable[str] = (),
                declared: Mapping[str, Declared] | None = None, now: datetime | None = None) -> StackConfig:
    """Validate raw config (`{"verl-gke:gpuNodes": "2", "gcp:project": ...}`) into a StackConfig.

    Key names, types (as `declared` in Pulumi.yaml, the project's own by default), every field's rule and
    every cross-field rule are reported together. The values of `secret_keys` (and the token) never
    appear in a message.
    """
    if declared is None:
        declared = declared_types()
    problems = _key_problems(raw)
    problems += [line for key, value in raw.items() if (line := _verl_key_problem(key, value))]
    if HF_TOKEN_KEY in raw:  # never its value
        problems.append(f"{HF_TOKEN_KEY}: no longer read, and a token in Pulumi config ends up in its state: "
                        f"`pulumi config rm {HF_TOKEN_KEY}`, then store the token in Secret Manager with "
                        "`gcloud secrets versions add verl-gke-<stack>-hf-token --project <project> --data-file=-`.")
    if INTERNAL_SOURCE_RANGE_KEY in raw:
        problems.append(f"{INTERNAL_SOURCE_RANGE_KEY}: no longer read: the gVNIC firewall admits gvnicSubnetCidr "
                        f"only; `pulumi config rm {INTERNAL_SOURCE_RANGE_KEY}`.")
    large = {k for k, v in raw.items() if k.startswith(f"{NAMESPACE}:") and len(str(v).encode()) > MAX_VALUE_BYTES}
    # No value: it is long, and may be a secret.
    problems += [f"{key}: {len(str(raw[key]).encode()):,} bytes; at most {MAX_VALUE_BYTES:,} (Linux's MAX_ARG_STRLEN: "
                 "the run's command line is one argument of `sh -c`)." for key in sorted(large)]
    data = _as_field_values({k: v for k, v in raw.items() if k not in large})
    problems += [f"gcp:{k} is not set: run `pulumi config set gcp:{k} <value>`"
                 for k in GCP_FIELDS if not data.get(k)]
    for k in GCP_FIELDS:
        data.setdefault(k, "")
    for field in ("verl", "startFrom"):  # read before the model, which derives verl's settings from them
        if isinstance(data.get(field), str):
            try:
                data[field] = from_engine(data[field], declared[config_key(field)])
            except TypeProblem as problem:
                problems.append(problem_line(config_key(field), data.pop(field), str(problem)))
    platform = PLATFORMS.get(str(data.get("platform", "a4")), PLATFORMS["a4"])
    try:
        _, verl_problems_ = verl_given(data.get("verl", {}), platform)
    except VerlUnavailable as e:
        raise ConfigError([*problems, f"{VERL_KEY}: cannot be checked against verl's own config: {e}"], source) from None
    problems += [problem_line(config_key(f"verl.{p.path}") if p.path else VERL_KEY, p.value, p.message)
                 for p in verl_problems_]
    context: dict[str, Any] = {"declared": declared, "now": now, "problems": []}
    try:
        cfg: StackConfig | None = StackConfig.model_validate(data, context=context)
        field_lines = []
    except ValidationError as error:
        field_lines = _field_lines(error, data, declared)
        # The rules over several fields run once every field is valid: check them with defaults in place of the bad.
        bad = {str(e["loc"][0]) for e in error.errors() if e["loc"]}
        try:
            cfg = StackConfig.model_validate({k: v for k, v in data.items() if k not in bad}, context=context)
        except ValidationError:
            cfg = None
    reported = {_key_of_line(line) for line in problems}
    problems += [line for line in field_lines if _key_of_line(line) not in reported]
    reported |= {_key_of_line(line) for line in field_lines}
    # verl's settings are sized for a platform's GPUs: not judged against a4's, which stand in for an unknown one.
    unknown_platform = config_key("platform") in reported
    problems += [line for line in context["problems"] if _key_of_line(line) not in reported
                 and not (unknown_platform and line.startswith(f"{VERL_KEY}."))]
    if problems:
        secrets = [str(raw[k]) for k in {*secret_keys, HF_TOKEN_KEY} if raw.get(k)]
        raise ConfigError([_redacted(line, secrets) for line in problems], source)
    assert cfg is not None
    return cfg


_BOUNDS = {"greater_than_equal": ("ge", "at least"), "less_than_equal": ("le", "at most"),
           "greater_than": ("gt", "more than"), "less_than": ("lt", "less than")}
_FRIENDLY = {"float_parsing": "must be a number", "finite_number": "must be a finite number",
             "string_type": "must be a string", "tuple_type": "must be a list"}


def _field_lines(error: ValidationError, data: Mapping[str, Any], known: Iterable[str]) -> list[str]:
    """pydantic's errors in our words: one line naming the key, the value and what is allowed."""
    out = []
    for e in error.errors():
        if not e["loc"]:
            out.append(e["msg"])
            continue
        field = str(e["loc"][0])
        key = f"gcp:{field}" if field in GCP_FIELDS else f"{NAMESPACE}:{field}"
        ctx = e.get("ctx", {})
        # An item's own rule shows the item; pydantic's own words about an item show the whole value.
        value = e["input"] if e["type"] == "config" or len(e["loc"]) == 1 else _decoded(data.get(field))
        if e["type"] == "extra_forbidden":
            # No value: a misspelt secret key would print the secret.
            nearest = nearest_key(key, known)
            out.append(f"{key}: unknown key; did you mean {nearest}? (Pulumi.yaml lists every key verl-gke reads)"
                       if nearest else f"{key}: unknown key; see Pulumi.yaml for the keys verl-gke reads")
        elif e["type"] == "config":
            out.append(problem_line(key, ctx.get("value", value), ctx["message"]))
        elif e["type"] in _BOUNDS:
            bound, words = _BOUNDS[e["type"]]
            out.append(problem_line(key, value, f"must be {words} {ctx.get(bound)}."))
        elif e["type"] == "literal_error":
            out.append(problem_line(key, value, f"must be one of {ctx.get('expected', '')}"))
        else:
            out.append(problem_line(key, value, _FRIENDLY.get(e["type"], e["msg"].lower())))
    return out


def _decoded(value: Any) -> Any:
    """A list or map as the engine's JSON text gives it; anything else as given."""
    try:
        return json.loads(value) if isinstance(value, str) and value.startswith(("[", "{")) else value
    except ValueError:
        return value


def _key_of_line(line: str) -> str:
    return line.split(" ", 1)[0].rstrip(":")


def _redacted(line: str, secrets: list[str]) -> str:
    for secret in secrets:
        if len(secret) >= 4:
            line = line.replace(secret, "[secret]")
    return line


def unused_keys(cfg: StackConfig) -> set[str]:
    """Keys this stack never reads, so their placeholders block nothing."""
    unused = set()
    if cfg.existing_cluster or "reservation" not in cfg.capacity_kinds:
        unused.add(config_key("reservation"))  # only GPU nodes verl-gke provisions from it consume it
    return unused


def placeholders(raw: Mapping[str, Any], cfg: StackConfig) -> list[str]:
    """Keys a user must still set before `pulumi up`: values marked `replace-me` of keys the stack uses."""
    unused = unused_keys(cfg)
    return sorted(k for k, v in raw.items()
                  if isinstance(v, str) and PLACEHOLDER_MARK in v.lower() and k not in unused)
