"""Each stack's whole composition under the mock engine: what it creates, in which order, that
every Kubernetes object it defines passes its schema, and that the token stays secret."""

from __future__ import annotations

import json
import re
from pathlib import Path
from collections import Counter

import pytest

from manifests import supervisor

from domain.config import load_config
from domain.deploy_timing import is_gpu_pool
from domain.stack_run import stack_run
from tests.conftest import STACKS
from tests.k8s_schema import validate_core, validate_custom
from verl_gke import synth
from domain.stack_files import raw_config

CUSTOM_KINDS = {"RayCluster", "ComputeDomain", "ComputeClass"}
# GKE's own CRDs: no schema ships with this repo or kubernetes-validate.
UNCHECKED_KINDS = {"GKENetworkParamSet", "Network"}

EXPECTED_COUNTS = {
    # stack: (networks, subnets, node pools, GKENetworkParamSets, helm releases, ComputeDomains);
    # the cluster's own VPC and subnet count in each.
    "a4": (3, 10, 0, 9, 0, 0),
    "a4-standard": (3, 10, 2, 9, 0, 0),
    "a3u-standard": (3, 10, 2, 9, 0, 0),
    "a4x": (1, 1, 2, 0, 2, 1),
    # No RDMA: the cluster's VPC and subnet only; the CPU pool and a GPU pool per capacity kind (Spot, on demand).
    "smoke": (1, 1, 3, 0, 0, 0),
}


def _counts(result: synth.SynthResult) -> tuple[int, ...]:
    types = Counter(r.type for r in result.registrations)
    return (types["gcp:compute/network:Network"], types["gcp:compute/subnetwork:Subnetwork"],
            types["gcp:container/nodePool:NodePool"], types["kubernetes:networking.gke.io/v1:GKENetworkParamSet"],
            types["kubernetes:helm.sh/v3:Release"], types["kubernetes:resource.nvidia.com/v1beta1:ComputeDomain"])


def _by_type(result: synth.SynthResult, type_: str) -> list[synth.Registration]:
    return [r for r in result.registrations if r.type == type_]


@pytest.mark.parametrize("stack", STACKS)
def test_resource_counts(stack: str, synth_stack):
    result = synth_stack(stack)
    assert _counts(result) == EXPECTED_COUNTS[stack]
    for type_ in ("gcp:container/cluster:Cluster", "gcp:storage/bucket:Bucket", "kubernetes:ray.io/v1:RayCluster",
                  "kubernetes:batch/v1:Job", "pulumi-python:dynamic:GrpoJob", "pulumi:providers:kubernetes"):
        assert len(_by_type(result, type_)) == 1, type_


@pytest.mark.parametrize("stack", STACKS)
def test_every_kubernetes_object_goes_through_the_one_provider(stack: str, synth_stack):
    result = synth_stack(stack)
    (provider,) = _by_type(result, "pulumi:providers:kubernetes")
    for r in result.registrations:
        if r.type.startswith("kubernetes:") and r.custom and r.type != provider.type:
            assert r.provider == provider.urn, r.urn


@pytest.mark.parametrize("stack", STACKS)
def test_job_waits_for_ray_and_staging_and_ray_for_gpus(stack: str, synth_stack):
    result = synth_stack(stack)
    (job,) = _by_type(result, "pulumi-python:dynamic:GrpoJob")
    (ray,) = _by_type(result, "kubernetes:ray.io/v1:RayCluster")
    (staging,) = _by_type(result, "kubernetes:batch/v1:Job")
    assert ray.urn in job.dependencies and staging.urn in job.dependencies
    gpu_pools = [r.urn for r in _by_type(result, "gcp:container/nodePool:NodePool") if "gpu" in r.name]
    assert set(gpu_pools) <= set(ray.dependencies)
    # Staging never waits for GPU nodes: it runs while they are created.
    assert not set(gpu_pools) & set(staging.dependencies)


@pytest.mark.parametrize("stack", STACKS)
def test_every_manifest_passes_its_schema(stack: str, synth_stack):
    cfg = load_config(raw_config(stack)[0])
    checked = 0
    for obj in synth_stack(stack).manifests():
        if obj["kind"] in CUSTOM_KINDS:
            validate_custom(obj)
        elif obj["kind"] not in UNCHECKED_KINDS:
            validate_core(obj, cfg.kubernetes_minor)
        checked += obj["kind"] not in UNCHECKED_KINDS
    assert checked >= 7


@pytest.mark.parametrize("stack", STACKS)
def test_job_outputs_and_checkpoint_uri(stack: str, synth_stack):
    outputs = synth_stack(stack).outputs
    assert outputs["kubeconfig"] == "[secret]"
    run_id, _ = stack_run(load_config(raw_config(stack)[0]))
    assert re.fullmatch(r"run-[0-9a-f]{12}", run_id)
    assert outputs["checkpointUri"] == f"gs://{outputs['bucketName']}/verl/checkpoints/{run_id}"
    assert outputs["rayHeadService"] == f"{outputs['rayClusterName']}-head-svc"
    assert re.fullmatch(rf"verl-grpo-{stack}-[0-9a-f]{{12}}", outputs["grpoSubmissionId"])
    assert outputs["grpoJobStatus"] == "[unknown]"
    assert outputs["dashboardCommand"] == f"verl-gke dashboard --stack {stack}"


@pytest.mark.parametrize("stack", STACKS)
def test_the_token_has_no_path_through_pulumi(stack: str, synth_stack):
    """The canary of the token path: no Kubernetes Secret, no token env, only the empty Secret Manager
    secret that the staging identity alone may read, named to the Job by resource name."""
    result = synth_stack(stack)
    assert not [m for m in result.manifests() if m["kind"] == "Secret"]
    containers = [c for m in result.manifests() for t in _pod_templates(m) for c in t["spec"]["containers"]]
    assert containers and not [e for c in containers for e in c.get("env", []) if e["name"] == "HF_TOKEN"]
    assert "[secret]" not in json.dumps(result.manifests())
    (secret,) = [r for r in result.registrations if r.type == "gcp:secretmanager/secret:Secret"]
    assert secret.inputs["secretId"] == f"verl-gke-{stack}-hf-token"
    assert not [r for r in result.registrations if r.type == "gcp:secretmanager/secretVersion:SecretVersion"]
    (access,) = [r for r in result.registrations if r.type == "gcp:secretmanager/secretIamMember:SecretIamMember"]
    grants = {r.inputs["role"]: r.inputs["member"] for r in result.registrations
              if r.type == "gcp:storage/bucketIAMMember:BucketIAMMember"}
    # The staging identity (which writes the bucket), never the Ray pods' (which read it).
    assert (access.inputs["role"], access.inputs["member"]) == ("roles/secretmanager.secretAccessor",
                                                                grants["roles/storage.objectUser"])
    assert access.inputs["member"] != grants["roles/storage.objectViewer"]
    (job,) = [m for m in result.manifests() if m["kind"] == "Job" and m["metadata"]["name"] == "stage-data"]
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    project = result.outputs["hfTokenSecret"].split("/")[1]
    assert command[-2:] == ["--hf-token-secret", f"projects/{project}/secrets/verl-gke-{stack}-hf-token"]
    assert result.outputs["hfTokenSecret"] == command[-1]
    assert "verl-gke:hfToken" not in result.placeholders


def test_a_token_left_in_stack_config_is_refused_in_every_form_without_being_printed():
    token = "hf_NotARealTokenButSecret42"
    with pytest.raises(Exception) as caught:
        synth.run("a4-standard", overrides={"verl-gke:hfToken": token})
    text = str(caught.value)
    assert "verl-gke:hfToken: no longer read" in text
    import base64
    for form in (token, base64.b64encode(token.encode()).decode(), json.dumps(token)[1:-1]):
        assert form not in text


def test_existing_cluster_creates_no_infrastructure():
    result = synth.run("a4-standard", overrides={"verl-gke:existingCluster": "true"})
    types = {r.type for r in result.registrations}
    assert not {t for t in types if t.startswith(("gcp:compute/", "gcp:container/"))}
    assert "kubernetes:ray.io/v1:RayCluster" in types and "pulumi-python:dynamic:GrpoJob" in types


def test_autopilot_cluster_goes_before_the_rdma_subnets_on_destroy(synth_stack):
    result = synth_stack("a4")
    (cluster,) = _by_type(result, "gcp:container/cluster:Cluster")
    subnets = {r.urn for r in _by_type(result, "gcp:compute/subnetwork:Subnetwork")}
    assert len(subnets) == 10 and subnets <= set(cluster.dependencies)


def test_standard_spot_pool_without_reservation():
    result = synth.run("a4-standard", overrides={"verl-gke:gpuSpot": "true", "verl-gke:reservation": ""})
    (pool,) = [r for r in _by_type(result, "gcp:container/nodePool:NodePool") if r.name == "gpu-pool"]
    assert pool.inputs["nodeConfig"]["spot"] is True
    assert pool.inputs["nodeConfig"]["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
    assert "verl-gke:reservation" not in result.placeholders


def test_a_new_job_attempt_is_a_new_submission_and_cidrs_reach_the_control_plane(synth_stack):
    base = synth_stack("a4-standard")
    retry = synth.run("a4-standard", overrides={"verl-gke:jobAttempt": "1",
                                                "verl-gke:masterAuthorizedCidrs": '["10.8.0.0/16"]'})
    assert retry.outputs["grpoSubmissionId"] != base.outputs["grpoSubmissionId"]
    (cluster,) = _by_type(retry, "gcp:container/cluster:Cluster")
    assert cluster.inputs["masterAuthorizedNetworksConfig"] == {
        "cidrBlocks": [{"cidrBlock": "10.8.0.0/16", "displayName": "authorized-0"}], "gcpPublicCidrsAccessEnabled": False}
    # By default the IP endpoint admits no outside address (the DNS endpoint is the way in).
    (default_cluster,) = _by_type(base, "gcp:container/cluster:Cluster")
    assert default_cluster.inputs["masterAuthorizedNetworksConfig"] == {"cidrBlocks": [], "gcpPublicCidrsAccessEnabled": False}


def _pod_templates(obj: dict) -> list[dict]:
    """Every pod template of a manifest (Job, RayCluster head and workers)."""
    spec = obj.get("spec", {})
    if obj["kind"] == "RayCluster":
        return [spec["headGroupSpec"]["template"], *(g["template"] for g in spec["workerGroupSpecs"])]
    return [spec["template"]] if "template" in spec else []


@pytest.mark.parametrize("stack", STACKS)
def test_bucket_pods_have_a_bounded_sidecar_cache_and_no_api_token(stack: str, synth_stack):
    result = synth_stack(stack)
    autopilot = load_config(raw_config(stack)[0]).autopilot
    pods = [t for obj in result.manifests() for t in _pod_templates(obj)
            if any("persistentVolumeClaim" in v for v in t["spec"].get("volumes", []))]
    assert len(pods) == 3  # staging, Ray head, Ray workers
    for template in pods:
        annotations, spec = template["metadata"]["annotations"], template["spec"]
        assert {"name": "gke-gcsfuse-cache", "emptyDir": {"sizeLimit": "220Gi"}} in spec["volumes"]
        assert annotations["gke-gcsfuse/ephemeral-storage-limit"] in ("0", "10Gi", "100Gi")
        assert ("gke-gcsfuse/memory-limit" in annotations and "gke-gcsfuse/cpu-limit" in annotations)
        assert spec["automountServiceAccountToken"] is False
        if autopilot:
            assert "0" not in {v for k, v in annotations.items() if k.endswith("-limit")}


@pytest.mark.parametrize("stack", STACKS)
def test_nodes_are_private_behind_the_stacks_cloud_nat(stack: str, synth_stack):
    result = synth_stack(stack)
    cfg = load_config(raw_config(stack)[0])
    (cluster,) = _by_type(result, "gcp:container/cluster:Cluster")
    assert cluster.inputs["privateClusterConfig"] == {"enablePrivateNodes": True, "enablePrivateEndpoint": False}
    (router,) = _by_type(result, "gcp:compute/router:Router")
    (nat,) = _by_type(result, "gcp:compute/routerNat:RouterNat")
    (vpc,) = [r for r in _by_type(result, "gcp:compute/network:Network") if r.inputs["name"] == f"verl-{stack}-net"]
    # On the stack's own VPC, never the project's `default` network.
    assert router.inputs["region"] == cfg.region and vpc.urn in router.dependencies
    assert router.inputs["network"] != "default" and cluster.inputs["network"] == router.inputs["network"]
    assert nat.inputs["router"] == f"verl-{stack}-router"
    assert nat.inputs["natIpAllocateOption"] == "AUTO_ONLY"
    assert nat.inputs["sourceSubnetworkIpRangesToNat"] == "ALL_SUBNETWORKS_ALL_IP_RANGES"
    # Sized for image and model pulls: Cloud NAT's dynamic port allocation from 4096 ports per VM.
    assert (nat.inputs["enableDynamicPortAllocation"], nat.inputs["enableEndpointIndependentMapping"],
            nat.inputs["minPortsPerVm"], nat.inputs["maxPortsPerVm"]) == (True, False, 4096, 65536)
    # GKE reaches Google's APIs and registries without it (Private Google Access), so the cluster
    # does not wait for it; the GPU nodes and whatever pulls from outside Google do.
    assert nat.urn not in cluster.dependencies
    deps = {r.urn: set(r.dependencies) for r in result.registrations}

    def waits_for_nat(urn: str, seen: set[str]) -> bool:
        if nat.urn in deps.get(urn, ()):
            return True
        seen.add(urn)
        return any(waits_for_nat(d, seen) for d in deps.get(urn, ()) - seen)

    waiting = {r.name for r in result.registrations if waits_for_nat(r.urn, set())}
    assert cluster.name not in waiting
    pulls = {"staging-job", "ray-ray-cluster", "supervisor-deployment"}
    pulls |= {r.name for r in result.registrations if is_gpu_pool(r.__dict__)}  # none on Autopilot
    pulls |= {"dra-driver", "ray-kuberay-operator"} if stack == "a4x" else set()
    assert pulls <= waiting


def test_private_nodes_and_nat_can_be_turned_off_each():
    public = synth.run("a4-standard", overrides={"verl-gke:privateNodes": "false"})
    (cluster,) = _by_type(public, "gcp:container/cluster:Cluster")
    assert "privateClusterConfig" not in cluster.inputs
    assert not _by_type(public, "gcp:compute/routerNat:RouterNat")
    own_nat = synth.run("a4-standard", overrides={"verl-gke:cloudNat": "false"})
    (cluster,) = _by_type(own_nat, "gcp:container/cluster:Cluster")
    assert cluster.inputs["privateClusterConfig"]["enablePrivateNodes"] is True
    assert not _by_type(own_nat, "gcp:compute/router:Router")


@pytest.mark.parametrize("stack", ["a4-standard", "a3u-standard", "a4x", "smoke"])
def test_gpu_pool_streams_images_unless_turned_off(stack: str, synth_stack):
    pools = [r for r in synth_stack(stack).registrations if is_gpu_pool(r.__dict__)]
    assert pools and all(pool.inputs["nodeConfig"]["gcfsConfig"] == {"enabled": True} for pool in pools)
    off = synth.run(stack, overrides={"verl-gke:imageStreaming": "false"})
    pools = [r for r in off.registrations if is_gpu_pool(r.__dict__)]
    assert pools and all(pool.inputs["nodeConfig"]["gcfsConfig"] == {"enabled": False} for pool in pools)


@pytest.mark.parametrize("stack", STACKS)
def test_job_waits_for_the_whole_cluster_and_measures_its_fabric_first(stack: str, synth_stack):
    cfg = load_config(raw_config(stack)[0])
    (job,) = _by_type(synth_stack(stack), "pulumi-python:dynamic:GrpoJob")
    assert (job.inputs["expected_workers"], job.inputs["expected_gpus"]) == (
        cfg.gpu_nodes, cfg.gpu_nodes * cfg.facts.gpus_per_node)
    assert (job.inputs["fabric_check"], job.inputs["fabric_min_busbw_gbps"]) == (True, cfg.facts.fabric_min_busbw_gbps)
    assert job.inputs["fabric_transports"] == list(cfg.facts.fabric_transports)
    env = job.inputs["fabric_runtime_env"]["env_vars"]
    assert env["NCCL_DEBUG"] == "INFO"
    # What verl adds for training: NCCL_CUMEM_ENABLE=0 with verl 0.6.1, nothing with 0.9.0.
    assert env.get("NCCL_CUMEM_ENABLE") == ("0" if cfg.facts.verl.version == "0.6.1" else None)
    outputs = synth_stack(stack).outputs
    assert outputs["fabricBusBandwidthGbps"] == "[unknown]"
    assert outputs["preflightChecks"] == []  # offline: nothing was checked against a live project


def test_fabric_floor_from_config_or_off():
    result = synth.run("a4-standard", overrides={"verl-gke:fabricMinBusBandwidthGbps": "250"})
    (job,) = _by_type(result, "pulumi-python:dynamic:GrpoJob")
    assert job.inputs["fabric_min_busbw_gbps"] == 250
    off = synth.run("a4-standard", overrides={"verl-gke:fabricCheck": "false"})
    (job,) = _by_type(off, "pulumi-python:dynamic:GrpoJob")
    assert job.inputs["fabric_check"] is False
    assert off.outputs["fabricBusBandwidthGbps"] is None


def _manifest(result: synth.SynthResult, kind: str, name: str) -> dict:
    (found,) = [m for m in result.manifests() if m["kind"] == kind and m["metadata"]["name"] == name]
    return found


@pytest.mark.parametrize("stack", STACKS)
def test_run_supervisor_gets_the_runs_ids_and_only_its_own_rights(stack: str, synth_stack):
    result = synth_stack(stack)
    cfg = load_config(raw_config(stack)[0])
    name = f"{cfg.ray_cluster_name}-supervisor"
    config = json.loads(_manifest(result, "ConfigMap", name)["data"]["config.json"])
    assert config["submission_ids"][0] == result.outputs["grpoSubmissionId"]
    assert len(set(config["submission_ids"])) == 1 + 2 + 10  # attempt 0, runMaxRetries, runMaxPreemptions
    assert config["head_url"] == f"http://{cfg.ray_cluster_name}-head-svc.{cfg.namespace}.svc.cluster.local:8265"
    assert (config["expected_workers"], config["expected_gpus"]) == (cfg.gpu_nodes, cfg.gpu_nodes * cfg.facts.gpus_per_node)
    assert _manifest(result, "Role", name)["rules"] == [
        {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "resourceNames": [cfg.ray_cluster_name],
         "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "create", "update", "delete"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "resourceNames": [f"{cfg.ray_cluster_name}-decider"], "verbs": ["get", "update"]},
    ]
    # Its ConfigMap writes are held to run records of this cluster, its Lease creates to its own Lease;
    # the Role is bound after both policies.
    records = _manifest(result, "ValidatingAdmissionPolicy", f"{cfg.namespace}.{name}-records")
    assert records["spec"]["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
         "operations": ["CREATE", "UPDATE", "DELETE"]},
        {"apiGroups": ["coordination.k8s.io"], "apiVersions": ["v1"], "resources": ["leases"],
         "operations": ["CREATE"]}]
    assert _manifest(result, "ValidatingAdmissionPolicyBinding", f"{cfg.namespace}.{name}-records")["spec"][
        "policyName"] == f"{cfg.namespace}.{name}-records"
    # Its RayCluster patches may change spec.suspend only.
    policy = _manifest(result, "ValidatingAdmissionPolicy", f"{cfg.namespace}.{name}")
    assert policy["spec"]["matchConditions"][0]["expression"] == (
        f"request.userInfo.username == 'system:serviceaccount:{cfg.namespace}:{name}'")
    assert _manifest(result, "ValidatingAdmissionPolicyBinding", f"{cfg.namespace}.{name}")["spec"][
        "validationActions"] == ["Deny"]
    bindings = [r for r in _by_type(result, "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding")
                if r.inputs["metadata"]["name"] in (f"{cfg.namespace}.{name}", f"{cfg.namespace}.{name}-records")]
    (role_binding,) = _by_type(result, "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
    assert len(bindings) == 2 and all(b.urn in role_binding.dependencies for b in bindings)
    assert config["run_id"] == stack_run(cfg)[0] and config["generation"] == 0
    (job,) = _by_type(result, "pulumi-python:dynamic:GrpoJob")
    assert (job.inputs["run_id"], job.inputs["run_record"]) == (config["run_id"], f"{cfg.ray_cluster_name}-run")
    pod = _manifest(result, "Deployment", name)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == name and pod["automountServiceAccountToken"] is True
    assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "cloud.google.com/gke-accelerator", "operator": "DoesNotExist"}]}]
    policy = _manifest(result, "NetworkPolicy", f"{cfg.ray_cluster_name}-ingress")
    assert {"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "verl-gke",
                                                        "app.kubernetes.io/component": "run-supervisor"}}}],
            "ports": [{"protocol": "TCP", "port": 8265}]} in policy["spec"]["ingress"]
    deployment = [r for r in result.registrations if r.type == "kubernetes:apps/v1:Deployment"]
    assert deployment[0].urn in job.dependencies
    assert job.inputs["supervised_attempts"] == 12 and job.inputs["budget_s"] == 0
    # The model export (exportModel, on by default): the run's checkpoints, merged on a node with the
    # memory for twice the fp32 shards; the program goes with the supervisor's own.
    assert config["export"] == {"checkpoint_dir": f"/data/verl/checkpoints/{config['run_id']}", "mount": "/data",
                                "bucket": config["log_bucket"],
                                "memory_bytes": {"Qwen/Qwen2.5-0.5B-Instruct": 3_951_689_728}.get(
                                    cfg.model, 262_102_056_960), "verl_dir": cfg.verl_dir}
    program = _manifest(result, "ConfigMap", name)["data"]
    assert all(program[f] == Path(f"workloads/{f}").read_text() for f in supervisor.PROGRAM_FILES)
    # The run's decider's bounds (runHeadOutageSeconds, runStallSeconds, runReplaceWindowSeconds).
    assert (config["head_outage_s"], config["stall_s"], config["replace_window_s"]) == (1800, 10800, 600)


def test_export_model_off_leaves_the_supervisor_no_export():
    result = synth.run("a4-standard", overrides={"verl-gke:exportModel": False})
    config = json.loads(_manifest(result, "ConfigMap", "b200-ray-cluster-supervisor")["data"]["config.json"])
    assert config["export"] is None


@pytest.mark.parametrize(("ready_timeout_s", "capacity_timeout_s"), [
    (1800, 7200.0),  # the default: 2 h for a whole cluster before the next attempt
    (10_000, 10_000),  # never shorter than `pulumi up` itself waits for one
])
def test_the_supervisor_waits_for_a_whole_cluster_at_least_as_long_as_create_does(
        ready_timeout_s: int, capacity_timeout_s: float):
    result = synth.run("a4-standard", overrides={"verl-gke:jobReadyTimeoutSeconds": ready_timeout_s})
    config = json.loads(_manifest(result, "ConfigMap", "b200-ray-cluster-supervisor")["data"]["config.json"])
    assert config["capacity_timeout_s"] == capacity_timeout_s


def test_pulumi_never_sets_the_release_and_takes_back_what_an_older_supervisor_owned():
    """The supervisor's only write is spec.suspend, which the program never sets: no field to
    ignore. The apply is forced so that a cluster 0.3.0's supervisor released (its worker group list,
    owned by that supervisor's field manager) is applied again instead of conflicting."""
    from tests.mock_run import OptionsMonitor

    for supervised in ("true", "false"):
        monitor = OptionsMonitor(synth.SynthMocks())
        result = synth.run("a4-standard", overrides={"verl-gke:runSupervisor": supervised}, monitor=monitor)
        assert monitor.sent["ray-ray-cluster"].ignore_changes == []
        cluster = _manifest(result, "RayCluster", "b200-ray-cluster")
        assert "suspend" not in cluster["spec"]
        assert cluster["metadata"]["annotations"] == {"pulumi.com/patchForce": "true",
                                                      "pulumi.com/waitFor": "jsonpath={.status.state}"}


def test_without_the_supervisor_nothing_of_it_is_created():
    result = synth.run("a4-standard", overrides={"verl-gke:runSupervisor": "false"})
    assert not [m for m in result.manifests() if m["metadata"]["name"].endswith("-supervisor")]
    (job,) = _by_type(result, "pulumi-python:dynamic:GrpoJob")
    assert (job.inputs["supervised_attempts"], job.inputs["budget_s"]) == (0, 0)
    policy = [m for m in result.manifests() if m["kind"] == "NetworkPolicy"
              and m["metadata"]["name"].endswith("-ingress")][0]
    assert len(policy["spec"]["ingress"]) == 1
    assert "run-supervisor-egress" not in [m["metadata"]["name"] for m in result.manifests()]


@pytest.mark.parametrize("stack", STACKS)
def test_the_cluster_has_a_network_of_its_own_with_jumbo_mtu_and_planned_ranges(stack: str, synth_stack):
    result = synth_stack(stack)
    (cluster,) = _by_type(result, "gcp:container/cluster:Cluster")
    (vpc,) = [r for r in _by_type(result, "gcp:compute/network:Network") if r.inputs["name"] == f"verl-{stack}-net"]
    (subnet,) = [r for r in _by_type(result, "gcp:compute/subnetwork:Subnetwork")
                 if r.inputs["name"] == f"verl-{stack}-nodes"]
    assert (vpc.inputs["mtu"], vpc.inputs["autoCreateSubnetworks"]) == (8896, False)
    assert (subnet.inputs["ipCidrRange"], subnet.inputs["privateIpGoogleAccess"]) == ("10.0.0.0/20", True)
    assert subnet.inputs["secondaryIpRanges"] == [{"rangeName": "pods", "ipCidrRange": "10.4.0.0/14"},
                                                  {"rangeName": "services", "ipCidrRange": "10.0.32.0/20"}]
    assert {vpc.urn, subnet.urn} <= set(cluster.dependencies)
    assert cluster.inputs["ipAllocationPolicy"] == {
        "stackType": "IPV4", "clusterSecondaryRangeName": "pods", "servicesSecondaryRangeName": "services"}


@pytest.mark.parametrize("stack", ["a4-standard", "a3u-standard", "a4x", "smoke"])
def test_gpu_nodes_boot_from_the_platform_tables_disk(stack: str, synth_stack):
    # A4, A3 Ultra and A4X boot from Hyperdisk only; G2 from Persistent Disk (no Hyperdisk Balanced).
    disk = {"smoke": ("pd-balanced", 200)}.get(stack, ("hyperdisk-balanced", 100))
    pools = [r for r in synth_stack(stack).registrations if is_gpu_pool(r.__dict__)]
    assert pools and all((pool.inputs["nodeConfig"]["diskType"], pool.inputs["nodeConfig"]["diskSizeGb"]) == disk
                         for pool in pools)


def test_autopilot_a4_workers_fit_autopilots_pod_ceiling_with_the_sidecar(synth_stack):
    """Requests of every container of a worker pod, the GCS FUSE sidecar's (from its annotations)
    included, stay within the Autopilot A4 ceiling of the platform table."""
    from domain.platforms import PLATFORMS

    top = PLATFORMS["a4"].autopilot_max_pod
    (ray,) = [m for m in synth_stack("a4").manifests() if m["kind"] == "RayCluster"]
    (group,) = ray["spec"]["workerGroupSpecs"]
    pod = group["template"]
    notes = pod["metadata"]["annotations"]

    def gi(text: str) -> int:
        assert text.endswith("Gi"), text
        return int(text[:-2])

    requests = [c["resources"]["requests"] for c in pod["spec"]["containers"]]
    cpu = sum(int(r["cpu"]) for r in requests) + int(notes["gke-gcsfuse/cpu-request"])
    memory = sum(gi(r["memory"]) for r in requests) + gi(notes["gke-gcsfuse/memory-request"])
    disk = sum(gi(r["ephemeral-storage"]) for r in requests) + gi(notes["gke-gcsfuse/ephemeral-storage-request"])
    assert (cpu, memory, disk) == (top.cpu, top.memory_gi, top.ephemeral_gi) == (220, 2800, 1000)


def test_autopilot_worker_sizes_above_the_ceiling_are_refused():
    from domain.config import ConfigError, load_config
    from tests.conftest import BASE_CONFIG

    auto = {**BASE_CONFIG, "verl-gke:clusterMode": "autopilot", "verl-gke:gpuSpot": "true", "verl-gke:reservation": ""}
    assert (load_config(auto).worker_cpus, load_config(auto).worker_memory_gi) == (217, 2783)
    with pytest.raises(ConfigError) as caught:
        load_config({**auto, "verl-gke:workerCpus": "220", "verl-gke:workerMemoryGi": "3433"})
    assert caught.value.problems == [
        "verl-gke:workerCpus = 220: Autopilot admits a nvidia-b200 worker pod of at most 220 vCPUs / 2800Gi, the GCS "
        "FUSE sidecar's 2 vCPUs / 16Gi and the checkpoint copier's 1 vCPU / 1Gi included: at most 217 vCPUs.",
        "verl-gke:workerMemoryGi = 3433: Autopilot admits a nvidia-b200 worker pod of at most 220 vCPUs / 2800Gi, the "
        "GCS FUSE sidecar's 2 vCPUs / 16Gi and the checkpoint copier's 1 vCPU / 1Gi included: at most 2783Gi."]


def test_a_stack_of_an_earlier_version_keeps_its_cluster_on_the_default_network():
    result = synth.run("a4-standard", overrides={"verl-gke:clusterNetwork": "default"})
    (cluster,) = _by_type(result, "gcp:container/cluster:Cluster")
    (router,) = _by_type(result, "gcp:compute/router:Router")
    assert (cluster.inputs["network"], router.inputs["network"]) == ("default", "default")
    assert "subnetwork" not in cluster.inputs and cluster.inputs["ipAllocationPolicy"] == {"stackType": "IPV4"}
    assert not [r for r in _by_type(result, "gcp:compute/network:Network") if r.inputs["name"].endswith("-net")
                and "gvnic" not in r.inputs["name"] and "rdma" not in r.inputs["name"]]


@pytest.mark.parametrize("stack", STACKS)
def test_every_pod_has_seccomp_no_escalation_and_only_the_capabilities_rdma_needs(stack: str, synth_stack):
    pods = [(obj["kind"], t["spec"]) for obj in synth_stack(stack).manifests() for t in _pod_templates(obj)]
    assert len(pods) >= 3
    for kind, pod in pods:
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, kind
        for container in pod["containers"] + pod.get("initContainers", []):
            ctx = container["securityContext"]
            if (kind, container["name"]) == ("DaemonSet", "nccl-rdma-installer"):
                # The one exception: the NCCL installer writes the plugin into the host's folders.
                assert ctx == {"privileged": True} and container in pod["initContainers"]
                continue
            assert ctx["allowPrivilegeEscalation"] is False, container["name"]
            assert ctx["capabilities"]["drop"] == ["ALL"], container["name"]
            added = ctx["capabilities"].get("add", [])
            assert added == (["IPC_LOCK"] if container["name"] == "ray-worker" else []), container["name"]
            assert not ctx.get("privileged"), container["name"]


@pytest.mark.parametrize("stack", STACKS)
def test_the_stack_runs_in_a_namespace_of_its_own_with_pod_security_labels(stack: str, synth_stack):
    result = synth_stack(stack)
    (namespace,) = [m for m in result.manifests() if m["kind"] == "Namespace" and m["metadata"]["name"] == "verl-gke"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/warn"] == "baseline"
    assert result.outputs["namespace"] == "verl-gke"
    namespaced = [m for m in result.manifests() if m["kind"] in ("RayCluster", "Job", "ServiceAccount",
                                                                  "PersistentVolumeClaim", "ConfigMap")]
    assert namespaced and {m["metadata"]["namespace"] for m in namespaced} == {"verl-gke"}


def test_the_shipped_supervisor_runs_from_its_config_map_alone(synth_stack, tmp_path):
    """The ConfigMap's files laid out as the pod mounts them, run as the pod runs them, with nothing
    of the repository on the path: both modules are shipped and import each other."""
    import os
    import subprocess
    import sys

    result = synth_stack("a4-standard")
    cfg = load_config(raw_config("a4-standard")[0])
    name = f"{cfg.ray_cluster_name}-supervisor"
    data = _manifest(result, "ConfigMap", name)["data"]
    pod = _manifest(result, "Deployment", name)["spec"]["template"]["spec"]
    (volume,) = pod["volumes"]
    (container,) = pod["containers"]
    (mount,) = container["volumeMounts"]
    root = tmp_path / mount["mountPath"].lstrip("/")
    for item in volume["configMap"]["items"]:
        (root / item["path"]).parent.mkdir(parents=True, exist_ok=True)
        (root / item["path"]).write_text(data[item["key"]])
    env = {e["name"]: e["value"].replace(mount["mountPath"], str(root)) for e in container["env"]}
    command = [sys.executable, *container["command"][1:3], "--help"]
    done = subprocess.run(command, cwd=tmp_path, env={"PATH": os.environ["PATH"], **env}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--program-dir" in done.stdout


def test_the_smoke_stacks_head_takes_no_tasks_so_verls_trainer_runs_on_a_worker(synth_stack):
    [ray] = _by_type(synth_stack("smoke"), "kubernetes:ray.io/v1:RayCluster")
    assert ray.inputs["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    [group] = ray.inputs["spec"]["workerGroupSpecs"]
    # One L4 a node, two nodes: verl's FSDP ranks and vLLM talk across nodes over TCP, no RDMA annotation.
    assert (group["replicas"], group["rayStartParams"]["num-cpus"]) == (2, "3")
    assert "networking.gke.io/interfaces" not in group["template"]["metadata"].get("annotations", {})
    [a4] = _by_type(synth_stack("a4-standard"), "kubernetes:ray.io/v1:RayCluster")
    assert "num-cpus" not in a4.inputs["spec"]["headGroupSpec"]["rayStartParams"]
