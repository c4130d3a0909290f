"""Preview-time checks of the live project, through the gcp provider's invokes: they run in
`pulumi preview` with the user's credentials, before anything is created or paid for.

Each check turns the provider's answer into config problems that name the key, as the offline
rules do. The program stops on any of them. Offline (synth), `--cloud FILE` answers the invokes;
without it `healthy_answers` stands in so that the program runs: its answers carry STAND_IN and are
never taken as checks (no check, note or value comes from them), and synth lists the checks it could
not make.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from domain.image_mirror import MIRROR_APIS
from domain import algorithms, gke_versions, grpo_spec, reward_fn, start_from, user_data, wandb_key
from domain.bucket import MOUNT_PATH, bucket_path
from domain.staged import model_dir_for
from domain.config import SCHEMA_MINOR, StackConfig, config_key, problem_line
from domain.names import stack_names, stack_slug
from domain.platforms import GPU_POOL_NAME, Platform, gpu_pool_name

RESERVATION = "gcp:compute/getReservation:getReservation"
ENGINE_VERSIONS = "gcp:container/getEngineVersions:getEngineVersions"
MACHINE_TYPES = "gcp:compute/getMachineTypes:getMachineTypes"
PROJECT_SERVICE = "gcp:projects/getProjectService:getProjectService"
CLUSTER = "gcp:container/getCluster:getCluster"
QUOTA = "gcp:cloudquota/getSQuotaInfo:getSQuotaInfo"
SECRET = "gcp:secretmanager/getSecret:getSecret"
OBJECT = "gcp:storage/getBucketObjectContent:getBucketObjectContent"
BUCKET_OBJECT = "gcp:storage/getBucketObject:getBucketObject"
"""An object's metadata (pulumi-gcp's storage.getBucketObject): its `generation`, md5hash, crc32c."""
BUCKET_IAM = "gcp:storage/getBucketIamPolicy:getBucketIamPolicy"
"""A bucket's IAM policy (pulumi-gcp storage.getBucketIamPolicy: `policyData`, the JSON of GCS's Policy)."""
BUCKET = "gcp:storage/getBucket:getBucket"
"""A bucket's metadata (pulumi-gcp storage.getBucket: `projectNumber`, `uniformBucketLevelAccess`)."""
PROJECT_IAM = "gcp:projects/getIamPolicy:getIamPolicy"
"""A project's IAM policy (pulumi-gcp projects.getIamPolicy: `policyData`)."""
READ_ROLES = frozenset(f"roles/storage.{r}" for r in (
    "objectViewer", "objectUser", "objectAdmin", "admin", "legacyObjectReader", "legacyObjectOwner"))
"""The predefined roles holding storage.objects.get (Cloud Storage's "IAM roles" reference)."""
NO_READ_ROLES = frozenset(f"roles/storage.{r}" for r in (
    "objectCreator", "bucketViewer", "hmacKeyAdmin", "legacyBucketReader", "legacyBucketWriter", "legacyBucketOwner"))
"""Cloud Storage's predefined roles without it; any other role bound to staging leaves the check undecided."""
GPU_QUOTA_ID = "GPUS-PER-GPU-FAMILY-per-project-region"
"""Compute Engine's quota on GPUs per GPU family and region (Cloud Quotas), which governs the newest
families (B200, H200, GB200) instead of a per-model NVIDIA-<model>-GPUS quota."""
PREEMPTIBLE_GPU_QUOTA_ID = "PREEMPTIBLE-GPUS-PER-GPU-FAMILY-per-project-region"
"""The same quota for preemptible capacity, a separate pool: Spot VMs draw on it, and so do flex-start VMs
("Flex-start VMs ... consume preemptible quota", https://cloud.google.com/blog/products/compute/
introducing-flex-start-vms-for-the-compute-engine-instance-api, read 2026-12-04). The id follows the
on-demand one with the PREEMPTIBLE- prefix of Compute Engine's PREEMPTIBLE_NVIDIA_<model>_GPUS metrics;
not confirmed in Google's Cloud Quotas docs we read."""
PER_MODEL_GPU_QUOTA = {"g2": ("NVIDIA-L4-GPUS-per-project-region", "PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region")}
"""(on-demand, preemptible) quota ids of a platform whose GPUs Compute Engine counts per model, not per family:
L4 has its own NVIDIA_L4_GPUS and PREEMPTIBLE_NVIDIA_L4_GPUS quotas (Compute Engine's "GPU quota" docs), with
no gpu_family dimension."""


def gpu_quota_ids(cfg: StackConfig) -> dict[str, str]:
    """capacity kind -> the GPU quota it consumes on this stack's platform; a reservation's machines are checked
    on the reservation."""
    on_demand, preemptible = PER_MODEL_GPU_QUOTA.get(cfg.platform, (GPU_QUOTA_ID, PREEMPTIBLE_GPU_QUOTA_ID))
    return {"on-demand": on_demand, "spot": preemptible, "flex-start": preemptible}
GPU_FAMILY = {"a4": "NVIDIA_B200", "a3u": "NVIDIA_H200", "a4x": "NVIDIA_GB200", "g2": "NVIDIA_L4"}
"""The quota's `gpu_family` dimension per platform (H200 and GB200 spelt after B200's and H100's, which
third-party Cloud Quotas readers show; not in GKE's docs we read)."""

REQUIRED_APIS = (
    "compute.googleapis.com", "container.googleapis.com", "storage.googleapis.com", "iam.googleapis.com",
    "iamcredentials.googleapis.com", "cloudresourcemanager.googleapis.com", "logging.googleapis.com",
    "monitoring.googleapis.com", "secretmanager.googleapis.com",
)
"""What the program's resources and invokes call (Cluster Toolkit's GKE blueprints enable the same)."""
BINARY_AUTHORIZATION_API = "binaryauthorization.googleapis.com"
"""GKE evaluates the project's Binary Authorization policy through it (binaryAuthorization)."""


def required_apis(cfg: StackConfig) -> tuple[str, ...]:
    """The APIs this stack's resources call."""
    return (*REQUIRED_APIS, *(MIRROR_APIS if cfg.image_mirror else ()),
            *((BINARY_AUTHORIZATION_API,) if cfg.binary_authorization else ()))

CHECKS = {
    RESERVATION: "the reservation exists in the zone, for the platform's machines, with gpuNodes free",
    ENGINE_VERSIONS: "the release channel offers a GKE version at or above every feature's floor",
    MACHINE_TYPES: "the zone offers the machine type, at the size the worker requests assume",
    PROJECT_SERVICE: "the APIs verl-gke needs are enabled",
    CLUSTER: "whether the stack's cluster exists already (its GPU pool's own nodes count as free)",
    QUOTA: "the project's GPU quota in the region covers gpuNodes x GPUs (on-demand, or preemptible for Spot "
           "and flex-start)",
    OBJECT: "startFrom's checkpoint is complete at this GPU count, or its exported model is published; a model "
            "folder of your own (critic.model.path, actor_rollout_ref.model.path) holds config.json",
    BUCKET_OBJECT: "dataDir's gs:// objects are at their pinned generations, with the columns and data_source "
                   "values verl reads",
    BUCKET_IAM: "staging's identity may read dataDir's gs:// bucket",
    BUCKET: "dataDir's gs:// bucket has uniform access, and its project (whose grants count too)",
    PROJECT_IAM: "staging's identity may read dataDir's gs:// bucket by its project's IAM policy",
    SECRET: "wandbApiKeySecret's Secret Manager secret exists",
}
"""Each live check by the invoke it makes, as synth lists the ones it could not make."""

# An API that is off answers with one of these; with enableApis the update turns it on first.
_API_DISABLED = re.compile(r"SERVICE_DISABLED|has not been used in project|is disabled", re.I)

Invoke = Callable[[str, dict[str, Any]], dict[str, Any]]
"""Token and args -> the provider's answer (camelCase keys); raises when the invoke fails."""

ObjectReader = Callable[[str, str, int], tuple[int, Callable[[int, int], bytes]]]
"""(bucket, object, generation) -> that generation's size and a read(start, length) of its bytes; raises on
failure. Parquet is read through it as pyarrow reads a file: the footer, then only the chunks of the columns
asked for."""


class RangeFile(io.RawIOBase):
    """A read-only, seekable file over ranged reads (what pyarrow.PythonFile needs: seek, tell, readinto)."""

    def __init__(self, size: int, read: Callable[[int, int], bytes]) -> None:
        super().__init__()
        self._size, self._read, self._at = size, read, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._at = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self._size}[whence] + offset
        return self._at

    def tell(self) -> int:
        return self._at

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), self._size - self._at))
        data = self._read(self._at, n) if n else b""
        buffer[:len(data)] = data
        self._at += len(data)
        return len(data)


STAND_IN = "verlGkeStandIn"
"""Set in every answer of the offline stand-in (healthy_answers): no provider answers with it."""


@dataclass
class PreflightResult:
    gke_version: str | None = None
    """The control-plane version chosen from the channel (None: an existing cluster, no answer, or offline)."""
    problems: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    """The checks that passed, in words that depend on the config alone: the stack output
    `preflightChecks`, the same on every `pulumi up` of an unchanged stack."""
    notes: list[str] = field(default_factory=list)
    """This run's figures (machines free, the version picked, the quota) and checks deferred, for the log."""


def version_problem(cfg: StackConfig, answer: Mapping[str, Any]) -> str:
    channel = cfg.release_channel
    default = (answer.get("releaseChannelDefaultVersion") or {}).get(channel) or "nothing"
    latest = (answer.get("releaseChannelLatestVersion") or {}).get(channel) or "nothing"
    needs = "".join(f"; {feature} needs {floor} or newer" for feature, floor in cfg.gke_floors)
    return problem_line(
        config_key("kubernetes_version"), cfg.kubernetes_version,
        f"the {channel} channel in {cfg.cluster_location} offers {default} (default) to {latest} (latest), "
        f"nothing that matches {cfg.kubernetes_version or 'any version'}{needs}.")


def reservation_target(cfg: StackConfig) -> tuple[str, str]:
    """(project, name) of the reservation (domain.config.reservation_problem names the forms)."""
    parts = cfg.reservation.split("/")
    if len(parts) >= 4 and parts[0] == "projects" and parts[2] == "reservations":
        return parts[1], parts[3]
    return cfg.project, parts[0]


def own_gpu_nodes(answer: Mapping[str, Any] | None) -> int:
    """Nodes of this stack's reservation pool in a cluster lookup (`gpu-pool`, or `gpu-reservation` when a
    ComputeClass orders several kinds): they hold reserved machines themselves."""
    names = (GPU_POOL_NAME, gpu_pool_name("reservation"))
    pools = [p for p in (answer or {}).get("nodePools") or [] if p.get("name") in names]
    return sum(int(p.get("nodeCount") or p.get("initialNodeCount") or 0) for p in pools)


def reservation_problems(cfg: StackConfig, answer: Mapping[str, Any], own_nodes: int = 0) -> list[str]:
    p, key, value = cfg.facts, config_key("reservation"), cfg.reservation
    specific = (answer.get("specificReservations") or [{}])[0]
    if not answer.get("name") and not specific:
        return [problem_line(key, value, f"no such reservation in zone {cfg.zone}.")]
    out = []
    zone = str(answer.get("zone", cfg.zone)).rsplit("/", 1)[-1]
    if zone != cfg.zone:
        out.append(problem_line(key, value, f"is in zone {zone}; the GPU nodes are in gcp:zone {cfg.zone}."))
    status = answer.get("status")
    if status and status != "READY":
        out.append(problem_line(key, value, f"is {status}, not READY."))
    props = (specific.get("instanceProperties") or [{}])[0]
    machine = str(props.get("machineType", "")).rsplit("/", 1)[-1]
    if machine != p.machine_type:
        out.append(problem_line(key, value, f"reserves {machine or 'no'} machines; {p.title} needs {p.machine_type}."))
    for accelerator in props.get("guestAccelerators") or []:
        kind = str(accelerator.get("acceleratorType", "")).rsplit("/", 1)[-1]
        count = int(accelerator.get("acceleratorCount", 0))
        if kind != p.accelerator or count != p.gpus_per_node:
            out.append(problem_line(key, value, f"reserves {count} x {kind} per "
                                    f"machine; {p.title} needs {p.gpus_per_node} x {p.accelerator}."))
    count, in_use = int(specific.get("count", 0)), int(specific.get("inUseCount", 0))
    free = count - max(0, in_use - own_nodes)
    if free < cfg.gpu_nodes:
        out.append(problem_line(config_key("gpu_nodes"), cfg.gpu_nodes,
                                f"reservation {value} has {free} of its {count} machines free"
                                + (f" (counting this stack's {own_nodes} GPU nodes as free)" if own_nodes else "")
                                + "; lower gpuNodes or free machines."))
    return out


def machine_type_problems(cfg: StackConfig, answer: Mapping[str, Any]) -> list[str]:
    p = cfg.facts
    found = [m for m in answer.get("machineTypes") or [] if m.get("name") == p.machine_type]
    if not found:
        return [problem_line(config_key("zone"), cfg.zone, f"offers no {p.machine_type} machines ({p.title}).")]
    machine, out = found[0], []
    live = replace(p, machine_vcpus=int(machine.get("guestCpus", p.machine_vcpus)),
                   machine_memory_gb=int(machine.get("memoryMb", p.machine_memory_gb * 1000)) * 2**20 // 10**9)
    out += _size_problems(cfg, live)
    ssds = [int(s.get("partitionCount", 0)) for s in machine.get("bundledLocalSsds") or []]
    if p.local_ssd_count and ssds and ssds[0] != p.local_ssd_count:
        out.append(problem_line(config_key("platform"), cfg.platform,
                                f"{p.machine_type} bundles {ssds[0]} Local SSDs in {cfg.zone}; the platform table "
                                f"sets {p.local_ssd_count} for ephemeral storage."))
    return out


def _size_problems(cfg: StackConfig, live: Platform) -> list[str]:
    """Worker requests that the zone's real machine cannot hold (the table's sizes are GCP's docs)."""
    if cfg.autopilot:
        return []
    out = []
    if cfg.worker_cpus > live.max_worker_cpus:
        out.append(problem_line(config_key("worker_cpus"), cfg.worker_cpus,
                                f"{live.machine_type} in {cfg.zone} has {live.machine_vcpus} vCPUs; at most "
                                f"{live.max_worker_cpus} fit a worker."))
    if cfg.worker_memory_gi > live.max_worker_memory_gi:
        out.append(problem_line(config_key("worker_memory_gi"), cfg.worker_memory_gi,
                                f"{live.machine_type} in {cfg.zone} has {live.machine_memory_gb} GB; at most "
                                f"{live.max_worker_memory_gi}Gi fit a worker."))
    return out


def gpu_quota(cfg: StackConfig, answer: Mapping[str, Any]) -> int | None:
    """The GPU quota's limit for the platform's family in the stack's region; None when the answer has none.
    A dimensions entry naming the family wins over the quota's default (one without gpu_family)."""
    family, best = GPU_FAMILY[cfg.platform], None
    for info in answer.get("dimensionsInfos") or []:
        dims = info.get("dimensions") or {}
        locations = info.get("applicableLocations") or []
        if dims.get("region", cfg.region) != cfg.region or (locations and cfg.region not in locations
                                                              and "global" not in locations):
            continue
        if dims.get("gpu_family", family) != family:
            continue
        details = info.get("details") or [{}]
        value = (details[0] if isinstance(details, list) else details).get("value")
        if value is None:
            continue
        rank = "gpu_family" in dims
        if best is None or rank > best[0]:
            best = (rank, int(value))
    return None if best is None else best[1]


def quota_problems(cfg: StackConfig, answer: Mapping[str, Any], quota_id: str | None = None) -> list[str]:
    """GPU nodes need the quota their capacity kinds consume (`quota_id`, the on-demand one by default); its
    limit, not what other VMs use of it, is all Cloud Quotas tells."""
    ids = gpu_quota_ids(cfg)
    quota_id = quota_id or ids["on-demand"]
    limit, need = gpu_quota(cfg, answer), cfg.gpu_nodes * cfg.facts.gpus_per_node
    if limit is None or limit >= need:
        return []
    kinds = "on demand" if quota_id == ids["on-demand"] else "on " + " or ".join(
        k for k in cfg.capacity_kinds if ids.get(k) == quota_id and k != "on-demand")
    return [problem_line(config_key("gpu_nodes"), cfg.gpu_nodes,
                         f"{need} {GPU_FAMILY[cfg.platform]} GPUs {kinds}, but the project's {quota_id} quota in "
                         f"{cfg.region} is {limit}; request more quota or lower gpuNodes.")]


def api_problems(service: str, answer: Mapping[str, Any]) -> list[str]:
    if answer.get("id"):
        return []
    return [problem_line(config_key("enable_apis"), False, f"{service} is not enabled; enable it "
                         f"(gcloud services enable {service}) or set enableApis to true.")]


def run_preflight(cfg: StackConfig, invoke: Invoke, stack: str | None = None,
                  open_object: ObjectReader | None = None) -> PreflightResult:
    """Every live check this stack needs; the problems of all of them together. `open_object` reads gs://
    dataDir's parquet files (None: offline, not read)."""
    result = PreflightResult()
    wandb_secret_check(cfg, invoke, result)
    gs_data_check(cfg, invoke, open_object, result)
    if stack is not None:
        staging_read_check(cfg, invoke, stack, result)
        model_folder_check(cfg, invoke, stack, result)
    if cfg.existing_cluster:
        result.problems += existing_cluster_problems(cfg, stack, invoke)
        return result

    def ask(token: str, args: dict[str, Any], what: str, field_: str) -> dict[str, Any] | None:
        """The provider's answer; None when there is none to check against (a failure, reported under
        `field_`'s key, an API still off, or the offline stand-in)."""
        try:
            answer = invoke(token, args)
        except Exception as error:  # noqa: BLE001 the provider's own message is the user's clue
            message = provider_message(error, token)
            if cfg.enable_apis and _API_DISABLED.search(message):
                result.notes.append(f"not checked yet ({what}): an API is still off; this update enables it")
                return None
            result.problems.append(problem_line(config_key(field_), getattr(cfg, field_),
                                                f"{what}: the provider said: {message}"))
            return None
        return None if answer.get(STAND_IN) else answer

    def passed(found: list[str], check: str) -> None:
        result.problems += found
        if not found:
            result.checks.append(check)

    if not cfg.enable_apis:
        services = required_apis(cfg)
        answers = {s: ask(PROJECT_SERVICE, {"project": cfg.project, "service": s}, f"API {s}", "enable_apis")
                   for s in services}
        found: list[str] = []
        for service, answer in answers.items():
            if answer is not None:
                with _unexpected_shape(result, f"API {service}", cfg, "enable_apis"):
                    found += api_problems(service, answer)
        if all(answer is not None for answer in answers.values()):
            passed(found, f"APIs: the {len(services)} APIs verl-gke needs are enabled")
        else:
            result.problems += found
    what = "GKE versions of the release channel"
    versions = ask(ENGINE_VERSIONS, {"location": cfg.cluster_location, "project": cfg.project}, what,
                   "release_channel")
    if versions is None and not result.problems:
        # Offline, or a new project's first `up` (the container API is being enabled by this very update):
        # the channel could not be asked. Never create below a feature's floor (ignore_changes on the
        # version means a later pick would not correct it): take the floor, or the version asked for.
        result.gke_version = fallback_version(cfg)
        if result.gke_version and any("an API is still off" in note for note in result.notes):
            result.notes.append(f"GKE versions not checked yet (an API is still off): the cluster is created at "
                                f"{result.gke_version}, the highest floor of this stack")
    if versions is not None:
        with _unexpected_shape(result, what, cfg, "release_channel"):
            result.gke_version = gke_versions.choose(cfg.kubernetes_version, cfg.release_channel, cfg.gke_floors,
                                                     versions)
            if result.gke_version is None:
                result.problems.append(version_problem(cfg, versions))
            else:
                matching = f"matches kubernetesVersion {cfg.kubernetes_version} and " if cfg.kubernetes_version else ""
                result.checks.append(f"GKE version: the {cfg.release_channel} channel offers one that {matching}"
                                     "every feature's floor allows")
                result.notes.append(f"GKE {result.gke_version} from the {cfg.release_channel} channel")
    machine = cfg.facts.machine_type
    machines = ask(MACHINE_TYPES, {"filter": f"name = {machine}", "project": cfg.project, "zone": cfg.zone},
                   f"machine type {machine}", "zone")
    if machines is not None:
        with _unexpected_shape(result, f"machine type {machine}", cfg, "zone"):
            passed(machine_type_problems(cfg, machines),
                   f"machine type: {cfg.zone} offers {machine} at the size the worker requests assume")
    ids = gpu_quota_ids(cfg)
    for quota_id in dict.fromkeys(ids[k] for k in cfg.capacity_kinds if k in ids):
        label = "GPU quota" if quota_id == ids["on-demand"] else "preemptible GPU quota"
        try:  # Cloud Quotas' own API (cloudquotas.googleapis.com) may be off: then the quota goes unchecked
            quota = invoke(QUOTA, {"parent": f"projects/{cfg.project}", "service": "compute.googleapis.com",
                                   "quotaId": quota_id})
        except Exception as error:  # noqa: BLE001 the provider's message is the user's clue
            quota = None
            result.notes.append(f"{label} not checked: {provider_message(error, QUOTA)}")
        if quota is not None and not quota.get(STAND_IN):
            with _unexpected_shape(result, label, cfg, "gpu_nodes"):
                limit = gpu_quota(cfg, quota)
                need = cfg.gpu_nodes * cfg.facts.gpus_per_node
                passed(quota_problems(cfg, quota, quota_id),
                       f"{label} in {cfg.region} covers {need} {GPU_FAMILY[cfg.platform]} GPUs")
                if limit is not None:
                    result.notes.append(f"{label} in {cfg.region}: {limit} {GPU_FAMILY[cfg.platform]}")
    if stack is not None and cfg.start_from:
        passed(start_from_problems(cfg, stack, invoke), f"startFrom: {start_from.lineage(cfg.start_from)} is there "
               "to start from")
    if uses_reservation(cfg):
        try:  # a first deploy has no cluster yet: the lookup fails, and no machine is ours
            own = own_gpu_nodes(invoke(CLUSTER, {"name": cfg.cluster_name, "location": cfg.cluster_location,
                                                 "project": cfg.project}))
        except Exception:  # noqa: BLE001 not found, or not readable: count none as ours
            own = 0
        project, name = reservation_target(cfg)
        answer = ask(RESERVATION, {"name": name, "project": project, "zone": cfg.zone},
                     f"reservation {name} in project {project}, zone {cfg.zone}", "reservation")
        if answer is not None:
            with _unexpected_shape(result, f"reservation {name}", cfg, "reservation"):
                found = reservation_problems(cfg, answer, own)
                passed(found, f"reservation {name}: in {cfg.zone}, READY, {machine}, at least {cfg.gpu_nodes} "
                              "machines free")
                if not found:
                    specific = answer["specificReservations"][0]
                    count, in_use = int(specific["count"]), int(specific.get("inUseCount", 0))
                    free = count - max(0, in_use - own)
                    result.notes.append(f"reservation {name}: {free} of {count} {machine} free"
                                        + (f" ({own} of them this stack's GPU nodes)" if own else ""))
    return result


_NOT_FOUND = re.compile(r"\b404\b|not ?found|no such object", re.I)


def start_from_problems(cfg: StackConfig, stack: str, invoke: Invoke) -> list[str]:
    """startFrom's checkpoint or exported model, read from the stack's bucket (domain/start_from.py); a stand-in
    answer checks nothing."""
    bucket = stack_names(cfg, stack).bucket
    named = start_from.model_bucket(cfg.start_from)
    if named is not None and named != bucket:
        return [problem_line(start_from.KEY, cfg.start_from, f"the model must be in this stack's bucket {bucket} "
                             "(the only one its pods mount); copy it there, under models/<run id>/.")]
    read: dict[str, dict[str, Any] | None] = {}
    for role, name in start_from.objects_to_read(cfg.start_from, str(cfg.verl.get("trainer.default_local_dir"))).items():
        try:
            answer = invoke(OBJECT, {"bucket": bucket, "name": name})
        except Exception as error:  # noqa: BLE001 the provider's own message is the user's clue
            message = provider_message(error, OBJECT)
            if not _NOT_FOUND.search(message):
                return [problem_line(start_from.KEY, cfg.start_from, f"gs://{bucket}/{name} could not be read: "
                                     f"the provider said: {message}")]
            read[role] = None
            continue
        if answer.get(STAND_IN):
            return []
        try:
            read[role] = json.loads(answer.get("content") or "")
        except ValueError:
            read[role] = None
    found = start_from.resumable_problem(cfg.start_from, cfg.gpu_nodes * cfg.facts.gpus_per_node, read)
    return [found] if found else []


MODEL_CONFIG = "config.json"
"""What every Hugging Face model folder verl loads holds (transformers' AutoConfig reads it first)."""


def model_folders(cfg: StackConfig) -> dict[str, str]:
    """The model folders of the user's own verl loads at the run's start: {verl path: folder}, each folder once.
    Not the staged model (staging writes it) nor startFrom's exported one (start_from_problems reads its pointer)."""
    own: dict[str, str] = {}
    mine = (f"{MOUNT_PATH}/{model_dir_for(cfg.model)}",
            start_from.overrides(cfg.start_from, "").get(start_from.MODEL_PATH))
    for path in (start_from.MODEL_PATH, *((algorithms.CRITIC_MODEL,) if algorithms.has_critic(cfg.verl) else ())):
        folder = cfg.verl.get(path)
        if (isinstance(folder, str) and folder.startswith(f"{MOUNT_PATH}/") and folder not in mine
                and folder not in own.values()):
            own[path] = folder
    return own


def model_folder_check(cfg: StackConfig, invoke: Invoke, stack: str, result: PreflightResult) -> None:
    """Each model folder of the user's own holds config.json in the stack's bucket (else verl fails at the run's
    start, after the GPUs are up); NOT CHECKED, never refused, when the object cannot be read."""
    bucket, found, checked = stack_names(cfg, stack).bucket, [], []
    instead = {start_from.MODEL_PATH: f"the staged {cfg.model}", algorithms.CRITIC_MODEL: "the actor's model"}
    for path, folder in model_folders(cfg).items():
        name, key = f"{bucket_path(folder)}/{MODEL_CONFIG}", config_key(f"verl.{path}")
        try:
            answer = invoke(OBJECT, {"bucket": bucket, "name": name})
        except Exception as error:  # noqa: BLE001 the provider's own message is the user's clue
            message = provider_message(error, OBJECT)
            if not _NOT_FOUND.search(message):
                result.notes.append(f"{key}: NOT CHECKED that gs://{bucket}/{name} exists: the provider said: "
                                    f"{message}")
                continue
            role = "critic's" if path == algorithms.CRITIC_MODEL else "actor's"
            found.append(problem_line(key, folder, f"no gs://{bucket}/{name}: verl loads the {role} model, a "
                                      "Hugging Face model folder, from there when the run starts; copy the model "
                                      f"there (its config.json, tokenizer and safetensors), or leave {path} unset "
                                      f"for {instead[path]}."))
            continue
        if answer.get(STAND_IN):
            return
        checked.append(path)
    result.problems += found
    if checked and not found:
        result.checks.append(f"model folders: {' and '.join(checked)} hold{'s' if len(checked) == 1 else ''} "
                             f"{MODEL_CONFIG}")


def gs_data_check(cfg: StackConfig, invoke: Invoke, open_object: ObjectReader | None,
                  result: PreflightResult) -> None:
    """verl-gke:dataDir's gs:// objects exist at the generations the stack file pins, their footers hold the
    columns verl reads, and their data_source column only values the reward scores (that column's chunks
    only are read, not the whole file)."""
    gs = user_data.gs_data(cfg.data_dir)
    if gs is None:
        return
    import pyarrow as pa

    found: list[str] = []
    rows: list[tuple[str, dict[str, Any]]] = []
    for name, pinned in gs.generations.items():
        url = gs.url(name)
        try:
            answer = invoke(BUCKET_OBJECT, {"bucket": gs.bucket, "name": gs.object(name)})
        except Exception as error:  # noqa: BLE001 the provider's own message is the user's clue
            message = provider_message(error, BUCKET_OBJECT)
            found.append(problem_line(user_data.KEY, cfg.data_dir, f"no object {url}: upload it, or name the "
                                      "prefix that holds it." if _NOT_FOUND.search(message) else
                                      f"{url} could not be read: the provider said: {message}"))
            continue
        if answer.get(STAND_IN):
            return
        now = int(answer.get("generation") or 0)
        if now != pinned:
            value = cfg.data_dir.replace(f"{name}={pinned}", f"{name}={now}")
            found.append(problem_line(user_data.KEY, cfg.data_dir, f"{url} changed: the stack pins generation "
                                      f"{pinned}, the bucket holds {now}; to train on the new object set "
                                      f"{user_data.KEY} to {value} (new data, a new run), or restore generation "
                                      f"{pinned}."))
            continue
        if open_object is None:
            continue
        try:
            size, read = open_object(gs.bucket, gs.object(name), pinned)
            file = pa.PythonFile(RangeFile(size, read), mode="r")
            problems = user_data.file_problems(cfg.data_dir, name, lambda file=file: file, cfg.facts.verl, cfg.verl,
                                               read_sources=True)
            found += problems
            if cfg.reward_function and not problems:
                called = user_data.reward_rows(lambda file=file: file, cfg.verl, url)
                rows += called if isinstance(called, list) else []
                if isinstance(called, str):
                    result.notes.append(f"rewardFunction: NOT CHECKED on {url}: {called}")
        except Exception as error:  # noqa: BLE001 the reader's own message is the user's clue
            found.append(problem_line(user_data.KEY, cfg.data_dir, f"{url} could not be read with your "
                                      f"credentials: {' '.join(str(error).split())}"))
    result.problems += found
    if not found and open_object is not None:
        result.checks.append("dataDir: the gs:// objects are at their pinned generations and hold the columns and "
                             "data_source values verl reads")
    if rows:  # the child process and deadline of the synth check (domain/reward_fn.py)
        called = reward_fn.problems(cfg.reward_function, cfg.verl.release, rows=rows)
        result.problems += called
        if not called:
            result.checks.append("rewardFunction: called on one row per data_source of each gs:// file's first row "
                                 "group")


def staging_read_check(cfg: StackConfig, invoke: Invoke, stack: str, result: PreflightResult) -> None:
    """Staging's identity (its Kubernetes service account's Workload Identity principal, that of its namespace,
    or everyone) holds a role with storage.objects.get on dataDir's gs:// bucket, by the bucket's IAM policy or
    its project's. NOT CHECKED, never refused, where the policies cannot tell: unreadable, a custom or other role,
    a condition, a Kubernetes service account named by its UID, object ACLs, or no grant on either (a folder's or
    the organization's may)."""
    gs = user_data.gs_data(cfg.data_dir)
    if gs is None:
        return
    ksa, ns, url = stack_names(cfg, stack).staging_service_account, cfg.namespace, f"gs://{gs.bucket}"
    pool = (r"principal(Set)?://iam\.googleapis\.com/projects/[0-9]+/locations/global/workloadIdentityPools/"
            rf"{re.escape(cfg.project)}\.svc\.id\.goog/")
    ours = re.compile(rf"allUsers|{pool}(subject/ns/{re.escape(ns)}/sa/{re.escape(ksa)}|"
                      rf"namespace/{re.escape(ns)})")
    maybe = re.compile(rf"allAuthenticatedUsers|{pool}(kubernetes\.|\*)")

    def verdict(answer: Mapping[str, Any], what: str) -> bool | str:
        """True: granted; False: not; else why it cannot be told."""
        undecided: bool | str = False
        for binding in json.loads(answer.get("policyData") or "{}").get("bindings") or []:
            role, members = str(binding.get("role")), [str(m) for m in binding.get("members") or []]
            named, perhaps = any(ours.fullmatch(m) for m in members), any(maybe.match(m) for m in members)
            if role in NO_READ_ROLES or not (named or perhaps):
                continue  # a role without storage.objects.get, or someone else's
            if role not in READ_ROLES:
                undecided = f"{'custom ' if '/roles/' in role else ''}role {role} may or may not hold storage.objects.get"
            elif binding.get("condition"):
                undecided = f"the grant of {role} has a condition"
            elif not named:
                undecided = f"{what} grants {role} to all authenticated users or Kubernetes identities by UID or cluster"
            else:
                return True
        return undecided

    def read(token: str, args: dict[str, Any], what: str) -> dict[str, Any] | str | None:
        """The answer; why it is unreadable; None offline or from the stand-in (nothing to check against)."""
        try:
            answer = invoke(token, args)
        except Exception as error:  # noqa: BLE001 the provider's own message is the user's clue
            return f"{what} could not be read: {provider_message(error, token)}"
        return None if not answer or answer.get(STAND_IN) else answer

    def not_checked(why: str | None) -> None:
        if why:
            result.notes.append(f"dataDir: NOT CHECKED that staging may read {url}: {why}")

    policy = read(BUCKET_IAM, {"bucket": gs.bucket}, "the bucket's IAM policy")
    if not isinstance(policy, dict):
        return not_checked(policy)
    granted = verdict(policy, "the bucket's IAM policy")
    if granted is False:  # the bucket's project's grants count too
        bucket = read(BUCKET, {"name": gs.bucket}, "the bucket")
        if not isinstance(bucket, dict):
            return not_checked(bucket)
        if not bucket.get("uniformBucketLevelAccess"):
            return not_checked("the bucket has fine-grained access: its object ACLs may grant it")
        project = read(PROJECT_IAM, {"project": str(bucket.get("projectNumber"))}, "its project's IAM policy")
        if not isinstance(project, dict):
            return not_checked(project)
        granted = verdict(project, "its project's IAM policy")
    if granted is True:
        result.checks.append("dataDir: staging's identity may read the gs:// bucket")
        return None
    if granted:
        return not_checked(str(granted))
    member = (f"principal://iam.googleapis.com/projects/PROJECT_NUMBER/locations/global/workloadIdentityPools/"
              f"{cfg.project}.svc.id.goog/subject/ns/{ns}/sa/{ksa}")
    # Never refused: a folder's or the organization's policy may grant it, and no invoke reads those.
    not_checked(f"neither the bucket's IAM policy nor its project's grants staging (Kubernetes service account {ksa} "
                f"in namespace {ns}) storage.objects.get, and grants on a folder or the organization are not read; "
                "unless one of those grants it, staging fails at its start: grant it with `gcloud storage buckets "
                f"add-iam-policy-binding {url} --role=roles/storage.objectViewer --member={member}`")


def provider_message(error: BaseException, token: str) -> str:
    """The provider's own words in a failed invoke, on one line: without the SDK's `invoke of <token>
    failed: ` prefix and the empty `()` it adds when the failure names no property."""
    text = str(error).strip()
    message = text.splitlines()[0] if text else type(error).__name__
    return message.removeprefix(f"invoke of {token} failed: ").removesuffix(" ()")


@contextmanager
def _unexpected_shape(result: PreflightResult, what: str, cfg: StackConfig, field_: str) -> Iterator[None]:
    """An answer the checks cannot read (a hand-written `--cloud` file) is one problem under the key the
    check concerns, not a traceback."""
    try:
        yield
    except (AttributeError, TypeError, ValueError, KeyError, IndexError) as error:
        result.problems.append(problem_line(config_key(field_), getattr(cfg, field_), f"{what}: the answer has an "
                                            f"unexpected shape ({type(error).__name__}: {error})"))


STACK_LABEL = "verl-gke-stack"
"""Label on the clusters verl-gke creates: the stack (domain.names.stack_slug) that owns it."""


def existing_cluster_problems(cfg: StackConfig, stack: str | None, invoke: Invoke) -> list[str]:
    """existingCluster on a stack whose own cluster it is (the update would delete that cluster), or on a
    cluster without the posture verl-gke's objects rely on (cluster_posture_problems)."""
    try:
        answer = invoke(CLUSTER, {"name": cfg.cluster_name, "location": cfg.cluster_location, "project": cfg.project})
    except Exception:  # noqa: BLE001 not found or not readable: the lookup in the program says so
        return []
    problems = [] if answer.get(STAND_IN) else cluster_posture_problems(cfg, answer)
    if stack is None or (answer.get("resourceLabels") or {}).get(STACK_LABEL) != stack_slug(stack):
        return problems
    return problems + [problem_line(config_key("existing_cluster"), True, f"cluster {cfg.cluster_name} was created by this "
                         f"stack, and `pulumi up` with existingCluster would delete it; to keep it and manage only "
                         f"what runs on it, `pulumi state delete` its cluster and node pool resources and remove its "
                         f"{STACK_LABEL} label first, or set existingCluster back to false.")]


def _first(answer: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """A nested block of pulumi-gcp's getCluster answer (a one-element list), or {}."""
    found = answer.get(key) or [{}]
    return found[0] if isinstance(found, list) and found and isinstance(found[0], Mapping) else {}


def cluster_posture_problems(cfg: StackConfig, answer: Mapping[str, Any]) -> list[str]:
    """What an existing cluster must have for the stack's controls to hold: network-policy enforcement
    (else every NetworkPolicy is inert), Workload Identity, and the GKE metadata server on every pool
    (else Ray pods read the node's service account token). Autopilot has all three."""
    if answer.get("enableAutopilot"):
        return []
    name, where = cfg.cluster_name, f"--location {cfg.cluster_location} --project {cfg.project}"
    out = []
    enforced = answer.get("datapathProvider") == "ADVANCED_DATAPATH" or _first(answer, "networkPolicies").get("enabled")
    if not enforced:
        out.append(problem_line(config_key("existing_cluster"), True, f"cluster {name} enforces no NetworkPolicy "
                                "(neither Dataplane V2 nor Calico), so the stack's default-deny policies would be "
                                f"inert: `gcloud container clusters update {name} {where} --update-addons="
                                f"NetworkPolicy=ENABLED`, then `gcloud container clusters update {name} {where} "
                                "--enable-network-policy` (Dataplane V2 is chosen only at a cluster's creation)."))
    if not _first(answer, "workloadIdentityConfigs").get("workloadPool"):
        out.append(problem_line(config_key("existing_cluster"), True, f"cluster {name} has no Workload Identity, "
                                "so the stack's grants reach no pod and pods act as the node's service account: "
                                f"`gcloud container clusters update {name} {where} --workload-pool="
                                f"{cfg.project}.svc.id.goog`."))
    for pool in answer.get("nodePools") or []:
        mode = _first(_first(pool, "nodeConfigs"), "workloadMetadataConfigs").get("mode")
        if mode != "GKE_METADATA":
            out.append(problem_line(config_key("existing_cluster"), True, f"node pool {pool.get('name')} of cluster "
                                    f"{name} runs without the GKE metadata server, so its pods can read the node's "
                                    f"service account token: `gcloud container node-pools update {pool.get('name')} "
                                    f"--cluster {name} {where} --workload-metadata=GKE_METADATA`."))
    return out


def fallback_version(cfg: StackConfig) -> str | None:
    """The control-plane version when the channel cannot be asked: the configured one, else the highest
    floor of the stack's features (None when it has none: the channel's default is then fine)."""
    if cfg.kubernetes_version:
        return cfg.kubernetes_version
    floors = [floor for _, floor in cfg.gke_floors]
    return max(floors, key=gke_versions.version_key) if floors else None


API_OFF = "googleapi: Error 403: SERVICE_DISABLED: {api} has not been used in project {project} before or it is disabled."
"""What every invoke of a new project answers until its API is on (the stand-in of a first `up`)."""


def wandb_secret_check(cfg: StackConfig, invoke: Invoke, result: PreflightResult) -> None:
    """The secret verl-gke:wandbApiKeySecret names exists (staging reads its newest version, and fails before
    the model download when there is none)."""
    secret = wandb_key.secret_to_copy(cfg.project, cfg.wandb_api_key_secret, grpo_spec.loggers(cfg.verl))
    if secret is None:
        return
    try:
        answer = invoke(SECRET, {"project": cfg.project, "secretId": cfg.wandb_api_key_secret})
    except Exception as error:  # noqa: BLE001 the provider's own message is the user's clue
        message = provider_message(error, SECRET)
        if re.search(r"\b404\b|not ?found", message, re.IGNORECASE):
            message = (f"no such secret in project {cfg.project}: create it with `gcloud secrets create "
                       f"{cfg.wandb_api_key_secret} --project {cfg.project}`, then add the key with `gcloud secrets "
                       f"versions add {cfg.wandb_api_key_secret} --project {cfg.project} --data-file=-`")
        else:
            message = f"the provider said: {message}"
        result.problems.append(problem_line(wandb_key.CONFIG_KEY, cfg.wandb_api_key_secret, message))
        return
    if answer and not answer.get(STAND_IN):
        result.checks.append(f"wandb: Secret Manager secret {secret} exists")


def new_project_answers(project: str) -> dict[str, dict[str, str]]:
    """`--cloud` answers of a project whose APIs are all still off."""
    apis = {RESERVATION: "compute.googleapis.com", MACHINE_TYPES: "compute.googleapis.com",
            ENGINE_VERSIONS: "container.googleapis.com", CLUSTER: "container.googleapis.com",
            PROJECT_SERVICE: "serviceusage.googleapis.com"}
    return {token: {"error": API_OFF.format(api=api, project=project)} for token, api in apis.items()}


def uses_reservation(cfg: StackConfig) -> bool:
    """GPU nodes verl-gke provisions consume the reservation when the capacity lists it."""
    return not cfg.existing_cluster and "reservation" in cfg.capacity_kinds


MOCK_ENDPOINT = "10.0.0.2"
MOCK_CA = "bW9jayBjbHVzdGVyIENBIGNlcnRpZmljYXRl"  # base64 of "mock cluster CA certificate"
MOCK_DNS_ENDPOINT = "gke-0f1e2d3c4b5a49687f6e5d4c3b2a19087f6e-123456789012.us-central1.gke.goog"
"""A DNS-based endpoint as GKE names one: `gke-<id>-<project number>.<region>.gke.goog`."""


def mock_endpoints_config(allow_external_traffic: bool) -> dict[str, Any]:
    """A cluster's controlPlaneEndpointsConfig as pulumi-gcp returns it: GKE gives every cluster a DNS
    endpoint (ControlPlaneEndpointsConfig.DNSEndpointConfig.endpoint, "Always present"), taking user
    traffic only when allowExternalTraffic is on; the IP endpoints stay enabled unless turned off."""
    return {"dnsEndpointConfig": {"endpoint": MOCK_DNS_ENDPOINT, "allowExternalTraffic": allow_external_traffic,
                                  "enableK8sTokensViaDns": False, "enableK8sCertsViaDns": False},
            "ipEndpointsConfig": {"enabled": True}}


def existing_cluster_answer(args: Mapping[str, Any]) -> dict[str, Any]:
    """A cluster lookup's answer offline: the cluster, reachable, with no GPU pool yet."""
    # The lookup returns each nested block as a one-element list (pulumi-gcp's getCluster schema).
    endpoints = mock_endpoints_config(allow_external_traffic=True)
    return {"name": args.get("name"), "location": args.get("location"), "endpoint": MOCK_ENDPOINT,
            "controlPlaneEndpointsConfigs": [{"dnsEndpointConfigs": [endpoints["dnsEndpointConfig"]],
                                              "ipEndpointsConfigs": [endpoints["ipEndpointsConfig"]]}],
            "masterAuths": [{"clusterCaCertificate": MOCK_CA}], "nodePools": [],
            "datapathProvider": "ADVANCED_DATAPATH", "workloadIdentityConfigs": [{"workloadPool": "p.svc.id.goog"}]}


def healthy_answers(cfg: StackConfig) -> Callable[[str, dict[str, Any]], dict[str, Any] | None]:
    """What a healthy project answers for this stack: the stand-in for offline runs."""
    p = cfg.facts
    wanted = cfg.kubernetes_version
    version = wanted if gke_versions.is_exact(wanted) else f"{wanted or SCHEMA_MINOR}.1-gke.1829001"
    version = max([version, *(f for _, f in cfg.gke_floors if gke_versions.is_exact(f))], key=gke_versions.version_key)

    def answer(token: str, args: dict[str, Any]) -> dict[str, Any] | None:
        found = healthy(token, args)
        return None if found is None else {**found, STAND_IN: True}

    def healthy(token: str, args: dict[str, Any]) -> dict[str, Any] | None:
        if token == RESERVATION:
            return {"name": args["name"], "zone": args["zone"], "status": "READY", "specificReservations": [{
                "count": cfg.gpu_max_nodes, "inUseCount": 0,
                "instanceProperties": [{"machineType": p.machine_type, "guestAccelerators": []}]}]}
        if token == ENGINE_VERSIONS:
            return {"releaseChannelDefaultVersion": {cfg.release_channel: version},
                    "releaseChannelLatestVersion": {cfg.release_channel: version}, "validMasterVersions": [version]}
        if token == MACHINE_TYPES:
            return {"machineTypes": [{"name": p.machine_type, "guestCpus": p.machine_vcpus,
                                      "memoryMb": -(-p.machine_memory_gb * 10**9 // 2**20),
                                      "bundledLocalSsds": [{"partitionCount": p.local_ssd_count or 0}]}]}
        if token == PROJECT_SERVICE:
            return {"id": f"{args['project']}/{args['service']}", "service": args["service"]}
        if token == CLUSTER:
            return existing_cluster_answer(args)
        if token == SECRET:
            return {"name": f"projects/{args['project']}/secrets/{args['secretId']}", "secretId": args["secretId"]}
        if token == BUCKET_OBJECT:  # dataDir's objects at the generations the stack pins
            gs = user_data.gs_data(cfg.data_dir)
            return {"name": args["name"], "generation": str(gs.generations[args["name"].rsplit("/", 1)[-1]])
                    if gs else "1"}
        if token == OBJECT:  # a checkpoint whose markers agree, at this stack's world size
            return {"content": json.dumps({"attempt": "stand-in", "world_size": cfg.gpu_nodes * p.gpus_per_node})}
        if token == QUOTA:
            return {"quotaId": args["quotaId"], "dimensionsInfos": [{
                "dimensions": {"gpu_family": GPU_FAMILY[cfg.platform], "region": cfg.region},
                "details": [{"value": str(cfg.gpu_max_nodes * p.gpus_per_node)}],
                "applicableLocations": [cfg.region]}]}
        return None

    return answer
