"""verl-gke: stack config -> components -> stack outputs. Wiring only."""

import pulumi

from components.a4x_dra import A4xDra
from components.cloud_nat import CloudNat
from components.cluster_network import PODS_RANGE, SERVICES_RANGE, ClusterNetwork
from components.stack_config import from_pulumi
from components.user_data import UserData, uploads
from components.data_staging import DataStaging
from components.gcs_fuse_storage import GcsFuseStorage, label_value
from components.gke_cluster import DRA_V1BETA1_APIS, GkeCluster
from components.gpu_compute_class import GpuComputeClass
from domain import hf_token, user_data, wandb_key
from components.gpu_node_pool import GpuNodePool
from components.helm_release import check_charts
from components.grpo_job import GrpoJob
from components.image_mirror import ImageMirror
from domain.image_mirror import is_docker_hub, registry_prefix, repository_id
from domain.run_identity import submission_ids
from domain.stack_run import stack_run
from domain.grpo_spec import CHECKPOINT_DIR, entrypoint, loggers, runtime_env, tracking_env
from components.namespace_security import NamespaceSecurity
from components.network_mapping import NetworkMapping
from domain.preflight import STACK_LABEL, required_apis
from components.preflight import check_live_project
from components.project_apis import ProjectApis
from components.rdma_network import RdmaNetwork
from components.run_supervisor import RunSupervisor
from components.ray_training_cluster import RayTrainingCluster
from manifests import compute_class, nccl, supervisor
from manifests import staging as staging_manifests
from manifests.ray_cluster import token_secret
from manifests.network_mapping import NetworkNames
from domain.bucket import LOGS_DIR, MOUNT_PATH, ray_writable_prefixes, run_checkpoint_dir
from domain.pricing import run_cost, run_estimate_line
from domain.run_memory import merge_memory_bytes
from domain.names import stack_names, stack_slug
from domain.staged import model_dir_for
from access.fabric import fabric_runtime_env
from verl_gke.image_pins import stack_charts
from workloads.export_model import model_path
from workloads.run_record import record_name
from workloads.run_supervisor import CAPACITY_TIMEOUT_S

cfg, modeled = from_pulumi()
live = check_live_project(cfg)
# Each chart the stack installs, fetched and checked against its pinned sha256 before anything is created.
check_charts(stack_charts(cfg))
# Before anything is created: what the stack costs per hour, by capacity kind, and the run's estimate.
for cost in cfg.hourly_costs:
    pulumi.log.info(f"price per hour, GPU nodes on {cost.line()}")
pulumi.log.info(f"run estimate: {run_estimate_line(cfg.hourly_usd, cfg.run_budget_h, cfg.price_unknown or '')}")
facts = cfg.facts
a4x = cfg.platform == "a4x"
builds_infra = not cfg.existing_cluster
names = stack_names(cfg, pulumi.get_stack())
networks = NetworkNames(names.gvnic_prefix, names.rdma_prefix, cfg.rdma_nics) if cfg.rdma_nics else None

apis = ProjectApis("apis", {"project": cfg.project, "services": required_apis(cfg)}) if cfg.enable_apis else None
gcp_ready = pulumi.ResourceOptions(depends_on=apis.services if apis else [])

rdma = None
if networks and builds_infra:
    rdma = RdmaNetwork("rdma", {
        "project": cfg.project, "region": cfg.region, "zone": cfg.zone, "names": networks,
        "gvnic_cidr": cfg.gvnic_subnet_cidr, "rdma_cidrs": cfg.rdma_subnet_cidrs,
    }, gcp_ready)

vpc = None
if builds_infra and not cfg.cluster_network:
    vpc = ClusterNetwork("vpc", {
        "project": cfg.project, "region": cfg.region, "network": names.network, "subnet": names.subnet,
        "node_cidr": cfg.node_subnet_cidr, "pod_cidr": cfg.pod_cidr, "service_cidr": cfg.service_cidr,
    }, gcp_ready)

# Private nodes pull images from outside Google (Docker Hub, quay.io, nvcr.io) and the model through
# it. GKE itself needs none of it (private clusters reach Google's APIs and registries by Private
# Google Access, on the cluster's subnet): the GPU pool and the storage (which every pod of the
# stack waits for) wait for it, the cluster does not.
network = vpc.network if vpc else cfg.cluster_network or None
nat = None
if builds_infra and cfg.private_nodes and cfg.cloud_nat:
    nat = CloudNat("nat", {"project": cfg.project, "region": cfg.region, "network": network,
                           "router": names.router, "nat": names.nat}, gcp_ready)
egress: list[pulumi.Resource] = [nat] if nat else []

# GKE-created GPU nodes hold NICs in the RDMA subnets: the cluster goes before them on destroy.
cluster = GkeCluster("gke", {
    "project": cfg.project, "name": cfg.cluster_name, "location": cfg.cluster_location,
    "mode": cfg.cluster_mode, "release_channel": cfg.release_channel,
    "deletion_protection": cfg.deletion_protection, "min_master_version": live.gke_version,
    "ray_operator": cfg.ray_operator == "addon", "cpu_machine_type": cfg.cpu_machine_type,
    "cpu_min_nodes": cfg.cpu_min_nodes, "cpu_max_nodes": cfg.cpu_max_nodes,
    "existing": cfg.existing_cluster, "master_authorized_cidrs": cfg.master_authorized_cidrs,
    "control_plane_endpoint": cfg.control_plane_endpoint,
    "upgrade_exclusion_start": cfg.upgrade_exclusion_start, "gpu_metrics": cfg.gpu_metrics,
    "binary_authorization": cfg.binary_authorization,
    "dedicated_node_service_account": cfg.dedicated_node_service_account, "private_nodes": cfg.private_nodes,
    # The NVIDIA DRA driver 25.3 still speaks resource.k8s.io/v1beta1 (Cluster Toolkit gke-a4x).
    "k8s_beta_apis": DRA_V1BETA1_APIS if a4x else [],
    "network": network, "subnetwork": vpc.subnet if vpc else None,
    "resource_labels": {STACK_LABEL: stack_slug(pulumi.get_stack())}, "node_account_id": names.node_account_id,
    "pods_range": PODS_RANGE, "services_range": SERVICES_RANGE,
}, gcp_ready.merge(pulumi.ResourceOptions(depends_on=[rdma] if rdma else [])))
k8s = pulumi.ResourceOptions(providers=[cluster.provider])

# One capacity kind: one pool (Autopilot: GKE's Performance class). Several, or a reservation or flex-start
# on Autopilot: a custom ComputeClass tries them in order (Standard: one pool per kind, named by the class).
kinds = list(cfg.capacity_kinds)
ordered = len(kinds) > 1 or (cfg.autopilot and kinds[0] in ("reservation", "flex-start"))
gpu_class = compute_class.GPU_CLASS_NAME if ordered and builds_infra else None
gpu_pools: list[GpuNodePool] = []
if not cfg.autopilot and builds_infra:
    for kind in kinds:
        gpu_pools.append(GpuNodePool("gpu" if not gpu_class else f"gpu-{kind}", {
            "project": cfg.project, "cluster": cluster.name, "location": cfg.cluster_location,
            "zone": cfg.zone, "platform": cfg.platform,
            "reservation": cfg.reservation if kind == "reservation" else None,
            "nodes": cfg.gpu_nodes, "max_nodes": cfg.gpu_max_nodes, "spot": kind == "spot", "capacity": kind,
            "compute_class": gpu_class, **({"pool_name": compute_class.pool_name(kind)} if gpu_class else {}),
            "accelerator_topology": facts.accelerator_topology,
            # DRANET: GKE attaches the A4X NICs itself; otherwise the gVNIC + RDMA subnets.
            "additional_node_networks": rdma.node_networks if rdma else None,
            "accelerator_network_profile": "auto" if a4x and not rdma else None,
            "service_account": cluster.node_service_account, "image_streaming": cfg.image_streaming,
        }, pulumi.ResourceOptions(depends_on=[*cluster.node_identity, *egress])))
gpu_ready: list[pulumi.Resource] = [*gpu_pools, *([rdma] if rdma else [])]
if gpu_class:
    class_manifest = compute_class.compute_class(
        kinds=kinds, autopilot=cfg.autopilot, machine_type=facts.machine_type, accelerator=facts.accelerator,
        gpus_per_node=facts.gpus_per_node, reservation=cfg.reservation, project=cfg.project)
    gpu_ready.append(GpuComputeClass("gpu-capacity", {"manifest": class_manifest},
                                     k8s.merge(pulumi.ResourceOptions(depends_on=gpu_pools))))

# wandb's API key: from the user's Secret Manager secret through staging to the Ray containers (domain/wandb_key.py).
wandb = wandb_key.secret_to_copy(cfg.project, cfg.wandb_api_key_secret, loggers(cfg.verl))
storage = GcsFuseStorage("storage", {
    "project": cfg.project, "region": cfg.region,
    "bucket_name": names.bucket, "force_destroy": cfg.bucket_force_destroy,
    "namespace": cfg.namespace, "service_account": names.service_account,
    "staging_service_account": names.staging_service_account,
    "ray_writable_prefixes": ray_writable_prefixes(cfg.verl.get(CHECKPOINT_DIR)),
    "hf_token_secret_id": hf_token.secret_id(pulumi.get_stack()),
    "wandb_key_secret_id": cfg.wandb_api_key_secret if wandb else None,
    "capacity": cfg.volume_capacity, "labels": {"stack": label_value(pulumi.get_stack())},
    "k8s_provider": cluster.provider,
}, gcp_ready.merge(pulumi.ResourceOptions(depends_on=egress)))

# Before any pod of the namespace: what it admits (Pod Security) and what its pods may reach.
guard = NamespaceSecurity("namespace", {
    "namespace": cfg.namespace, "ray_cluster": cfg.ray_cluster_name, "staging_labels": staging_manifests.LABELS,
    "supervisor_labels": supervisor.LABELS if cfg.run_supervisor else None,
    "kuberay_operator": cfg.ray_operator == "helm", "network_policies": cfg.ray_network_policy,
    "staging_writes_secret": wandb is not None,
    "ray_servers": [cfg.mlflow_tracking_uri] if "mlflow" in loggers(cfg.verl) else [],
}, k8s.merge(pulumi.ResourceOptions(depends_on=[storage])))

# Staging runs on a CPU node while the GPU pool is still being created.
staging = DataStaging("staging", {
    "namespace": cfg.namespace, "service_account": names.staging_service_account, "claim_name": storage.claim_name,
    "model_repo": cfg.model,
    "model_revision": cfg.model_revision, "model_dir": model_dir_for(cfg.model),
    "dataset_repo": cfg.dataset, "dataset_revision": cfg.dataset_revision,
    "timeout_minutes": cfg.staging_timeout_minutes,
    "verl": cfg.staged_verl, "hf_token_secret": hf_token.secret_name(cfg.project, pulumi.get_stack()),
    "wandb_key_secret": wandb, "user_data": user_data.gs_copies(cfg.data_dir), "bucket": names.bucket,
}, k8s.merge(pulumi.ResourceOptions(depends_on=[storage, guard])))

installer_url = cfg.nccl_installer_url or nccl.google_installer_url(facts, cfg.cluster_mode)
# No RDMA (G2): NCCL runs over TCP, nothing to map or install.
mapping = NetworkMapping("network", {"platform": facts, "networks": networks, "nccl_installer_url": installer_url},
                         k8s.merge(pulumi.ResourceOptions(depends_on=gpu_ready))) \
    if networks or installer_url or facts.nccl_installer_image else None
fabric_set_up: list[pulumi.Resource] = [mapping] if mapping else gpu_ready

ray_waits_for: list[pulumi.Resource] = [storage, guard, *fabric_set_up, *gpu_ready]
image_mirror: str | None = None
if cfg.image_mirror and is_docker_hub(cfg.verl_image):
    # The nodes pull (and GKE streams) the image from the stack's remote repository of Docker Hub.
    repository = repository_id(cfg.cluster_name)
    node_account = cluster.node_service_account or storage.project_number.apply(
        lambda n: f"{n}-compute@developer.gserviceaccount.com")
    ray_waits_for.append(ImageMirror("images", {
        "project": cfg.project, "region": cfg.region, "repository_id": repository,
        "reader": pulumi.Output.concat("serviceAccount:", node_account),
    }, gcp_ready))
    image_mirror = registry_prefix(cfg.region, cfg.project, repository)
if a4x:
    # The DRA driver, its claim template and the ComputeDomain need no GPU node: they install while
    # the GPU pool is created (the driver's kubelet plugin starts on each GB200 node as it joins).
    # The namespaced objects go in the Ray namespace, which storage creates.
    ray_waits_for.append(A4xDra("dra", {
        "namespace": cfg.namespace, "gpu_nodes": cfg.gpu_nodes, "nic_claims": networks is None,
    }, k8s.merge(pulumi.ResourceOptions(depends_on=[storage]))))

ray = RayTrainingCluster("ray", {
    "platform": cfg.platform, "mode": cfg.cluster_mode, "gpu_nodes": cfg.gpu_nodes,
    "namespace": cfg.namespace, "service_account": names.service_account,
    "claim": storage.claim, "name": cfg.ray_cluster_name,
    # A tag is pinned by digest at the first `pulumi up` (resolved on Docker Hub, pulled through the mirror).
    "image": cfg.verl_image, "image_mirror": image_mirror,
    "worker_cpus": cfg.worker_cpus, "worker_memory_gi": cfg.worker_memory_gi,
    "worker_spot": cfg.gpu_spot and cfg.autopilot, "compute_class": gpu_class, "nic_claims": a4x and networks is None,
    "verl_dir": cfg.verl_dir, "ray_version": cfg.image_ray_version, "checkpoint_root": cfg.verl.get(CHECKPOINT_DIR),
    "bucket": names.bucket,
    "install_kuberay": cfg.ray_operator == "helm", "operator_depends_on": [storage],
    "network_policy": cfg.ray_network_policy, "dashboard_cidrs": list(cfg.ray_dashboard_cidrs),
    "job_api_clients": supervisor.LABELS if cfg.run_supervisor else None,
    "wandb_key": wandb is not None,
}, k8s.merge(pulumi.ResourceOptions(depends_on=ray_waits_for)))

run_id, legacy_trainer = stack_run(cfg)
entry = entrypoint(cfg.verl, run_id=run_id, legacy_trainer=legacy_trainer)
checkpoint_dir = run_checkpoint_dir(cfg.verl.get(CHECKPOINT_DIR), run_id)
job_env = runtime_env(facts, nnodes=cfg.gpu_nodes, worker_cpus=cfg.worker_cpus, verl_dir=cfg.verl_dir,
                      tracking=tracking_env(cfg.verl, run_checkpoint_dir=checkpoint_dir,
                                            mlflow_tracking_uri=cfg.mlflow_tracking_uri))
job_waits_for: list[pulumi.Resource] = [ray, staging]
if cfg.data_dir or cfg.reward_function:
    job_waits_for.append(UserData("data", uploads(cfg.data_dir, cfg.reward_function), storage.bucket_name, gcp_ready))
if cfg.run_supervisor:
    # Restarted with a new run's spec before the job provider submits it.
    job_waits_for.append(RunSupervisor("supervisor", {
        "namespace": cfg.namespace, "ray_cluster": cfg.ray_cluster_name,
        "ray_token_secret": token_secret(cfg.ray_cluster_name, cfg.image_ray_version),
        "config": {
            "submission_ids": submission_ids(pulumi.get_stack(), entry, job_env, cfg.job_attempt, cfg.supervised_attempts + 1),
            "run_id": run_id, "generation": cfg.job_attempt,
            "entrypoint": entry, "runtime_env": job_env, "expected_workers": cfg.gpu_nodes,
            "expected_gpus": cfg.gpu_nodes * facts.gpus_per_node, "max_retries": cfg.run_max_retries,
            "max_preemptions": cfg.run_max_preemptions, "backoff_s": cfg.run_retry_backoff_seconds,
            "budget_s": cfg.run_budget_s, "release_workers": cfg.release_workers_when_done,
            "capacity_timeout_s": max(CAPACITY_TIMEOUT_S, cfg.job_ready_timeout_seconds),
            "head_outage_s": cfg.run_head_outage_seconds, "stall_s": cfg.run_stall_seconds,
            "replace_window_s": cfg.run_replace_window_seconds,
            # Each attempt's driver log and the decisions, copied into logs/<run id>/ (workloads/run_logs.py).
            "log_bucket": names.bucket,
            # Merged on a node with the memory (a GPU worker for 32B), before the workers are released.
            # Claimed and published through the bucket's JSON API (workloads/export_model.py).
            "export": {"checkpoint_dir": checkpoint_dir, "mount": MOUNT_PATH, "bucket": names.bucket,
                       "memory_bytes": merge_memory_bytes(cfg.model), "verl_dir": cfg.verl_dir}
            if cfg.export_model else None,
        },
        "log_writer": {"bucket": storage.bucket_name, "project": cfg.project, "project_number": storage.project_number},
    # It waits for a head that does not answer yet (workloads/run_supervisor.run_forever), so it
    # need not wait for the RayCluster's pods: it starts with them, once the GPU nodes are set up.
    }, k8s.merge(pulumi.ResourceOptions(depends_on=[storage, guard, *fabric_set_up]))))

job = GrpoJob("grpo", {
    "entrypoint": entry, "runtime_env": job_env,
    "dashboard_url": cfg.job_dashboard_url or None,
    "cluster_endpoint": cluster.endpoint, "cluster_ca_certificate": cluster.ca_certificate,
    "cluster_name": cluster.name, "namespace": cfg.namespace, "head_service": ray.head_service,
    "stack": pulumi.get_stack(), "ready_timeout_s": cfg.job_ready_timeout_seconds,
    "wait_for_completion": cfg.job_wait_for_completion, "attempt": cfg.job_attempt,
    "startup_grace_s": cfg.job_startup_grace_seconds, "outage_window_s": cfg.job_outage_window_seconds,
    "expected_workers": cfg.gpu_nodes, "expected_gpus": cfg.gpu_nodes * facts.gpus_per_node,
    "fabric_check": cfg.fabric_check, "fabric_min_busbw_gbps": cfg.fabric_floor_gbps,
    "fabric_runtime_env": fabric_runtime_env(facts), "fabric_transports": list(facts.fabric_transports),
    "budget_s": cfg.run_budget_s, "supervised_attempts": cfg.supervised_attempts,
    "run_id": run_id, "run_record": supervisor.run_record_name(cfg.ray_cluster_name),
}, pulumi.ResourceOptions(depends_on=job_waits_for,
                          # Their replacement deletes the workers: the run is stopped first, then resubmitted.
                          replace_with=[*([cluster.cluster] if cluster.cluster else []),
                                        *(pool.node_pool for pool in gpu_pools), ray.ray_cluster]))

checkpoint_path = checkpoint_dir.removeprefix(f"{MOUNT_PATH}/")
pulumi.export("clusterName", cluster.name)
pulumi.export("clusterLocation", cluster.location)
pulumi.export("clusterEndpoint", cluster.endpoint)
pulumi.export("clusterCaCertificate", cluster.ca_certificate)
pulumi.export("kubeconfig", cluster.kubeconfig)
pulumi.export("namespace", cfg.namespace)
pulumi.export("bucketName", storage.bucket_name)
pulumi.export("bucketUrl", storage.bucket_url)
pulumi.export("hfTokenSecret", storage.hf_token_secret)
pulumi.export("rayClusterName", ray.name)
pulumi.export("rayHeadService", ray.head_service)
pulumi.export("dashboardCommand", job.dashboard_command)
# The run is the handle that survives retries; grpoSubmissionId (kept for compatibility) is the Ray id of
# the attempt Pulumi last saw: the first at `up`, the newest after a refresh.
pulumi.export("runId", run_id)
pulumi.export("runRecord", record_name(cfg.ray_cluster_name, run_id))
pulumi.export("runLogsUri", storage.bucket_name.apply(lambda b: f"gs://{b}/{LOGS_DIR}/{run_id}/"))
pulumi.export("grpoSubmissionId", job.submission_id)
pulumi.export("grpoJobStatus", job.status)
pulumi.export("checkpointUri", storage.bucket_name.apply(lambda b: f"gs://{b}/{checkpoint_path}"))
# The run supervisor's export writes it once the run succeeded (workloads/run_supervisor.py, verl's
# merger); empty until the run record says the export SUCCEEDED (seen at `pulumi up` or refresh).
pulumi.export("modelUri", pulumi.Output.all(storage.bucket_name, job.export_outcome).apply(
    lambda a: f"gs://{a[0]}/{model_path(run_id)}" if a[1] == "SUCCEEDED" else ""))
pulumi.export("hourlyCostUsd", cfg.hourly_usd)
pulumi.export("estimatedRunCostUsd", run_cost(cfg.run_budget_h, cfg.hourly_usd))
# What `verl-gke runs --step-times` and `metrics` hold the measured step against (domain/run_time.py).
# To a tenth of a second: a model's figure, not a measurement.
# The model's own step, never a measured one (measured/<stack>.json): the figure a measured step is held against.
pulumi.export("modeledStepSeconds", round(modeled.modeled_step_s, 1) if modeled else None)
pulumi.export("modeledRunSeconds", round(modeled.run_s, 1) if modeled and modeled.run_s is not None else None)
# verl's own start-up after the job runs (model load, vLLM, first sync, first validation): `report` holds it.
pulumi.export("modeledVerlStartupSeconds", round(modeled.startup_s, 1) if modeled else None)
pulumi.export("gpuPlatform", cfg.platform)
pulumi.export("gpuNodes", cfg.gpu_nodes)
pulumi.export("gpusPerNode", facts.gpus_per_node)
pulumi.export("fabricBusBandwidthGbps", job.fabric_busbw_gbps)
pulumi.export("preflightChecks", live.checks)
