"""RdmaNetwork, GkeCluster, GpuNodePool and NetworkMapping under the mock engine: each value the
tutorial's "Set up the infrastructure" and "Configure network mappings" steps fix (with its bugs
corrected), per platform and mode, and the resources of each type they register."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import pulumi
import pytest
import yaml

from components.gke_cluster import DRA_V1BETA1_APIS, GkeCluster, GkeClusterArgs
from components.gpu_node_pool import GpuNodePool, GpuNodePoolArgs
from components.network_mapping import NetworkMapping
from domain import preflight
from domain.platforms import PLATFORMS
from components.rdma_network import RdmaNetwork
from manifests import nccl
from manifests.network_mapping import NetworkNames
from tests.mock_run import MockRun
from verl_gke import synth

PROJECT, REGION, ZONE = "my-project-123", "us-central1", "us-central1-b"
CLUSTER = "verl-cluster"


def tutorial_rdma_cidrs(nics: int) -> list[str]:
    """The tutorial's `--range=192.168.$((N+1)).0/24`."""
    return [f"192.168.{n + 1}.0/24" for n in range(nics)]


def names_for(platform: str) -> NetworkNames:
    return NetworkNames(gvnic_prefix="verl-gvnic", rdma_prefix="verl-rdma", rdma_nics=PLATFORMS[platform].rdma_nics)


def cluster_args(**overrides: Any) -> GkeClusterArgs:
    args: dict[str, Any] = {"project": PROJECT, "name": CLUSTER, "location": REGION, "mode": "standard",
                            "release_channel": "REGULAR", "deletion_protection": False, "min_master_version": "1.34",
                            "ray_operator": True, "cpu_machine_type": "c2-standard-16", "cpu_min_nodes": 1,
                            "cpu_max_nodes": 5}
    args.update(overrides)
    return args  # type: ignore[return-value]


def rdma_network(platform: str) -> RdmaNetwork:
    nics = PLATFORMS[platform].rdma_nics
    return RdmaNetwork("net", {"project": PROJECT, "region": REGION, "zone": ZONE, "names": names_for(platform),
                               "gvnic_cidr": "192.168.0.0/24", "rdma_cidrs": tutorial_rdma_cidrs(nics)})


def gpu_pool_args(platform: str, cluster: GkeCluster, **overrides: Any) -> GpuNodePoolArgs:
    args: dict[str, Any] = {"project": PROJECT, "cluster": cluster.name, "location": REGION, "zone": ZONE,
                            "platform": platform, "reservation": "my-reservation", "nodes": 2, "max_nodes": 10,
                            "spot": False}
    args.update(overrides)
    return args  # type: ignore[return-value]


def standard_stack(platform: str, *, dranet: bool = False) -> Callable[[], None]:
    """The A4/A3 Ultra Standard path, or A4X (DRANET, or multi-network when dranet is False)."""

    def program() -> None:
        cluster = GkeCluster("gke", cluster_args(ray_operator=platform != "a4x"))
        a4x = {"accelerator_topology": "1x72"} if platform == "a4x" else {}
        if dranet:
            pool = GpuNodePool("gpu", gpu_pool_args(platform, cluster, accelerator_network_profile="auto", **a4x))
            networks = None
        else:
            net = rdma_network(platform)
            pool = GpuNodePool("gpu", gpu_pool_args(platform, cluster, additional_node_networks=net.node_networks, **a4x))
            networks = names_for(platform)
        NetworkMapping(
            "mapping",
            {"networks": networks, "platform": PLATFORMS[platform],
             "nccl_installer_url": nccl.google_installer_url(PLATFORMS[platform], "standard")},
            opts=pulumi.ResourceOptions(providers=[cluster.provider], depends_on=[pool]),
        )

    return program


@pytest.fixture(scope="module")
def a4_standard() -> MockRun:
    return MockRun(standard_stack("a4"))


@pytest.fixture(scope="module")
def a4x_dranet() -> MockRun:
    return MockRun(standard_stack("a4x", dranet=True))


# --- RdmaNetwork -------------------------------------------------------------------------------

def test_gvnic_vpc_subnet_and_firewall_match_the_gcloud_commands(a4_standard: MockRun):
    assert a4_standard.inputs("net-gvnic-net") == {
        "name": "verl-gvnic-net", "project": PROJECT, "autoCreateSubnetworks": False, "mtu": 8896}
    sub = a4_standard.inputs("net-gvnic-sub")
    assert (sub["name"], sub["region"], sub["ipCidrRange"]) == ("verl-gvnic-sub", REGION, "192.168.0.0/24")
    fw = a4_standard.inputs("net-gvnic-internal")
    assert fw["name"] == "verl-gvnic-internal"
    assert fw["allows"] == [{"protocol": "tcp", "ports": ["0-65535"]}, {"protocol": "udp", "ports": ["0-65535"]},
                            {"protocol": "icmp"}]
    assert fw["sourceRanges"] == ["192.168.0.0/24"]  # the gVNIC subnet only, not the tutorial's /16
    assert fw["direction"] == "INGRESS"


def test_rdma_vpc_uses_the_zones_roce_profile_and_jumbo_mtu(a4_standard: MockRun):
    net = a4_standard.inputs("net-rdma-net")
    assert net["name"] == "verl-rdma-net"
    assert net["networkProfile"] == f"projects/{PROJECT}/global/networkProfiles/{ZONE}-vpc-roce"
    assert net["mtu"] == 8896
    assert net["autoCreateSubnetworks"] is False


def test_eight_rdma_subnets_192_168_1_to_8(a4_standard: MockRun):
    subs = [a4_standard.inputs(f"net-rdma-sub-{n}") for n in range(8)]
    assert [(s["name"], s["ipCidrRange"], s["region"]) for s in subs] == [
        (f"verl-rdma-sub-{n}", f"192.168.{n + 1}.0/24", REGION) for n in range(8)]
    assert "net-rdma-sub-8" not in a4_standard.by_name


def test_subnets_and_firewall_wait_for_their_vpc(a4_standard: MockRun):
    assert a4_standard.urn("net-gvnic-net") in a4_standard.deps("net-gvnic-sub")
    assert a4_standard.urn("net-gvnic-net") in a4_standard.deps("net-gvnic-internal")
    for n in range(8):
        assert a4_standard.urn("net-rdma-net") in a4_standard.deps(f"net-rdma-sub-{n}")


def test_a_range_per_rdma_nic_is_required_before_anything_is_registered():
    def program() -> None:
        RdmaNetwork("net", {"project": PROJECT, "region": REGION, "zone": ZONE, "names": names_for("a4"),
                            "gvnic_cidr": "192.168.0.0/24", "rdma_cidrs": tutorial_rdma_cidrs(7)})

    monitor = synth.RecordingMonitor(synth.SynthMocks())
    with pytest.raises(Exception, match=re.escape("RdmaNetwork: rdma_cidrs has 7 ranges: needs one per RDMA NIC (8)")):
        synth.run_in_mocks(program, monitor=monitor)
    assert [r.type for r in monitor.registrations if r.type.startswith("gcp:")] == []


def test_other_ranges_from_config_reach_the_subnets_and_firewall():
    def program() -> None:
        RdmaNetwork("net", {"project": PROJECT, "region": REGION, "zone": ZONE, "names": names_for("a4"),
                            "gvnic_cidr": "10.10.0.0/24", "rdma_cidrs": [f"10.20.{n}.0/24" for n in range(8)]})

    run = MockRun(program)
    assert run.inputs("net-gvnic-sub")["ipCidrRange"] == "10.10.0.0/24"
    assert run.inputs("net-rdma-sub-5")["ipCidrRange"] == "10.20.5.0/24"
    # The gVNIC NICs' traffic comes only from the gVNIC subnet: the rule admits that range, no wider one.
    assert run.inputs("net-gvnic-internal")["sourceRanges"] == ["10.10.0.0/24"]


# --- GkeCluster: Standard ----------------------------------------------------------------------

def test_standard_cluster_has_the_tutorials_flags(a4_standard: MockRun):
    c = a4_standard.inputs("gke-cluster")
    assert (c["name"], c["location"], c["project"]) == (CLUSTER, REGION, PROJECT)
    assert c["datapathProvider"] == "ADVANCED_DATAPATH"  # --enable-dataplane-v2
    assert c["workloadIdentityConfig"] == {"workloadPool": f"{PROJECT}.svc.id.goog"}  # --workload-pool
    assert c["networkingMode"] == "VPC_NATIVE"  # --enable-ip-alias
    assert c["enableMultiNetworking"] is True
    assert c["addonsConfig"]["rayOperatorConfigs"] == [{"enabled": True}]  # --addons=RayOperator
    assert c["addonsConfig"]["gcsFuseCsiDriverConfig"] == {"enabled": True}  # --addons=GcsFuseCsiDriver
    assert c["releaseChannel"] == {"channel": "REGULAR"}
    assert c["deletionProtection"] is False
    assert c["minMasterVersion"] == "1.34"
    assert "enableAutopilot" not in c


def test_standard_cluster_replaces_its_builtin_pool_and_is_locked_down(a4_standard: MockRun):
    c = a4_standard.inputs("gke-cluster")
    assert c["removeDefaultNodePool"] is True
    assert c["initialNodeCount"] == 1
    assert c["enableShieldedNodes"] is True
    assert c["masterAuth"] == {"clientCertificateConfig": {"issueClientCertificate": False}}
    assert c["masterAuthorizedNetworksConfig"] == {"cidrBlocks": [], "gcpPublicCidrsAccessEnabled": False}


def test_cpu_pool_is_c2_standard_16_autoscaling_1_to_5(a4_standard: MockRun):
    pool = a4_standard.inputs("gke-cpu-pool")
    # The Ray head's nodeSelector; not `default-pool`, which remove_default_node_pool deletes.
    assert pool["name"] == "verl-cpu"
    assert pool["cluster"] == CLUSTER
    assert pool["location"] == REGION
    assert pool["initialNodeCount"] == 1
    assert pool["autoscaling"] == {"minNodeCount": 1, "maxNodeCount": 5}
    assert pool["nodeConfig"] == {"machineType": "c2-standard-16", "workloadMetadataConfig": {"mode": "GKE_METADATA"},
                                  "shieldedInstanceConfig": {"enableSecureBoot": True, "enableIntegrityMonitoring": True},
                                  "kubeletConfig": {"insecureKubeletReadonlyPortEnabled": "FALSE"},
                                  "serviceAccount": NODE_SA, "oauthScopes": ["https://www.googleapis.com/auth/cloud-platform"]}
    assert a4_standard.urn("gke-cluster") in a4_standard.deps("gke-cpu-pool")


def test_cpu_pool_takes_machine_type_and_bounds_from_config():
    pool = MockRun(lambda: GkeCluster("gke", cluster_args(cpu_machine_type="n2-standard-8", cpu_min_nodes=0,
                                                          cpu_max_nodes=3))).inputs("gke-cpu-pool")
    assert pool["nodeConfig"]["machineType"] == "n2-standard-8"
    assert pool["autoscaling"] == {"minNodeCount": 0, "maxNodeCount": 3}
    assert pool["initialNodeCount"] == 1  # the Ray head needs a node from the start


def test_one_kubernetes_provider_from_a_secret_kubeconfig(a4_standard: MockRun):
    providers = a4_standard.of_type("pulumi:providers:kubernetes")
    assert [p.name for p in providers] == ["gke-k8s"]
    assert providers[0].inputs["kubeconfig"] == "[secret]"
    # Out-of-band deletion: forgetting the objects is one explicit command (tests/test_pulumi_lifecycle.py).
    assert "deleteUnreachable" not in providers[0].inputs
    # Kubernetes objects wait for the CPU pool; destroy removes them before it.
    assert a4_standard.urn("gke-cpu-pool") in providers[0].dependencies
    assert a4_standard.urn("gke-cluster") in providers[0].dependencies


def _kubeconfig_run(**overrides: Any) -> MockRun:
    def program() -> None:
        cluster = GkeCluster("gke", cluster_args(**overrides))
        pulumi.export("kubeconfig", cluster.kubeconfig)
        pulumi.export("is_secret", pulumi.Output.from_input(cluster.kubeconfig.is_secret()))
        pulumi.export("plain", pulumi.Output.unsecret(cluster.kubeconfig))
        pulumi.export("endpoint", cluster.endpoint)
        pulumi.export("ca", cluster.ca_certificate)

    return MockRun(program)


def test_kubeconfig_uses_the_auth_plugin_and_the_dns_endpoint_by_default():
    run = _kubeconfig_run()
    assert run.outputs["kubeconfig"] == "[secret]"
    assert run.outputs["is_secret"] is True
    config = yaml.safe_load(run.outputs["plain"])
    # As `gcloud container clusters get-credentials --dns-endpoint` writes it: a publicly trusted
    # certificate, so no cluster CA.
    assert config["clusters"][0]["cluster"] == {"server": f"https://{synth.MOCK_DNS_ENDPOINT}"}
    assert config["users"][0]["user"]["exec"]["command"] == "gke-gcloud-auth-plugin"
    assert run.outputs["endpoint"] == synth.MOCK_DNS_ENDPOINT
    assert run.outputs["ca"] == synth.MOCK_CA  # still exported: public data


def test_kubeconfig_with_the_ip_endpoint_pins_the_cluster_ca():
    run = _kubeconfig_run(control_plane_endpoint="ip")
    config = yaml.safe_load(run.outputs["plain"])
    assert config["clusters"][0]["cluster"] == {"server": f"https://{synth.MOCK_ENDPOINT}",
                                                "certificate-authority-data": synth.MOCK_CA}
    assert run.outputs["endpoint"] == synth.MOCK_ENDPOINT


def test_dns_endpoint_on_and_ip_endpoint_closed_to_outside_addresses_by_default():
    c = MockRun(lambda: GkeCluster("gke", cluster_args())).inputs("gke-cluster")
    assert c["controlPlaneEndpointsConfig"] == {"dnsEndpointConfig": {"allowExternalTraffic": True}}
    # Authorized networks on with no CIDR, Google Cloud's public IPs refused too.
    assert c["masterAuthorizedNetworksConfig"] == {"cidrBlocks": [], "gcpPublicCidrsAccessEnabled": False}
    c = MockRun(lambda: GkeCluster("gke", cluster_args(master_authorized_cidrs=["10.8.0.0/16"]))).inputs("gke-cluster")
    assert c["masterAuthorizedNetworksConfig"] == {
        "cidrBlocks": [{"cidrBlock": "10.8.0.0/16", "displayName": "authorized-0"}], "gcpPublicCidrsAccessEnabled": False}


def test_ip_endpoint_keeps_the_earlier_shape():
    c = MockRun(lambda: GkeCluster("gke", cluster_args(control_plane_endpoint="ip"))).inputs("gke-cluster")
    assert "controlPlaneEndpointsConfig" not in c
    assert "masterAuthorizedNetworksConfig" not in c


def test_authorized_networks_and_version_and_beta_apis_when_asked():
    run = MockRun(lambda: GkeCluster("gke", cluster_args(
        master_authorized_cidrs=["203.0.113.0/24"], control_plane_endpoint="ip", min_master_version="1.34.1-gke.1829001",
        k8s_beta_apis=list(DRA_V1BETA1_APIS), ray_operator=False, deletion_protection=True,
        release_channel="RAPID")))
    c = run.inputs("gke-cluster")
    assert c["masterAuthorizedNetworksConfig"] == {
        "cidrBlocks": [{"cidrBlock": "203.0.113.0/24", "displayName": "authorized-0"}]}
    assert c["minMasterVersion"] == "1.34.1-gke.1829001"
    assert c["enableK8sBetaApis"] == {"enabledApis": list(DRA_V1BETA1_APIS)}
    # KubeRay comes from its Helm chart on A4X: the add-on must be off, never both.
    assert "rayOperatorConfigs" not in c["addonsConfig"]
    assert c["deletionProtection"] is True
    assert c["releaseChannel"] == {"channel": "RAPID"}


# --- GkeCluster: Autopilot and bring-your-own ---------------------------------------------------

def test_autopilot_cluster_is_create_auto_with_multi_networking_and_ray():
    run = MockRun(lambda: GkeCluster("gke", cluster_args(mode="autopilot")))
    c = run.inputs("gke-cluster")
    assert c["enableAutopilot"] is True
    assert c["enableMultiNetworking"] is True
    assert c["datapathProvider"] == "ADVANCED_DATAPATH"
    assert c["addonsConfig"]["rayOperatorConfigs"] == [{"enabled": True}]
    assert c["workloadIdentityConfig"] == {"workloadPool": f"{PROJECT}.svc.id.goog"}
    for standard_only in ("removeDefaultNodePool", "initialNodeCount", "enableShieldedNodes"):
        assert standard_only not in c
    assert run.counts() == Counter({"verl-gke:index:GkeCluster": 1, "gcp:container/cluster:Cluster": 1,
                                    "pulumi:providers:kubernetes": 1, **NODE_IDENTITY})


@pytest.mark.parametrize(("endpoint", "server"), [("dns", synth.MOCK_DNS_ENDPOINT), ("ip", synth.MOCK_ENDPOINT)])
def test_existing_cluster_is_looked_up_and_nothing_is_created(endpoint: str, server: str):
    def program() -> None:
        cluster = GkeCluster("gke", cluster_args(existing=True, control_plane_endpoint=endpoint))
        pulumi.export("endpoint", cluster.endpoint)
        pulumi.export("name", cluster.name)
        pulumi.export("location", cluster.location)
        pulumi.export("plain", pulumi.Output.unsecret(cluster.kubeconfig))

    run = MockRun(program)
    assert run.counts() == Counter({"verl-gke:index:GkeCluster": 1, "pulumi:providers:kubernetes": 1})
    assert (run.outputs["name"], run.outputs["location"]) == (CLUSTER, REGION)
    assert yaml.safe_load(run.outputs["plain"])["clusters"][0]["cluster"]["server"] == f"https://{server}"
    assert run.outputs["endpoint"] == server  # not secret, though the lookup is


def test_existing_cluster_whose_dns_endpoint_refuses_user_traffic_is_reached_on_its_ip_endpoint():
    def program() -> None:
        pulumi.export("endpoint", GkeCluster("gke", cluster_args(existing=True)).endpoint)

    closed = {"dnsEndpointConfigs": [{"endpoint": synth.MOCK_DNS_ENDPOINT, "allowExternalTraffic": False}],
              "ipEndpointsConfigs": [{"enabled": True}]}
    answer = {**preflight.existing_cluster_answer({"name": CLUSTER, "location": REGION}),
              "controlPlaneEndpointsConfigs": [closed]}
    _, outputs = synth.run_in_mocks(program, monitor=synth.RecordingMonitor(
        synth.SynthMocks(cloud={preflight.CLUSTER: answer})))
    assert outputs["endpoint"] == synth.MOCK_ENDPOINT


def test_unknown_mode_is_refused_by_name():
    with pytest.raises(Exception, match=re.escape("GkeCluster: mode = 'hybrid': must be 'autopilot' or 'standard'")):
        synth.run_in_mocks(lambda: GkeCluster("gke", cluster_args(mode="hybrid")))


# --- GpuNodePool ------------------------------------------------------------------------------

@pytest.mark.parametrize(("platform", "machine", "accelerator"),
                         [("a4", "a4-highgpu-8g", "nvidia-b200"), ("a3u", "a3-ultragpu-8g", "nvidia-h200-141gb")])
def test_gpu_pool_is_the_tutorials_node_pools_create(platform: str, machine: str, accelerator: str):
    run = MockRun(standard_stack(platform))
    pool = run.inputs("gpu-pool")
    assert pool["name"] == "gpu-pool"
    assert (pool["cluster"], pool["location"], pool["nodeLocations"]) == (CLUSTER, REGION, [ZONE])
    assert pool["initialNodeCount"] == 2
    assert pool["autoscaling"] == {"totalMinNodeCount": 0, "totalMaxNodeCount": 10}
    assert pool["upgradeSettings"] == {"strategy": "SURGE", "maxSurge": 0, "maxUnavailable": 1}
    node = pool["nodeConfig"]
    assert node["machineType"] == machine
    assert node["guestAccelerators"] == [
        {"type": accelerator, "count": 8, "gpuDriverInstallationConfig": {"gpuDriverVersion": "DEFAULT"}}]
    assert node["reservationAffinity"] == {"consumeReservationType": "SPECIFIC_RESERVATION",
                                           "key": "compute.googleapis.com/reservation-name",
                                           "values": ["my-reservation"]}
    assert node["spot"] is False
    assert node["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}
    assert node["ephemeralStorageLocalSsdConfig"] == {"localSsdCount": 32}  # Cluster Toolkit gke-a4, gke-a3-ultragpu
    assert node["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}]
    assert "labels" not in node  # no DRANET: the NICs come from the multi-network objects
    assert pool["networkConfig"]["additionalNodeNetworkConfigs"] == [
        {"network": "verl-gvnic-net", "subnetwork": "verl-gvnic-sub"},
        *({"network": "verl-rdma-net", "subnetwork": f"verl-rdma-sub-{n}"} for n in range(8)),
    ]
    assert "placementPolicy" not in pool
    assert run.of_type("gcp:compute/resourcePolicy:ResourcePolicy") == []


def test_gpu_pool_waits_for_the_cluster_and_every_subnet(a4_standard: MockRun):
    deps = a4_standard.deps("gpu-pool")
    assert a4_standard.urn("gke-cluster") in deps
    for subnet in ["net-gvnic-sub", *(f"net-rdma-sub-{n}" for n in range(8))]:
        assert a4_standard.urn(subnet) in deps


def test_spot_without_reservation():
    def program() -> None:
        cluster = GkeCluster("gke", cluster_args())
        GpuNodePool("gpu", gpu_pool_args("a4", cluster, spot=True, reservation=None, nodes=4, max_nodes=6))

    pool = MockRun(program).inputs("gpu-pool")
    assert pool["nodeConfig"]["spot"] is True
    assert pool["nodeConfig"]["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
    assert (pool["initialNodeCount"], pool["autoscaling"]["totalMaxNodeCount"]) == (4, 6)


def test_a4x_pool_is_gb200_with_compact_1x72_placement_and_dranet(a4x_dranet: MockRun):
    pool = a4x_dranet.inputs("gpu-pool")
    node = pool["nodeConfig"]
    assert node["machineType"] == "a4x-highgpu-4g"
    assert node["guestAccelerators"] == [
        {"type": "nvidia-gb200", "count": 4, "gpuDriverInstallationConfig": {"gpuDriverVersion": "DEFAULT"}}]
    assert node["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}]
    assert node["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}
    # 0: the machine type's own Local SSD count (GKE API), checked against the zone's at preview.
    assert node["ephemeralStorageLocalSsdConfig"] == {"localSsdCount": 0}
    assert node["reservationAffinity"]["consumeReservationType"] == "SPECIFIC_RESERVATION"
    assert pool["networkConfig"] == {"acceleratorNetworkProfile": "auto"}
    # Without this label GKE's DRANET driver skips the nodes and no mrdma.google.com NIC is claimable.
    assert node["labels"] == {"cloud.google.com/gke-networking-dra-driver": "true"}
    # A fixed size: scaling a 1x72 pool down gives its NVLink sub-block back.
    assert "autoscaling" not in pool and "initialNodeCount" not in pool
    assert pool["nodeCount"] == 2  # the fixture's gpuNodes
    policy = a4x_dranet.of_type("gcp:compute/resourcePolicy:ResourcePolicy")
    assert [p.name for p in policy] == ["gpu-workload-policy"]
    assert policy[0].inputs["workloadPolicy"] == {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "1x72"}
    assert policy[0].inputs["region"] == REGION
    assert policy[0].inputs["name"] == f"{CLUSTER}-gpu-pool-placement"
    assert pool["placementPolicy"] == {"type": "COMPACT", "policyName": f"{CLUSTER}-gpu-pool-placement"}
    assert policy[0].urn in a4x_dranet.deps("gpu-pool")


def test_a4x_multi_network_pool_has_one_gvnic_and_four_rdma():
    run = MockRun(standard_stack("a4x"))
    assert run.inputs("gpu-pool")["networkConfig"]["additionalNodeNetworkConfigs"] == [
        {"network": "verl-gvnic-net", "subnetwork": "verl-gvnic-sub"},
        *({"network": "verl-rdma-net", "subnetwork": f"verl-rdma-sub-{n}"} for n in range(4)),
    ]
    assert sorted(r.inputs["ipCidrRange"] for r in run.of_type("gcp:compute/subnetwork:Subnetwork")) == [
        f"192.168.{n}.0/24" for n in range(5)]
    assert len(run.of_type("kubernetes:networking.gke.io/v1:Network")) == 5


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"platform": "h100"}, "GpuNodePool: platform = 'h100': must be one of a3u, a4, a4x"),
        ({"nodes": 12}, "GpuNodePool: nodes = 12, max_nodes = 10: need 1 <= nodes <= max_nodes"),
        ({"nodes": 0}, "GpuNodePool: nodes = 0, max_nodes = 10: need 1 <= nodes <= max_nodes"),
        ({"accelerator_network_profile": "auto", "additional_node_networks": []},
         "GpuNodePool: accelerator_network_profile = 'auto' makes GKE attach the networks itself"),
        ({"spot": True}, "GpuNodePool: spot = True with reservation = 'my-reservation': Spot VMs cannot consume a "
                         "reservation"),
    ],
)
def test_bad_pool_args_are_refused_by_name(overrides: dict[str, Any], message: str):
    def program() -> None:
        GpuNodePool("gpu", {**gpu_pool_args("a4", GkeCluster("gke", cluster_args())), **overrides})  # type: ignore[typeddict-item]

    with pytest.raises(Exception, match=re.escape(message)):
        synth.run_in_mocks(program)


# --- NetworkMapping ---------------------------------------------------------------------------

def test_mapping_objects_are_the_manifests_applied_through_the_clusters_provider(a4_standard: MockRun):
    # Registration order follows when inputs resolve, not program order: compare by name.
    param_sets = a4_standard.of_type("kubernetes:networking.gke.io/v1:GKENetworkParamSet")
    networks = a4_standard.of_type("kubernetes:networking.gke.io/v1:Network")
    expected = sorted(["gvnic-1", *(f"rdma-{n}" for n in range(8))])
    assert sorted(p.inputs["metadata"]["name"] for p in param_sets) == expected
    assert sorted(n.inputs["metadata"]["name"] for n in networks) == expected
    assert a4_standard.inputs("mapping-gkenetworkparamset-gvnic-1")["spec"] == {
        "vpc": "verl-gvnic-net", "vpcSubnet": "verl-gvnic-sub", "deviceMode": "NetDevice"}
    assert a4_standard.inputs("mapping-gkenetworkparamset-rdma-7")["spec"] == {
        "vpc": "verl-rdma-net", "vpcSubnet": "verl-rdma-sub-7", "deviceMode": "RDMA"}
    assert a4_standard.inputs("mapping-network-rdma-7")["spec"] == {
        "type": "Device",
        "parametersRef": {"group": "networking.gke.io", "kind": "GKENetworkParamSet", "name": "rdma-7"}}
    provider = a4_standard.urn("gke-k8s")
    for r in [*param_sets, *networks]:
        assert r.provider == provider


def test_mapping_waits_for_the_gpu_pool_and_each_network_for_its_param_set(a4_standard: MockRun):
    # Depending on the GpuNodePool component means waiting for the node pool inside it.
    pool = a4_standard.urn("gpu-pool")
    for r in a4_standard.registrations:
        if r.type.startswith("kubernetes:networking.gke.io/") or r.type == DAEMONSET:
            assert pool in r.dependencies, r.name
    assert a4_standard.urn("mapping-gkenetworkparamset-rdma-3") in a4_standard.deps("mapping-network-rdma-3")


DAEMONSET = "kubernetes:apps/v1:DaemonSet"
CONFIG_FILE = "kubernetes:yaml/v2:ConfigFile"


@pytest.mark.parametrize(("stack", "image"), [
    ("a4_standard", "us-docker.pkg.dev/gce-ai-infra/gpudirect-gib/nccl-plugin-gib:v1.1.1"),
    ("a4x_dranet", "us-docker.pkg.dev/gce-ai-infra/gpudirect-gib/nccl-plugin-gib-arm64:v1.1.0"),
])
def test_standard_installer_is_verl_gkes_daemonset_pulling_its_image_by_the_digest_pinned_at_first_up(
        stack: str, image: str, request: pytest.FixtureRequest):
    run: MockRun = request.getfixturevalue(stack)
    assert run.of_type(CONFIG_FILE) == []
    [pin] = run.of_type("pulumi-python:dynamic:PinnedImage")
    assert (pin.name, pin.inputs["image"]) == ("mapping-nccl-installer-image", image)
    [installer] = run.of_type(DAEMONSET)
    assert installer.provider == run.urn("gke-k8s")
    assert pin.urn in installer.dependencies
    pod = MockRun.manifest(installer)["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["image"] == f"{image}@{synth.UNRESOLVED_DIGEST}"


def test_standard_installer_takes_over_the_object_the_configfile_of_0_4_applied(a4_standard: MockRun):
    """An upgrade updates the DaemonSet in place: the alias names the yaml/v2 ConfigFile's child, which
    pulumi-kubernetes names `<ConfigFile>:<namespace>/<name>` (provider/pkg/provider/yaml/v2/yaml.go)."""
    # The SDK adds the DaemonSet's old API versions as type aliases itself; the named one is ours.
    [alias] = [a for a in a4_standard.sent("mapping-nccl-rdma-installer").aliases if "name" in a]
    config_file = a4_standard.urn("mapping").rsplit("::", 1)[0] + "$kubernetes:yaml/v2:ConfigFile::mapping-nccl-rdma-installer"
    assert alias == {"name": "mapping-nccl-rdma-installer:kube-system/nccl-rdma-installer", "parentUrn": config_file}


def test_autopilot_applies_the_mapping_and_googles_autopilot_installer():
    def program() -> None:
        cluster = GkeCluster("gke", cluster_args(mode="autopilot"))
        net = rdma_network("a4")
        # No GPU pool on Autopilot: the mapping waits for the VPCs it names, and goes before them.
        NetworkMapping("mapping", {"networks": names_for("a4"), "platform": PLATFORMS["a4"],
                                   "nccl_installer_url": nccl.google_installer_url(PLATFORMS["a4"], "autopilot")},
                       opts=pulumi.ResourceOptions(providers=[cluster.provider], depends_on=[net]))

    run = MockRun(program)
    assert run.urn("net-rdma-sub-7") in run.deps("mapping-gkenetworkparamset-rdma-7")
    assert len(run.of_type("kubernetes:networking.gke.io/v1:GKENetworkParamSet")) == 9
    [installer] = run.of_type(CONFIG_FILE)
    assert installer.inputs["file"] == (
        "https://raw.githubusercontent.com/GoogleCloudPlatform/container-engine-accelerators/"
        "07a8e6c9b2208ee865a1fb9b9b246e10adfd7738/gpudirect-rdma/nccl-rdma-installer-autopilot.yaml")
    assert run.of_type(DAEMONSET) == run.of_type("pulumi-python:dynamic:PinnedImage") == []
    assert run.of_type("gcp:container/nodePool:NodePool") == []


def test_a_users_installer_url_is_applied_as_is_instead():
    url = f"https://example.com/{'1' * 40}/gpudirect-rdma/mine.yaml"

    def program() -> None:
        cluster = GkeCluster("gke", cluster_args())
        NetworkMapping("mapping", {"platform": PLATFORMS["a4x"], "nccl_installer_url": url},
                       opts=pulumi.ResourceOptions(providers=[cluster.provider]))

    run = MockRun(program)
    assert [r.inputs["file"] for r in run.of_type(CONFIG_FILE)] == [url]
    assert run.of_type(DAEMONSET) == []


# --- Whole Standard stacks: resources per type ---------------------------------------------------

NODE_IDENTITY = {"gcp:serviceaccount/account:Account": 1, "gcp:projects/iAMMember:IAMMember": 1}


def test_a4_standard_resource_counts(a4_standard: MockRun):
    assert a4_standard.counts() == Counter({
        "verl-gke:index:GkeCluster": 1, "gcp:container/cluster:Cluster": 1, "gcp:container/nodePool:NodePool": 2,
        "pulumi:providers:kubernetes": 1, **NODE_IDENTITY,
        "verl-gke:index:RdmaNetwork": 1, "gcp:compute/network:Network": 2, "gcp:compute/subnetwork:Subnetwork": 9,
        "gcp:compute/firewall:Firewall": 1,
        "verl-gke:index:GpuNodePool": 1,
        "verl-gke:index:NetworkMapping": 1, "kubernetes:networking.gke.io/v1:GKENetworkParamSet": 9,
        "kubernetes:networking.gke.io/v1:Network": 9, DAEMONSET: 1, "pulumi-python:dynamic:PinnedImage": 1,
    })


def test_a4x_dranet_resource_counts(a4x_dranet: MockRun):
    assert a4x_dranet.counts() == Counter({
        "verl-gke:index:GkeCluster": 1, "gcp:container/cluster:Cluster": 1, "gcp:container/nodePool:NodePool": 2,
        "pulumi:providers:kubernetes": 1, **NODE_IDENTITY,
        "verl-gke:index:GpuNodePool": 1, "gcp:compute/resourcePolicy:ResourcePolicy": 1,
        "verl-gke:index:NetworkMapping": 1, DAEMONSET: 1, "pulumi-python:dynamic:PinnedImage": 1,
    })


def test_children_are_parented_to_their_component(a4_standard: MockRun):
    parents = {r.name: r.parent for r in a4_standard.registrations}
    assert parents["gke-cluster"] == a4_standard.urn("gke")
    assert parents["gke-k8s"] == a4_standard.urn("gke")
    assert parents["net-rdma-sub-0"] == a4_standard.urn("net")
    assert parents["gpu-pool"] == a4_standard.urn("gpu")
    assert parents["mapping-nccl-rdma-installer"] == a4_standard.urn("mapping")


def test_no_minor_or_node_auto_upgrade_drains_the_gpu_nodes_of_a_stack(synth_stack: Any) -> None:
    """No fixed date: the exclusion starts at the cluster's first `pulumi up` (unknown offline)."""
    for stack in ("a4", "a4-standard", "a3u-standard", "a4x"):
        registrations = synth_stack(stack).registrations
        (cluster,) = [r for r in registrations if r.type == "gcp:container/cluster:Cluster"]
        assert cluster.inputs["maintenancePolicy"] == {
            "dailyMaintenanceWindow": {"startTime": "03:00"},
            "maintenanceExclusions": [{
                "exclusionName": "verl-gke-no-minor-or-node-upgrades", "startTime": "[unknown]",
                "endTime": "[unknown]", "exclusionOptions": {"scope": "NO_MINOR_OR_NODE_UPGRADES"},
            }],
        }, stack
        (start,) = [r for r in registrations if r.type == "pulumi-python:dynamic:UpgradeExclusionStart"]
        assert start.parent == cluster.parent and start.urn in cluster.dependencies, stack
        assert (start.inputs["cluster"], start.inputs["location"]) == (cluster.inputs["name"],
                                                                      cluster.inputs["location"])


@pytest.mark.parametrize("start, end", [("2026-12-01T00:00:00Z", "2026-12-31T00:00:00Z"),
                                        ("2027-02-15T06:30:00Z", "2027-03-17T06:30:00Z")])
def test_the_exclusion_ends_thirty_days_after_it_starts_so_nodes_get_patches_again(start: str, end: str) -> None:
    run = MockRun(lambda: GkeCluster("gke", cluster_args(upgrade_exclusion_start=start)))
    (exclusion,) = run.inputs("gke-cluster")["maintenancePolicy"]["maintenanceExclusions"]
    assert (exclusion["startTime"], exclusion["endTime"]) == (start, end)
    assert "endTimeBehavior" not in exclusion["exclusionOptions"]


@pytest.mark.parametrize("start", [None, "none"])
def test_no_exclusion_leaves_gkes_upgrade_policy_alone(start: str | None) -> None:
    run = MockRun(lambda: GkeCluster("gke", cluster_args(upgrade_exclusion_start=start)))
    assert "maintenancePolicy" not in run.inputs("gke-cluster")


def test_every_vpc_has_the_jumbo_mtu(synth_stack: Any) -> None:
    networks = [r.inputs for r in synth_stack("a4-standard").registrations if r.type == "gcp:compute/network:Network"]
    # the cluster's own VPC, the gVNIC VPC and the RDMA one
    assert len(networks) == 3 and {n["mtu"] for n in networks} == {8896}


def test_gpu_metrics_go_to_managed_prometheus_on_every_stack(synth_stack: Any) -> None:
    for stack in ("a4", "a4-standard", "a3u-standard", "a4x"):
        cluster = next(r.inputs for r in synth_stack(stack).registrations if r.type == "gcp:container/cluster:Cluster")
        assert cluster["monitoringConfig"] == {"enableComponents": [
            "SYSTEM_COMPONENTS", "POD", "DAEMONSET", "DEPLOYMENT", "STATEFULSET", "STORAGE", "HPA", "CADVISOR", "KUBELET",
            "DCGM"], "managedPrometheus": {"enabled": True}}, stack
    off = MockRun(lambda: GkeCluster("gke", cluster_args(gpu_metrics=False)))
    assert "monitoringConfig" not in off.inputs("gke-cluster")


NODE_SA = f"{CLUSTER}-nodes@{PROJECT}.iam.gserviceaccount.com"


def test_nodes_run_as_a_dedicated_least_privilege_service_account(synth_stack: Any) -> None:
    for stack in ("a4", "a4-standard", "a3u-standard", "a4x"):
        regs = synth_stack(stack).registrations
        [account] = [r for r in regs if r.type == "gcp:serviceaccount/account:Account"]
        [binding] = [r for r in regs if r.type == "gcp:projects/iAMMember:IAMMember"
                     and r.inputs["role"] == "roles/container.defaultNodeServiceAccount"]
        email = f"{account.inputs['accountId']}@{account.inputs['project']}.iam.gserviceaccount.com"
        assert binding.inputs["member"] == f"serviceAccount:{email}", stack
        cluster = next(r for r in regs if r.type == "gcp:container/cluster:Cluster")
        pools = [r for r in regs if r.type == "gcp:container/nodePool:NodePool"]
        if stack == "a4":  # Autopilot: every node GKE provisions
            assert cluster.inputs["clusterAutoscaling"]["autoProvisioningDefaults"]["serviceAccount"] == email
            assert pools == []
        else:
            assert {p.inputs["nodeConfig"]["serviceAccount"] for p in pools} == {email}, stack
            assert all(binding.urn in p.dependencies for p in pools), stack


def test_the_service_account_id_fits_gcps_30_characters() -> None:
    from components.gke_cluster import node_account_id

    assert node_account_id("verl-gke") == "verl-gke-nodes"
    assert node_account_id("a" * 23 + "-" + "b" * 16) == "a" * 23 + "-nodes"
    assert len(node_account_id("c" * 40)) == 30


def test_the_dedicated_service_account_can_be_turned_off() -> None:
    run = MockRun(lambda: GkeCluster("gke", cluster_args(dedicated_node_service_account=False)))
    assert "serviceAccount" not in run.inputs("gke-cpu-pool")["nodeConfig"]
    assert not [r for r in run.registrations if r.type == "gcp:serviceaccount/account:Account"]


def test_every_node_boots_verified_and_closes_the_kubelets_read_only_port(synth_stack: Any) -> None:
    """CIS GKE 5.5.7 (Secure Boot) and 4.2.4 (the kubelet's unauthenticated read-only port, 10255):
    set on each node pool verl-gke creates (Secure Boot on every platform's machine family, as
    domain.platforms records it), the cluster's defaults for pools made later, and Autopilot's nodes."""
    from domain.platforms import PLATFORMS

    assert all(p.secure_boot for p in PLATFORMS.values())
    shielded = {"enableSecureBoot": True, "enableIntegrityMonitoring": True}
    closed = {"insecureKubeletReadonlyPortEnabled": "FALSE"}
    for stack in ("a4", "a4-standard", "a3u-standard", "a4x"):
        regs = synth_stack(stack).registrations
        cluster = next(r.inputs for r in regs if r.type == "gcp:container/cluster:Cluster")
        pools = [r.inputs for r in regs if r.type == "gcp:container/nodePool:NodePool"]
        if stack == "a4":  # Autopilot: GKE's shielded nodes with Secure Boot; the kubelet's port by config
            assert cluster["nodePoolAutoConfig"] == {"nodeKubeletConfig": closed}
            assert pools == []
            continue
        assert cluster["nodePoolDefaults"] == {"nodeConfigDefaults": closed}, stack
        assert cluster["enableShieldedNodes"] is True
        assert len(pools) >= 2, stack
        for pool in pools:
            assert pool["nodeConfig"]["shieldedInstanceConfig"] == shielded, (stack, pool["name"])
            assert pool["nodeConfig"]["kubeletConfig"] == closed, (stack, pool["name"])


def test_binary_authorization_is_an_option_enforcing_the_projects_policy(a4_standard: MockRun) -> None:
    from domain.config import load_config
    from domain.preflight import required_apis
    from tests.conftest import BASE_CONFIG

    assert "binaryAuthorization" not in a4_standard.inputs("gke-cluster")
    on = MockRun(lambda: GkeCluster("gke", cluster_args(binary_authorization=True)))
    assert on.inputs("gke-cluster")["binaryAuthorization"] == {"evaluationMode": "PROJECT_SINGLETON_POLICY_ENFORCE"}
    assert "binaryauthorization.googleapis.com" not in required_apis(load_config(BASE_CONFIG))
    cfg = load_config({**BASE_CONFIG, "verl-gke:binaryAuthorization": "true"})
    assert "binaryauthorization.googleapis.com" in required_apis(cfg)
