"""Stack configuration: one typed, immutable object, validated before any resource exists.

`load_config(raw, ...)` is pure and turns raw Pulumi config values (strings, as the engine
hands them over) into a `StackConfig` or raises `ConfigError` listing every problem, each naming
the key, the bad value and what is allowed. `from_pulumi()` reads the running stack's config.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import posixpath
import re
import shlex
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from domain import algorithms, gke_versions, grpo_spec, run_memory, start_from, upgrade_exclusion, verl_settings
from domain.grpo_spec import verl_problems
from domain.run_identity import DELETES_BEFORE_SAVE_BELOW, legacy_trainer_for_deadline, verl_version_tuple
from domain.verl_settings import VerlSettings
from domain.verl_wheel import VerlUnavailable
from domain.bucket import DEFAULT_CAPACITY, MOUNT_PATH, ray_writable_prefixes
from domain.platforms import (
    AUTOPILOT_SIDECAR, CHECKPOINT_COPIER, CPU_MACHINE_SERIES, LOCAL_SSD_SERIES, NCCL_INSTALLER_REPO, PINNED_IMAGE_ARCH,
    PLATFORMS, Mode, Platform, PlatformName, VerlRelease, has_digest, has_token_auth, is_nccl_installer_url,
    is_pinned_image, is_ray_version,
)
from domain import pricing
from domain.pricing import CAPACITY_KINDS, CapacityKind
from domain.problems import ConfigError, problem_line
from domain.pulumi_config import Declared, TypeProblem, from_engine
from domain.stack_files import declared_types
from workloads.stage_data import (
    DATASET_DIR,
    DEFAULT_DATASET_REPO,
    DEFAULT_DATASET_REVISION,
    DEFAULT_MODEL_REPO,
    DEFAULT_MODEL_REVISION,
    dataset_problem,
    is_repo_id,
    model_dir_for,
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

# GCP and Kubernetes naming rules.
_GCE_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
"""Also a DNS-1035 label's grammar (KubeRay's rule for a RayCluster name)."""
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_BUCKET = re.compile(r"^[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9]$")
_IPV4_LIKE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$")
# GCS bucket names: 3-63 characters, or up to 222 with dots and at most 63 between them.
_MAX_BUCKET_PART = 63
_PROJECT_ID = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
# A node pool's specific reservation affinity value (Compute Engine ReservationAffinity.values: a name in the
# project, or projects/<owner>/reservations/<name> for a shared one), or a block of it (GKE's A4/A3 Ultra guides).
_RESERVATION = re.compile(r"^(?:projects/(?P<project>[^/]+)/reservations/)?(?P<name>[^/]+)"
                          r"(?:/reservationBlocks/(?P<block>[^/]+))?$")
_REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
_ZONE = re.compile(r"^([a-z]+-[a-z]+[0-9]+)-[a-z]$")
_QUANTITY = re.compile(r"^[0-9]+(Ki|Mi|Gi|Ti|Pi)$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# Ranges allowed for the CIDR keys that admit traffic: RFC 1918 and RFC 6598 (shared) space only.
PRIVATE_RANGES = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                                          "100.64.0.0/10"))
_SHA256 = re.compile(r"^sha256:[0-9a-f]{64}$")
_ADMITTING_CIDR_FIELDS = ("master_authorized_cidrs", "ray_dashboard_cidrs")
_PRIVATE_CIDR_FIELDS = (*_ADMITTING_CIDR_FIELDS, "gvnic_subnet_cidr")
"""Ranges that admit traffic: the gVNIC subnet is also its firewall's source."""
DASHBOARD_CIDR_MIN_PREFIX = 16
"""The widest range rayDashboardCidrs admits to the Ray Job API (a /16): a VPN's or a bastion's range."""
_CLUSTER_RANGE_FIELDS = ("node_subnet_cidr", "pod_cidr", "service_cidr")

# An image reference as container registries parse it (github.com/distribution/reference,
# regexp.go and normalize.go): [domain[:port]/]path[:tag][@digest]. The first component is a domain
# only with a '.' or ':' or as localhost; the path is lowercase; a sha256 digest has 64 hex digits.
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_PART = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_DOMAIN = rf"(?:localhost(?::[0-9]+)?|{_DOMAIN_PART}(?:\.{_DOMAIN_PART})+(?::[0-9]+)?|{_DOMAIN_PART}:[0-9]+)"
_IMAGE_REFERENCE = re.compile(
    rf"^(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*(?::[\w][\w.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?$")
_MAX_IMAGE_NAME = 255
# Pulumi's engine parses custom timeouts as Go durations (int64 nanoseconds); Python's threading
# waits (the job provider) stop at the same bound on 64-bit Linux (threading.TIMEOUT_MAX).
_MAX_DURATION_S = (2**63 - 1) // 10**9

MAX_VALUE_BYTES = 131_072
"""Linux's MAX_ARG_STRLEN (32 pages, include/uapi/linux/binfmts.h): the longest single argument a process
takes. The run's command line (the job's entrypoint, verl's overrides in it) is one argument of `sh -c`,
so no config value can be longer."""
MAX_ATTEMPT_RETRIES = 100
"""runMaxRetries and runMaxPreemptions at most: beyond it a run fails for a reason another attempt does not fix."""
_CPU_MACHINE = re.compile(r"^(?P<series>[a-z][a-z0-9]*)-(?P<type>[a-z]+)-(?P<vcpus>[1-9][0-9]*)(?P<lssd>-lssd)?$")

# GKE's max cluster name length; GCE resource names are at most 63 characters.
_MAX_CLUSTER_NAME = 40
_MAX_GCE_NAME = 63
SCHEMA_MINOR = "1.34"
"""The Kubernetes schemas manifests are checked against offline when no minor is configured."""


def camel(snake: str) -> str:
    """`a4x_networking` -> `a4xNetworking` (pydantic's to_camel would give `a4XNetworking`)."""
    first, *rest = snake.split("_")
    return first + "".join(part[:1].upper() + part[1:] for part in rest)


class StackConfig(BaseModel):
    """The whole stack config, defaults resolved per platform. Keys are `verl-gke:<camelName>`
    except project/region/zone, which come from the `gcp:` namespace."""

    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=camel,
                              populate_by_name=True, arbitrary_types_allowed=True)

    project: str
    region: str
    zone: str

    platform: PlatformName = "a4"
    cluster_mode: Mode = "standard"
    cluster_name: str = "verl-gke"
    existing_cluster: bool = False
    cluster_location: str = ""
    release_channel: Literal["RAPID", "REGULAR", "STABLE"] = "REGULAR"
    kubernetes_version: str = ""
    deletion_protection: bool = False
    enable_apis: bool = True
    master_authorized_cidrs: tuple[str, ...] = ()
    control_plane_endpoint: Literal["dns", "ip"] = "dns"
    gpu_metrics: bool = True
    dedicated_node_service_account: bool = True
    private_nodes: bool = True
    cloud_nat: bool = True
    image_streaming: bool = True
    image_mirror: bool = True
    binary_authorization: bool = False
    upgrade_exclusion_start: str = upgrade_exclusion.AT_FIRST_UP
    ray_operator: Literal["addon", "helm"] = "addon"
    cpu_machine_type: str = "c2-standard-16"
    cpu_min_nodes: int = Field(1, ge=0)
    cpu_max_nodes: int = Field(5, ge=1)

    gvnic_network_prefix: str = ""
    rdma_network_prefix: str = ""
    gvnic_subnet_cidr: str = "192.168.0.0/24"
    rdma_subnet_cidrs: tuple[str, ...] = ()
    a4x_networking: Literal["dranet", "multi-network"] = "dranet"
    cluster_network: str = ""
    node_subnet_cidr: str = "10.0.0.0/20"
    pod_cidr: str = "10.4.0.0/14"
    service_cidr: str = "10.0.32.0/20"

    gpu_nodes: int = Field(2, ge=1)
    gpu_max_nodes: int = Field(10, ge=1)
    gpu_spot: bool = False
    reservation: str = ""
    capacity: tuple[CapacityKind, ...] = ()
    """Where GPU nodes come from, in order of preference; empty: from gpuSpot and reservation."""
    gpu_node_hourly_usd: dict[CapacityKind, float] = Field(default_factory=dict)
    """capacity kind -> the user's price of one GPU node per hour (domain.pricing.PRICE_KEY)."""
    worker_cpus: int = Field(0, ge=0)
    worker_memory_gi: int = Field(0, ge=0)

    namespace: str = "verl-gke"
    service_account: str = ""
    """Empty: `verl-ray-<stack slug>` (domain/names.py), so the bucket grant names no other stack's."""
    bucket_name: str = ""
    bucket_force_destroy: bool = False
    volume_capacity: str = DEFAULT_CAPACITY

    model: str = DEFAULT_MODEL_REPO
    model_revision: str = DEFAULT_MODEL_REVISION
    dataset: str = DEFAULT_DATASET_REPO
    dataset_revision: str = DEFAULT_DATASET_REVISION
    staging_timeout_minutes: int = Field(180, ge=1)

    ray_cluster_name: str = ""
    verl_image: str = ""
    image_digests: dict[str, str] = Field(default_factory=dict)
    ray_version: str = ""
    verl_source_install: bool = False
    verl_in_image: bool = False
    ray_network_policy: bool = True
    ray_dashboard_cidrs: tuple[str, ...] = ()
    nccl_installer_url: str = ""

    job_ready_timeout_seconds: int = Field(1800, ge=1)
    job_wait_for_completion: bool = False
    job_startup_grace_seconds: int = Field(60, ge=0)
    job_outage_window_seconds: int = Field(600, ge=1)
    job_attempt: int = Field(0, ge=0)
    job_dashboard_url: str = ""
    fabric_check: bool = True
    run_supervisor: bool = True
    run_max_retries: int = Field(2, ge=0)
    run_retry_backoff_seconds: int = Field(120, ge=0)
    run_max_preemptions: int = Field(10, ge=0)
    run_head_outage_seconds: int = Field(1800, ge=60)
    run_stall_seconds: int = Field(10800, ge=0)
    run_replace_window_seconds: int = Field(600, ge=0)
    run_budget_hours: int = Field(0, ge=0)
    run_budget_usd: int = Field(0, ge=0)
    release_workers_when_done: bool = True
    export_model: bool = True
    mlflow_tracking_uri: str = ""
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
        if not isinstance(data.get("verl"), VerlSettings):
            given, _ = verl_given(data.get("verl", {}), platform)
            start = data.get("startFrom")
            if isinstance(start, dict):
                checkpoints = given.get(grpo_spec.CHECKPOINT_DIR, grpo_spec.DEFAULT_CHECKPOINT_DIR)
                given = {**start_from.overrides(start, str(checkpoints)), **given}
            data["verl"] = grpo_spec.run_settings(platform, str(data.get("model", DEFAULT_MODEL_REPO)),
                                                  _nodes(data.get("gpuNodes")), given)
        return data

    @property
    def facts(self) -> Platform:
        return PLATFORMS[self.platform]

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


_QUANTITY_BYTES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}


def _gigabytes(quantity: str) -> float:
    """`768Gi` -> 824.6 (GB of 10^9 bytes, as storage is priced); 0 for a malformed one (reported apart)."""
    match = _QUANTITY.match(quantity)
    return int(quantity[:-2]) * _QUANTITY_BYTES[match.group(1)] / 1e9 if match else 0.0


def _rdma_nics(platform: Platform, a4x_networking: str) -> int:
    if platform.name == "a4x" and a4x_networking == "dranet":
        return 0
    return platform.rdma_nics


def verl_given(value: Any, platform: Platform) -> tuple[dict[str, Any], list[verl_settings.Problem]]:
    """verl-gke:verl's entries that verl takes, as it takes them, and the problems of the others."""
    flat, problems = verl_settings.decode(value)
    accepted, more = verl_settings.check(flat, platform.verl, grpo_spec.OWNED, grpo_spec.BOUNDS)
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
    return value in (None, "", 0, "0", "auto", [], ())


def config_key(field: str) -> str:
    """The full config key of a StackConfig field name or a `verl.<verl path>`."""
    if field in GCP_FIELDS:
        return f"gcp:{field}"
    if field.startswith("verl."):
        return f"{NAMESPACE}:{field}"
    return f"{NAMESPACE}:{camel(field)}"


_FRIENDLY = {
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "tuple_type": "must be a list",
    "finite_number": "must be a finite number",
}


_BOUNDS = {"greater_than_equal": ("ge", "at least"), "less_than_equal": ("le", "at most"),
           "greater_than": ("gt", "more than"), "less_than": ("lt", "less than")}


def _pydantic_problems(error: ValidationError, values: Mapping[str, Any], known: Iterable[str]) -> list[str]:
    out = []
    for e in error.errors():
        loc = [str(p) for p in e["loc"] if not isinstance(p, int)]
        if not loc:
            out.append(e["msg"])
            continue
        key = _key_of_loc(loc)
        value = values.get(key, e.get("input"))
        if e["type"] == "extra_forbidden":
            # No value: a misspelt secret key would print the secret.
            nearest = nearest_key(key, known)
            out.append(f"{key}: unknown key; did you mean {nearest}? (Pulumi.yaml lists every key verl-gke reads)"
                       if nearest else f"{key}: unknown key; see Pulumi.yaml for the keys verl-gke reads")
        elif e["type"] in _BOUNDS:
            bound, words = _BOUNDS[e["type"]]
            out.append(problem_line(key, value, f"must be {words} {e.get('ctx', {}).get(bound)}."))
        elif e["type"] == "literal_error":
            allowed = e.get("ctx", {}).get("expected", "")
            out.append(problem_line(key, value, f"must be one of {allowed}"))
        elif e["type"] == "missing":
            if key not in GCP_KEYS:  # reported by load_config
                out.append(f"{key} is not set: run `pulumi config set {key} <value>`")
        else:
            out.append(problem_line(key, value, _FRIENDLY.get(e["type"], e["msg"].lower())))
    return out


def nearest_key(key: str, known: Iterable[str]) -> str | None:
    """The known key a misspelt `key` most likely meant (compared without the namespace, ignoring case)."""
    names = {k.partition(":")[2].lower(): k for k in known if k.partition(":")[0] == key.partition(":")[0]}
    found = difflib.get_close_matches(key.partition(":")[2].lower(), names, n=1, cutoff=0.8)
    return names[found[0]] if found else None


def typed_values(raw: Mapping[str, Any], declared: Mapping[str, Declared],
                 secret_keys: Iterable[str] = ()) -> tuple[dict[str, Any], list[str]]:
    """Raw config text -> values of the types Pulumi.yaml declares, read as the Pulumi CLI reads them
    (domain.pulumi_config), and one problem per value it would refuse (that key left out)."""
    typed: dict[str, Any] = {}
    problems = []
    secret = set(secret_keys)
    for key, value in raw.items():
        if key not in declared or key in secret or not isinstance(value, str):
            typed[key] = value
            continue
        try:
            typed[key] = from_engine(value, declared[key])
        except TypeProblem as problem:
            problems.append(problem_line(key, value, str(problem)))
    return typed, problems


def _key_of_loc(loc: list[str]) -> str:
    if loc[0] in GCP_FIELDS:
        return config_key(loc[0])
    # pydantic reports aliased fields by their alias already.
    return f"{NAMESPACE}:{loc[0]}"


def _as_field_values(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Raw `namespace:key` strings -> model input (aliases), lists decoded; verl-gke:verl as given, the
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
            data[key] = _decode(value)
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
        items = _decode(value)
        items = [i for i in items if isinstance(i, str) and "=" in i] if isinstance(items, list) else []
        sets = [f"`pulumi config set --path {VERL_KEY}.{k.lstrip('+')} {shlex.quote(v)}`"
                for k, _, v in (i.partition("=") for i in items)]
        return problem_line(full_key, _decode(value), f"replaced by {VERL_KEY}.<verl path>, one per override: "
                            f"`pulumi config rm {full_key}`" + "".join(f", then {c}" for c in sets))
    new = " and ".join(f"{VERL_KEY}.{p}" for p in paths)
    if _unset(value):  # 0 / auto / "": the platform's default, which is now what an unset path means
        return problem_line(full_key, value, f"replaced by {new}; unset means the platform's default: "
                            f"`pulumi config rm {full_key}`")
    sets = ", then ".join(f"`pulumi config set --path {VERL_KEY}.{p} {shlex.quote(str(value))}`" for p in paths)
    return problem_line(full_key, value, f"replaced by {new}: `pulumi config rm {full_key}`, then {sets}")


def _decode(value: Any) -> Any:
    """Arrays arrive as JSON text from the engine; everything else stays a string."""
    if isinstance(value, str) and value.startswith("["):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def load_config(raw: Mapping[str, Any], source: str = "The stack config", secret_keys: Iterable[str] = (),
                declared: Mapping[str, Declared] | None = None, now: datetime | None = None) -> StackConfig:
    """Validate raw config (`{"verl-gke:gpuNodes": "2", "gcp:project": ...}`) into a StackConfig.

    One pass: key names, types (as `declared` in Pulumi.yaml, the project's own by default) and every
    cross-field rule are all reported together. The values of `secret_keys` (and the token) never
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
    typed, type_problems = typed_values({k: v for k, v in raw.items() if k not in large}, declared, secret_keys)
    data = _as_field_values(typed)
    problems += [f"gcp:{k} is not set: run `pulumi config set gcp:{k} <value>`"
                 for k in GCP_FIELDS if not data.get(k)]
    problems += type_problems
    for k in GCP_FIELDS:
        data.setdefault(k, "")
    platform = PLATFORMS.get(str(data.get("platform", "a4")), PLATFORMS["a4"])
    try:
        _, verl_problems_ = verl_given(data.get("verl", {}), platform)
    except VerlUnavailable as e:
        raise ConfigError([*problems, f"{VERL_KEY}: cannot be checked against verl's own config: {e}"], source) from None
    problems += [problem_line(config_key(f"verl.{p.path}") if p.path else VERL_KEY, p.value, p.message)
                 for p in verl_problems_]
    cfg = None
    try:
        cfg = StackConfig.model_validate(data)
    except ValidationError as error:
        problems += _pydantic_problems(error, typed, declared)
        # Check the rest against defaults for what is invalid, so one run names every problem.
        cfg = _validate_without(data, error)
    if cfg is not None:
        reported = {_key_of_line(line) for line in problems}
        # verl's settings are sized for a platform's GPUs: not judged against a4's, which stand in for an unknown one.
        unknown_platform = config_key("platform") in reported
        problems += [line for line in semantic_problems(cfg, now) if _key_of_line(line) not in reported
                     and not (unknown_platform and line.startswith(f"{VERL_KEY}."))]
    if problems:
        secrets = [str(raw[k]) for k in {*secret_keys, HF_TOKEN_KEY} if raw.get(k)]
        raise ConfigError([_redacted(line, secrets) for line in problems], source)
    assert cfg is not None
    return cfg


def _validate_without(data: dict[str, Any], error: ValidationError) -> StackConfig | None:
    trimmed = dict(data)
    for e in error.errors():
        loc = [str(part) for part in e["loc"] if not isinstance(part, int)]
        if loc:
            trimmed.pop(loc[0], None)
    try:
        return StackConfig.model_validate(trimmed)
    except ValidationError:
        return None


def _key_of_line(line: str) -> str:
    return line.split(" ", 1)[0].rstrip(":")


def _redacted(line: str, secrets: list[str]) -> str:
    for secret in secrets:
        if len(secret) >= 4:
            line = line.replace(secret, "[secret]")
    return line


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


def semantic_problems(cfg: StackConfig, now: datetime | None = None) -> list[str]:
    """Every cross-field rule, each problem naming its key, value and what is allowed (dates against `now`)."""
    now = now or datetime.now(timezone.utc)
    out: list[str] = []
    p = cfg.facts

    def add(field: str, value: Any, message: str) -> None:
        out.append(problem_line(config_key(field), value, message))

    if not _PROJECT_ID.match(cfg.project):
        add("project", cfg.project, "a GCP project id: 6-30 lowercase letters, digits or hyphens, starting with a letter.")
    zone = _ZONE.match(cfg.zone)
    if not _REGION.match(cfg.region):  # no zone can be named from it: the zone's own region is the hint
        add("region", cfg.region, "a GCP region such as us-central1" + (
            f" (the region of gcp:zone {cfg.zone})." if zone else "."))
        if not zone:
            add("zone", cfg.zone, "a GCP zone such as us-central1-b.")
    elif not zone or zone.group(1) != cfg.region:
        add("zone", cfg.zone, f"must be a zone of region {cfg.region}, such as {cfg.region}-b.")

    if cfg.autopilot and not p.autopilot_supported:
        add("cluster_mode", cfg.cluster_mode, f"{p.title} runs only on Standard clusters; use \"standard\".")
    if cfg.autopilot and cfg.ray_operator != "addon":
        add("ray_operator", cfg.ray_operator, "Autopilot clusters use GKE's Ray operator add-on; use \"addon\".")
    if not _GCE_NAME.match(cfg.cluster_name) or len(cfg.cluster_name) > _MAX_CLUSTER_NAME:
        add("cluster_name", cfg.cluster_name,
            f"1-{_MAX_CLUSTER_NAME} lowercase letters, digits or hyphens, starting with a letter.")
    if cfg.kubernetes_version and not gke_versions.is_version(cfg.kubernetes_version):
        add("kubernetes_version", cfg.kubernetes_version,
            "empty (the channel's choice), a minor such as 1.35, or a GKE version such as 1.34.1-gke.1829001.")
    elif cfg.kubernetes_version:
        for feature, floor in cfg.gke_floors:
            if gke_versions.below_floor(cfg.kubernetes_version, floor):
                add("kubernetes_version", cfg.kubernetes_version, f"{feature} needs {floor} or newer.")
                break
    if exclusion := upgrade_exclusion.start_problem(cfg.upgrade_exclusion_start, now):
        add("upgrade_exclusion_start", cfg.upgrade_exclusion_start, exclusion)
    if machine_problem := cpu_machine_problem(cfg.cpu_machine_type):
        add("cpu_machine_type", cfg.cpu_machine_type, machine_problem)
    if cfg.cpu_min_nodes > cfg.cpu_max_nodes:
        add("cpu_min_nodes", cfg.cpu_min_nodes, f"must be <= cpuMaxNodes ({cfg.cpu_max_nodes}).")
    if p.max_placement_nodes and cfg.gpu_max_nodes > p.max_placement_nodes:
        add("gpu_max_nodes", cfg.gpu_max_nodes,
            f"{p.title} nodes share one {p.accelerator_topology} NVLink domain: at most {p.max_placement_nodes}.")
    if cfg.gpu_nodes > cfg.gpu_max_nodes:
        add("gpu_nodes", cfg.gpu_nodes, f"must be <= gpuMaxNodes ({cfg.gpu_max_nodes}).")
    if not cfg.existing_cluster:
        out.extend(capacity_problems(cfg))

    if cfg.cluster_network and (not _GCE_NAME.match(cfg.cluster_network) or len(cfg.cluster_network) > _MAX_GCE_NAME):
        add("cluster_network", cfg.cluster_network, "empty (a VPC of the stack's own) or the name of an existing "
            "VPC of the project, such as default.")
    for field, suffix in (("gvnic_network_prefix", "-internal"), ("rdma_network_prefix", "-sub-7")):
        value = getattr(cfg, field)
        if value and (not _GCE_NAME.match(value) or len(value + suffix) > _MAX_GCE_NAME):
            add(field, value, f"lowercase letters, digits or hyphens starting with a letter, at most "
                f"{_MAX_GCE_NAME - len(suffix)} characters.")
    out.extend(_cidr_problems(cfg))

    beside_head = " beside the Ray head" if p.head_on_gpu_node else ""
    if cfg.worker_cpus > p.max_worker_cpus:
        add("worker_cpus", cfg.worker_cpus,
            f"each {p.machine_type} node has {p.allocatable_cpu:.2f} allocatable vCPUs; request at most "
            f"{p.max_worker_cpus}{beside_head} (default {p.worker_cpus}).")
    if cfg.worker_memory_gi > p.max_worker_memory_gi:
        add("worker_memory_gi", cfg.worker_memory_gi,
            f"each {p.machine_type} node has {p.allocatable_memory_gib:.0f}Gi allocatable; request at most "
            f"{p.max_worker_memory_gi}{beside_head} (default {p.worker_memory_gi}).")
    elif cfg.worker_memory_gi <= p.shm_size_gi:
        add("worker_memory_gi", cfg.worker_memory_gi,
            f"must exceed the {p.shm_size_gi}Gi /dev/shm that counts against it.")
    if cfg.autopilot and p.autopilot_max_pod and p.autopilot_worker:
        top, car, copier, most = p.autopilot_max_pod, AUTOPILOT_SIDECAR, CHECKPOINT_COPIER, p.autopilot_worker
        for field, value, limit, unit in (("worker_cpus", cfg.worker_cpus, most.cpu, " vCPUs"),
                                          ("worker_memory_gi", cfg.worker_memory_gi, most.memory_gi, "Gi")):
            if value > limit:
                add(field, value, f"Autopilot admits a {p.accelerator} worker pod of at most {top.cpu} vCPUs / "
                    f"{top.memory_gi}Gi, the GCS FUSE sidecar's {car.cpu} vCPUs / {car.memory_gi}Gi and the "
                    f"checkpoint copier's {copier.cpu} vCPU / {copier.memory_gi}Gi included: at most {limit}{unit}.")

    if not _DNS_LABEL.match(cfg.namespace) or len(cfg.namespace) > 63:
        add("namespace", cfg.namespace, "a Kubernetes namespace: at most 63 lowercase letters, digits or hyphens.")
    # The staging Job's account is this name with `-staging` (domain.names).
    if cfg.service_account and (not _DNS_SUBDOMAIN.match(cfg.service_account) or len(cfg.service_account) > 245):
        add("service_account", cfg.service_account, "a Kubernetes name: lowercase letters, digits, '-' or '.', "
            "at most 245 characters.")
    # KubeRay derives "<name>-head-svc" and pod names from it; keep room under 63.
    if not _GCE_NAME.match(cfg.ray_cluster_name) or len(cfg.ray_cluster_name) > 47:
        add("ray_cluster_name", cfg.ray_cluster_name, "at most 47 lowercase letters, digits or hyphens, starting with "
            "a letter and ending with a letter or digit (KubeRay wants a DNS-1035 label).")
    # Empty: derived from the stack and the project (domain.names).
    if cfg.bucket_name and not _bucket_name_ok(cfg.bucket_name):
        add("bucket_name", cfg.bucket_name, "a GCS bucket name: 3-63 lowercase letters, digits, '-', '_' or '.' "
            "(up to 222 with dots, 63 between dots), starting and ending with a letter or digit, not an "
            "IP address, not starting with 'goog' or containing 'google'.")
    if not _QUANTITY.match(cfg.volume_capacity):
        add("volume_capacity", cfg.volume_capacity, "a Kubernetes quantity such as 768Gi.")

    for field in ("model_revision", "dataset_revision"):
        if not _COMMIT.match(getattr(cfg, field)):
            add(field, getattr(cfg, field), "a 40-hex commit of the Hugging Face repo, so staging is reproducible.")
    if cfg.verl_in_image and cfg.verl_source_install:
        add("verl_in_image", cfg.verl_in_image,
            "verlInImage and verlSourceInstall each bring verl; set at most one of them.")
    if not _is_image_reference(cfg.verl_image):
        add("verl_image", cfg.verl_image, "an image reference such as verlai/verl:vllm011.dev7 or "
            "registry.example.com/team/verl@sha256:<64 hex>: lowercase path, tag of letters, digits, '_', '.', '-'.")
    elif not is_pinned_image(cfg.verl_image):
        add("verl_image", cfg.verl_image, "an image with a fixed tag (not latest) or an @sha256 digest.")
    elif cfg.verl_image not in PINNED_IMAGE_ARCH and not has_digest(cfg.verl_image):
        add("verl_image", cfg.verl_image, "an image of your own must be pinned by digest "
            "(name@sha256:<64 hex>): a tag can be moved to other code that then runs on every node.")
    for image, digest in cfg.image_digests.items():
        if not (_is_image_reference(image) and is_pinned_image(image)) or has_digest(image):
            add("image_digests", {image: digest}, "keys are tagged images as the stack names them (name:tag, "
                "e.g. verlai/verl:vllm011.dev7), values their sha256:<64 hex> digest.")
        elif not _SHA256.match(digest):
            add("image_digests", {image: digest}, "each digest is sha256:<64 lowercase hex> (the registry's "
                "manifest digest, as `python -m verl_gke.image_pins --stack <stack>` prints it).")
    if cfg.nccl_installer_url and not is_nccl_installer_url(cfg.nccl_installer_url):
        add("nccl_installer_url", _without_credentials(cfg.nccl_installer_url),
            f"a manifest of Google's installers at a commit: {NCCL_INSTALLER_REPO}/<40-hex commit>/gpudirect-rdma/"
            "<file>.yaml (no branch, tag, other host or repository, query or fragment).")
    if cfg.job_dashboard_url:
        url = _without_credentials(cfg.job_dashboard_url)
        if not re.match(r"^https://[^\s/]+", cfg.job_dashboard_url):
            add("job_dashboard_url", url, "an https URL of a privately reachable Ray dashboard behind a TLS front "
                "(plain http carries the jobs, and with token authentication the token, in clear).")
        elif url != cfg.job_dashboard_url:
            add("job_dashboard_url", url, "no credentials in the URL (user info, query or fragment): they would "
                "be stored in clear in the job's inputs. Reach the dashboard through a private network instead.")
        elif not cfg.ray_network_policy and not has_token_auth(cfg.image_ray_version):
            add("job_dashboard_url", url, f"with Ray {cfg.image_ray_version} (no token authentication) only with "
                "rayNetworkPolicy on and rayDashboardCidrs single hosts behind an authenticated front; or an image "
                "with Ray >= 2.52 (verlImage, rayVersion).")
        elif cfg.ray_network_policy and not cfg.ray_dashboard_cidrs:
            add("job_dashboard_url", url, "the stack's NetworkPolicy admits only the Ray pods to port "
                "8265; add the caller's range to rayDashboardCidrs, or set rayNetworkPolicy to false.")
    if cfg.ray_version and not is_ray_version(cfg.ray_version):
        add("ray_version", cfg.ray_version, "the Ray version inside verlImage, X.Y.Z such as 2.54.0.")
    elif cfg.ray_version and cfg.verl_image in PINNED_IMAGE_ARCH:
        table = next(p.ray_version for p in PLATFORMS.values() if p.image == cfg.verl_image)
        if cfg.ray_version != table:
            add("ray_version", cfg.ray_version, f"{cfg.verl_image} has Ray {table}: leave rayVersion unset, or set "
                "it with an image of your own.")
    if cfg.verl_in_image and cfg.verl_image in PINNED_IMAGE_ARCH:
        add("verl_in_image", cfg.verl_in_image, f"{cfg.verl_image} ships verl's dependencies without verl; set "
            "verlImage to an image you built with verl, or leave verlInImage false (staging installs it).")
    for field, default_repo, default_revision in (("model", DEFAULT_MODEL_REPO, DEFAULT_MODEL_REVISION),
                                                  ("dataset", DEFAULT_DATASET_REPO, DEFAULT_DATASET_REVISION)):
        repo, revision = getattr(cfg, field), getattr(cfg, f"{field}_revision")
        if repo != default_repo and revision == default_revision and is_repo_id(repo):
            add(f"{field}_revision", revision, f"is the commit of the default {field} {default_repo}; set the "
                f"commit of {repo} to stage.")
    if cfg.region and cfg.cluster_location not in (cfg.region, *_zones_of(cfg.cluster_location, cfg.region)):
        add("cluster_location", cfg.cluster_location, f"the region {cfg.region} (gcp:region) or one of its zones such "
            f"as {cfg.region}-b: the subnets, NAT and GPU nodes are there.")
    for field, unit in (("staging_timeout_minutes", 60), ("job_ready_timeout_seconds", 1),
                        ("job_startup_grace_seconds", 1), ("job_outage_window_seconds", 1),
                        ("run_retry_backoff_seconds", 1), ("run_budget_hours", 3600),
                        ("run_head_outage_seconds", 1), ("run_stall_seconds", 1), ("run_replace_window_seconds", 1)):
        if getattr(cfg, field) * unit > _MAX_DURATION_S:
            add(field, getattr(cfg, field),
                f"at most {_MAX_DURATION_S // unit}: the Pulumi engine's longest duration (about 292 years).")
    plain = []
    for path in grpo_spec.BUCKET_PATHS:
        value = cfg.verl.get(path)
        if not isinstance(value, str) or posixpath.normpath(value) != value or not value.startswith(f"{MOUNT_PATH}/"):
            add(f"verl.{path}", value, f"an absolute path under the bucket mount {MOUNT_PATH}/ that every node "
                "shares, written plainly (no '..', '.', '//' or trailing '/').")
        else:
            plain.append(path)
    if grpo_spec.CHECKPOINT_DIR in plain:
        _write_boundary_problems(cfg, [p for p in plain if p != grpo_spec.CHECKPOINT_DIR], add)
    for field in ("model", "dataset"):
        if not is_repo_id(getattr(cfg, field)):
            add(field, getattr(cfg, field), "a Hugging Face repo id such as Qwen/Qwen2.5-32B-Instruct: owner/name "
                "of letters, digits, '.', '_' or '-', without '--' or '..'.")
    if is_repo_id(cfg.dataset) and (unstageable := dataset_problem(cfg.dataset)):
        add("dataset", cfg.dataset, unstageable)
    if cfg.fabric_min_bus_bandwidth_gbps > p.fabric_line_rate_gbps:
        add("fabric_min_bus_bandwidth_gbps", cfg.fabric_min_bus_bandwidth_gbps,
            f"above the {p.fabric_line_rate_gbps:g} GB/s an {p.title} node's fabric carries ({p.fabric_links}), so no "
            f"fabric passes: at most {p.fabric_line_rate_gbps:g} (0: the platform's {p.fabric_min_busbw_gbps:g}).")
    for field in ("run_max_retries", "run_max_preemptions"):
        if getattr(cfg, field) > MAX_ATTEMPT_RETRIES:
            add(field, getattr(cfg, field), f"at most {MAX_ATTEMPT_RETRIES}: a run that needs more attempts fails for "
                "a reason another attempt cannot fix, and each one restarts from the last checkpoint on GPUs that "
                "are paid for.")
    built_for = PINNED_IMAGE_ARCH.get(cfg.verl_image)
    if built_for and built_for != p.arch:
        add("verl_image", cfg.verl_image, f"is built for {built_for} only; {p.title} nodes are {p.arch}: use "
            f"{p.image} or an image built for {p.arch}.")
    out.extend(_run_problems(cfg))
    out.extend(_logger_problems(cfg))
    out.extend(start_from.problems(cfg.start_from))
    if cfg.verl.get(start_from.MODEL_PATH) != start_from.overrides(cfg.start_from, "").get(
            start_from.MODEL_PATH, cfg.verl.get(start_from.MODEL_PATH)):
        add("start_from", cfg.start_from, f"names the model, and so does {config_key('verl.' + start_from.MODEL_PATH)}; "
            "set one of them.")
    sizing = verl_problems(cfg.verl, p.gpus_per_node, cfg.gpu_nodes)
    if sizing and not ({q.path for q in sizing} | _SIZING_PATHS) & cfg.verl.given:
        # verl's sizes are the defaults the user left alone: the node count they set is what to change.
        fits = [str(n) for n in range(1, cfg.gpu_max_nodes + 1) if not verl_problems(cfg.verl, p.gpus_per_node, n)]
        paths = " and ".join(config_key(f"verl.{path}") for path in dict.fromkeys(q.path for q in sizing))
        add("gpu_nodes", cfg.gpu_nodes, f"verl's defaults, which the stack does not set, do not fit its "
            f"{cfg.gpu_nodes * p.gpus_per_node} GPUs ({'; '.join(q.message.rstrip('.') for q in sizing)}): "
            + (f"use gpuNodes {', '.join(fits[:-1])} or {fits[-1]}, or " if len(fits) > 1 else
               f"use gpuNodes {fits[0]}, or " if fits else "") + f"set {paths} to sizes that fit.")
        sizing = []
    legacy = legacy_trainer_for_deadline(cfg.verl.version, cfg.run_budget_hours > 0)  # as domain/stack_run.py
    for problem in [*sizing, *grpo_spec.stack_problems(cfg.verl, p, cfg.model, cfg.verl_image),
                    *algorithms.problems(cfg.verl, legacy)]:
        add(f"verl.{problem.path}", problem.value, problem.message)
    # One line per phase that would not fit, naming the paths that size it.
    for paths, message in run_memory.problems(cfg.verl, p, cfg.model, cfg.gpu_nodes):
        named = ", ".join(f"{config_key('verl.' + path)} = {json.dumps(cfg.verl.get(path))}" for path in paths)
        out.append(f"{named}: {message}")
    return out


# The verl paths grpo_spec.verl_problems sizes against the GPU count.
_SIZING_PATHS = frozenset({"data.train_batch_size", "actor_rollout_ref.rollout.n",
                           "actor_rollout_ref.actor.ppo_mini_batch_size"})


# What verl-gke offers per platform: A4X's pool holds a whole NVLink rack under one COMPACT placement
# (fixed size, Cluster Toolkit's gke-a4x), which flex-start's autoscaled, queued nodes do not give.
PLATFORM_CAPACITY: dict[str, tuple[CapacityKind, ...]] = {
    "a4": CAPACITY_KINDS, "a3u": CAPACITY_KINDS, "a4x": ("reservation", "spot"), "g2": CAPACITY_KINDS,
}


def reservation_problem(reservation: str) -> str | None:
    """The forms GKE takes for a specific reservation, each name a GCE name; None when `reservation` is one."""
    match = _RESERVATION.match(reservation)
    names = [match.group("name"), *([match.group("block")] if match.group("block") else [])] if match else []
    if match and all(_GCE_NAME.match(n) and len(n) <= _MAX_GCE_NAME for n in names) and (
            match.group("project") is None or _PROJECT_ID.match(match.group("project"))):
        return None
    return problem_line(config_key("reservation"), reservation,
                        "the reservation's name (my-reservation), a block of it (my-reservation/reservationBlocks/"
                        "<block>), or a shared one as projects/<owner project>/reservations/<name>[/reservationBlocks/"
                        "<block>]: names of 1-63 lowercase letters, digits or hyphens, starting with a letter.")


def capacity_problems(cfg: StackConfig) -> list[str]:
    """verl-gke:capacity against the platform, the legacy gpuSpot/reservation keys and the budget."""
    out: list[str] = []
    kinds, p = cfg.capacity_kinds, cfg.facts
    key = config_key("capacity")
    if cfg.capacity:
        if len(set(kinds)) != len(kinds):
            out.append(problem_line(key, list(kinds), "name each kind at most once, in order of preference."))
        offered = PLATFORM_CAPACITY[cfg.platform]
        refused = [k for k in kinds if k not in offered]
        if refused:
            out.append(problem_line(key, list(kinds), f"{p.title} takes only {', '.join(offered)} in verl-gke "
                                    f"(not {', '.join(refused)})."))
        if p.accelerator_topology and len(kinds) > 1:
            # Its pool has a fixed size (a whole rack): a pool per kind would hold every kind's nodes at once.
            out.append(problem_line(key, list(kinds), f"{p.title} nodes come from one kind at a time (a fixed-size "
                                    f"{p.accelerator_topology} placement); name one."))
        if cfg.gpu_spot and kinds != ("spot",):
            out.append(problem_line(config_key("gpu_spot"), True, f"gpuSpot means capacity [\"spot\"]; with "
                                    f"capacity {json.dumps(list(kinds))} set, drop gpuSpot."))
    reserve = "reservation" in kinds
    if cfg.reservation and (malformed := reservation_problem(cfg.reservation)):
        out.append(malformed)
    if reserve and not cfg.reservation:
        if cfg.capacity:
            out.append(problem_line(config_key("reservation"), cfg.reservation,
                                    "capacity lists \"reservation\": set the reservation's name."))
        else:
            out.append(problem_line(config_key("reservation"), cfg.reservation,
                                    "Standard GPU node pools consume a reservation; set its name (or use gpuSpot)."))
    elif cfg.reservation and not reserve and (cfg.capacity or not cfg.autopilot):
        message = ("Spot VMs cannot consume a reservation; leave it empty with gpuSpot." if not cfg.capacity
                   else f"capacity {json.dumps(list(kinds))} takes no reservation; add \"reservation\" or leave "
                   "this empty.")
        out.append(problem_line(config_key("reservation"), cfg.reservation, message))
    if cfg.run_budget_usd and cfg.price_unknown:
        out.append(problem_line(config_key("run_budget_usd"), cfg.run_budget_usd,
                                f"needs the stack's hourly price, which is {cfg.price_unknown}; or set runBudgetHours."))
    prices = cfg.gpu_node_hourly_usd
    if any(not 0 < usd <= pricing.MAX_NODE_USD_PER_HOUR for usd in prices.values()):
        out.append(problem_line(config_key("gpu_node_hourly_usd"), prices, "each price more than 0 and at most "
                                f"{pricing.MAX_NODE_USD_PER_HOUR:g} USD per GPU node-hour (A3 Ultra's list price is "
                                "$83.49)."))
    return out


def cpu_machine_problem(machine: str) -> str | None:
    """What is wrong with a CPU pool machine type, naming the nearest one verl-gke takes; None if it is one
    (`<series>-<type>-<vCPUs>[-lssd]` of domain.platforms.CPU_MACHINE_SERIES; GKE checks the vCPU count)."""
    match = _CPU_MACHINE.match(machine)
    if match and match.group("type") in CPU_MACHINE_SERIES.get(match.group("series"), ()) and (
            not match.group("lssd") or match.group("series") in LOCAL_SSD_SERIES):
        return None
    vcpus = match.group("vcpus") if match else "16"
    known = [f"{series}-{kind}-{vcpus}{lssd}" for series, kinds in CPU_MACHINE_SERIES.items() for kind in kinds
             for lssd in ("", *(("-lssd",) if series in LOCAL_SSD_SERIES else ()))]
    nearest = difflib.get_close_matches(machine, known, n=1, cutoff=0.8)
    many = [s for s, kinds in CPU_MACHINE_SERIES.items() if len(kinds) > 1]
    return ((f"did you mean {nearest[0]}? " if nearest else "")
            + "A Compute Engine machine type <series>-<type>-<vCPUs> of an x86 series: "
            + ", ".join(f"{s} ({', '.join(kinds)})" for s, kinds in CPU_MACHINE_SERIES.items() if len(kinds) == 1)
            + f", {', '.join(many)} ({', '.join(CPU_MACHINE_SERIES[many[0]])}); "
            + f"{', '.join(LOCAL_SSD_SERIES[:-1])} and {LOCAL_SSD_SERIES[-1]} also with -lssd.")


def _is_image_reference(image: str) -> bool:
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    name = name[:len(name) - len(last)] + last.split(":", 1)[0]  # without the tag
    return bool(_IMAGE_REFERENCE.match(image)) and len(name) <= _MAX_IMAGE_NAME


def _zones_of(location: str, region: str) -> tuple[str, ...]:
    zone = _ZONE.match(location)
    return (location,) if zone and zone.group(1) == region else ()


def _run_problems(cfg: StackConfig) -> list[str]:
    """A budget nothing would enforce or whose stop would lose the run; a rotation that can lose
    the only checkpoint."""
    out = []
    budgets = [(f, getattr(cfg, f)) for f in ("run_budget_hours", "run_budget_usd") if getattr(cfg, f)]
    for field, budget in budgets:
        if not cfg.run_supervisor:
            out.append(problem_line(config_key(field), budget,
                                    "needs runSupervisor: true: only the run supervisor stops a run at its budget."))
    save_freq = cfg.verl.get("trainer.save_freq")
    if budgets and save_freq <= 0:
        out.append(problem_line(config_key("verl.trainer.save_freq"), save_freq,
                                f"must be a positive number of steps with {camel(budgets[0][0])}: verl writes its "
                                "deadline checkpoint only when it saves at all, so the stop would lose the whole run."))
    if cfg.export_model and save_freq <= 0:
        out.append(problem_line(config_key("verl.trainer.save_freq"), save_freq,
                                f"must be a positive number of steps with {config_key('export_model')} = true (the "
                                "default): verl writes no checkpoint otherwise, and the run would succeed with no "
                                f"model to export; set {config_key('export_model')} to false to train without one"))
    version = cfg.verl.version
    if verl_version_tuple(version) < DELETES_BEFORE_SAVE_BELOW:
        for path in ("trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep"):
            if cfg.verl.get(path) == 1:
                out.append(problem_line(config_key(f"verl.{path}"), 1,
                                        f"verl {version} deletes its oldest checkpoint before it writes the next: "
                                        "keeping 1 loses the only one when a node is lost during a save; keep at "
                                        "least 2."))
    return out


def _logger_problems(cfg: StackConfig) -> list[str]:
    """verl's loggers (trainer.logger) the job can run: each gets what verl's Tracking reads (domain/grpo_spec.py)."""
    out = []
    loggers = grpo_spec.loggers(cfg.verl)
    key = config_key("verl.trainer.logger")
    unwired = [name for name in loggers if name not in (*grpo_spec.TRACKERS, "wandb")]
    if unwired:
        out.append(problem_line(key, cfg.verl.get("trainer.logger"), f"verl-gke wires {', '.join(grpo_spec.TRACKERS[:-1])}"
                                f" and {grpo_spec.TRACKERS[-1]} (not {', '.join(unwired)})."))
    elif "wandb" in loggers:
        out.append(problem_line(key, cfg.verl.get("trainer.logger"), "verl-gke does not pass wandb's API key to the job "
                                "yet, and wandb stops the run without it once training starts; use console, tensorboard "
                                "(event files in the bucket) or mlflow (verl-gke:mlflowTrackingUri)."))
    uri = cfg.mlflow_tracking_uri
    if "mlflow" in loggers and not uri:
        out.append(problem_line(config_key("mlflow_tracking_uri"), uri, "trainer.logger has mlflow, which without a "
                                "tracking server writes to sqlite:////tmp/mlruns.db on a pod, lost at release: set the "
                                "server's http(s):// URL."))
    elif uri and (not re.match(r"^https?://[^\s/]+", uri) or _without_credentials(uri) != uri):
        out.append(problem_line(config_key("mlflow_tracking_uri"), _without_credentials(uri),
                                "an http:// or https:// URL of an MLflow tracking server, without credentials (they "
                                "would be in the job's command and Pulumi's state)."))
    return out


def _bucket_name_ok(name: str) -> bool:
    parts = name.split(".")
    return (bool(_BUCKET.match(name)) and (len(name) <= _MAX_BUCKET_PART or "." in name)
            and all(0 < len(part) <= _MAX_BUCKET_PART for part in parts) and not _IPV4_LIKE.match(name)
            and not name.startswith("goog") and "google" not in name and "g00gle" not in name)


def _without_credentials(url: str) -> str:
    """`url` with any user info, query or fragment blanked out, so that a message never prints a credential."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "[unparsable URL]"
    netloc = parts.netloc.rpartition("@")[2]
    if "@" in parts.netloc:
        netloc = f"***@{netloc}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "***" if parts.query else "",
                                    "***" if parts.fragment else ""))


def _cidr_problems(cfg: StackConfig) -> list[str]:
    out = []
    nets: list[tuple[str, ipaddress.IPv4Network]] = []
    fields = [("node_subnet_cidr", cfg.node_subnet_cidr), ("pod_cidr", cfg.pod_cidr),
              ("service_cidr", cfg.service_cidr), ("gvnic_subnet_cidr", cfg.gvnic_subnet_cidr)]
    fields += [("rdma_subnet_cidrs", c) for c in cfg.rdma_subnet_cidrs]
    fields += [("master_authorized_cidrs", c) for c in cfg.master_authorized_cidrs]
    fields += [("ray_dashboard_cidrs", c) for c in cfg.ray_dashboard_cidrs]
    for field, text in fields:
        try:
            net = ipaddress.IPv4Network(text)
        except ValueError:
            out.append(problem_line(config_key(field), text, "an IPv4 CIDR such as 192.168.1.0/24."))
            continue
        if field in _PRIVATE_CIDR_FIELDS and not any(net.subnet_of(r) for r in PRIVATE_RANGES):
            out.append(problem_line(config_key(field), text, "a private range (inside 10.0.0.0/8, 172.16.0.0/12, "
                                    "192.168.0.0/16 or 100.64.0.0/10): this key admits traffic, never from the "
                                    "internet."))
        if field == "ray_dashboard_cidrs":
            out += _dashboard_cidr_problems(text, net, nets)
            if net.prefixlen != 32 and not has_token_auth(cfg.image_ray_version):
                out.append(problem_line(config_key(field), text, f"a single host (/32) behind an authenticated front: "
                                        f"Ray {cfg.image_ray_version} of this stack's image has no token "
                                        "authentication, so any host of the range could run jobs (CVE-2023-48022); "
                                        "or an image with Ray >= 2.52 (verlImage, rayVersion)."))
        if field not in _ADMITTING_CIDR_FIELDS:
            for other_field, other in nets:
                if net.overlaps(other):
                    out.append(problem_line(config_key(field), text, f"overlaps {other} ({config_key(other_field)})."))
            nets.append((field, net))
    if len(cfg.rdma_subnet_cidrs) != cfg.rdma_nics:
        out.append(problem_line(config_key("rdma_subnet_cidrs"), list(cfg.rdma_subnet_cidrs),
                            f"{cfg.facts.title} needs exactly {cfg.rdma_nics} RDMA subnets, one per NIC."))
    return out


def _under(path: str, folder: str) -> bool:
    return path == folder.rstrip("/") or path.startswith(folder.rstrip("/") + "/")


def _write_boundary_problems(cfg: StackConfig, read_paths: list[str], add: Callable[..., None]) -> None:
    """What the Ray pods may write (domain.bucket's layout) and what they run stay apart: the checkpoint
    dir outside the staged folders, the model and data a run reads outside the writable ones."""
    staged = [f"{MOUNT_PATH}/{model_dir_for(cfg.model)}", f"{MOUNT_PATH}/{DATASET_DIR}"]
    if cfg.staged_verl is not None:
        staged.append(f"{MOUNT_PATH}/{cfg.staged_verl.dir_name}")
    checkpoint_dir = cfg.verl.get(grpo_spec.CHECKPOINT_DIR)
    if any(_under(checkpoint_dir, folder) for folder in staged):
        add(f"verl.{grpo_spec.CHECKPOINT_DIR}", checkpoint_dir, f"outside what staging writes ({', '.join(staged)}): the "
            "Ray pods may write the checkpoint dir, never the model, the data or the code they run.")
        return
    writable = ray_writable_prefixes(checkpoint_dir)
    # startFrom's exported model is under models/, which the export (a Ray job) writes: the user chose it.
    chosen = start_from.overrides(cfg.start_from, "").get(start_from.MODEL_PATH)
    for path in read_paths:
        value = cfg.verl.get(path)
        if value != chosen and any(_under(value, f"{MOUNT_PATH}/{prefix}") for prefix in writable):
            add(f"verl.{path}", value, f"outside the folders the Ray pods may write ({', '.join(writable)}): a job "
                "could replace what the next run loads.")


def _dashboard_cidr_problems(text: str, net: ipaddress.IPv4Network,
                             nets: list[tuple[str, ipaddress.IPv4Network]]) -> list[str]:
    """A range admitted to the Job API must hold neither the cluster's own nodes, pods and services
    (those of every namespace) nor a whole address space."""
    out = [problem_line(config_key("ray_dashboard_cidrs"), text,
                        f"overlaps {other} ({config_key(field)}): it would admit the cluster's own nodes or pods, "
                        "of every namespace, to the Ray Job API.")
           for field, other in nets if field in _CLUSTER_RANGE_FIELDS and net.overlaps(other)]
    if net.prefixlen < DASHBOARD_CIDR_MIN_PREFIX:
        out.append(problem_line(config_key("ray_dashboard_cidrs"), text,
                                f"at most {2 ** (32 - DASHBOARD_CIDR_MIN_PREFIX)} addresses (a /{DASHBOARD_CIDR_MIN_PREFIX}"
                                " or narrower): the callers of the Job API are a VPN's or a bastion's range, not a "
                                "whole private address space."))
    return out


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
