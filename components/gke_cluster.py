"""The tutorial's "Create the GKE cluster" (Autopilot or Standard), or an existing cluster looked up
by name, plus the one Kubernetes provider every Kubernetes child of the program uses."""

from __future__ import annotations

import datetime
import os

from collections.abc import Sequence
from typing import Literal, NotRequired, TypedDict, cast

import pulumi
import pulumi_kubernetes as k8s
from pulumi_gcp import container, projects, serviceaccount

from components.children import child_options
from components.upgrade_exclusion import UpgradeExclusionStart
from domain import upgrade_exclusion
from manifests.ray_cluster import HEAD_NODE_POOL
from domain.platforms import Mode
from access.kubeconfig import gke_kubeconfig

ReleaseChannel = Literal["RAPID", "REGULAR", "STABLE", "EXTENDED"]
ControlPlaneEndpoint = Literal["dns", "ip"]

DRA_V1BETA1_APIS = (
    "resource.k8s.io/v1beta1/deviceclasses",
    "resource.k8s.io/v1beta1/resourceclaims",
    "resource.k8s.io/v1beta1/resourceclaimtemplates",
    "resource.k8s.io/v1beta1/resourceslices",
)
"""The DRA beta APIs Cluster Toolkit's gke-a4x blueprints turn on for the NVIDIA DRA driver."""


NODE_ROLE = "roles/container.defaultNodeServiceAccount"
"""GKE's least-privilege role for a node service account: logs, metrics, no project-wide access."""
NODE_SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
"""With a dedicated service account the role limits access; GKE's guidance is the broad scope."""
KUBELET_READ_ONLY_PORT_CLOSED: container.NodePoolNodeConfigKubeletConfigArgsDict = {
    "insecure_kubelet_readonly_port_enabled": "FALSE"}
"""The kubelet's unauthenticated read-only port (10255) off (CIS GKE 4.2.4): every pod's spec and the
node's metrics are otherwise readable by anything that reaches the node."""


def shielded(secure_boot: bool) -> container.NodePoolNodeConfigShieldedInstanceConfigArgsDict:
    """Shielded VM options of a node pool (CIS GKE 5.5.7): Secure Boot where the machine boots so,
    integrity monitoring always."""
    return {"enable_secure_boot": secure_boot, "enable_integrity_monitoring": True}
_MAX_ACCOUNT_ID = 30


def node_account_id(cluster_name: str) -> str:
    """`<cluster>-nodes`, cut to the 30 characters a service account id may have."""
    return f"{cluster_name[:_MAX_ACCOUNT_ID - len('-nodes')].rstrip('-')}-nodes"


MONITORING_COMPONENTS = ("SYSTEM_COMPONENTS", "POD", "DAEMONSET", "DEPLOYMENT", "STATEFULSET", "STORAGE", "HPA",
                         "CADVISOR", "KUBELET")
"""Cluster Toolkit's gke-cluster default list (modules/scheduler/gke-cluster, monitoring_components) but
JOBSET, which this program does not run: the list replaces GKE's, so what it leaves out (kubelet and
cAdvisor above all) is not collected."""

DELETE_UNREACHABLE_ENV = "PULUMI_K8S_DELETE_UNREACHABLE"
"""pulumi-kubernetes reads it where the provider's inputs leave `deleteUnreachable` out (provider.go
Configure); the installed SDK puts it into those inputs on a program run (provider.py)."""

MAINTENANCE_WINDOW_START = "03:00"


def _log_window(start: str) -> str:
    """Says when the exclusion runs, or that it is over (at preview and up, once its start is known)."""
    level, line = upgrade_exclusion.window_line(start, datetime.datetime.now(datetime.timezone.utc))
    (pulumi.log.warn if level == "warning" else pulumi.log.info)(line)
    return start


def _open_dns_endpoint(configs: Sequence[container.outputs.GetClusterControlPlaneEndpointsConfigResult] | None
                       ) -> str | None:
    """A looked-up cluster's DNS endpoint if it takes user traffic (gcloud's rule for
    `get-credentials --dns-endpoint`), else None."""
    dns = [d for c in configs or [] for d in c.dns_endpoint_configs or []]
    return dns[0].endpoint if dns and dns[0].allow_external_traffic and dns[0].endpoint else None


class GkeClusterArgs(TypedDict):
    project: str
    """Project of the cluster; also names the Workload Identity pool `<project>.svc.id.goog`."""
    name: str
    """Cluster name (the tutorial's CLUSTER_NAME)."""
    location: str
    """Control-plane region (the tutorial's CONTROL_PLANE_REGION)."""
    mode: Mode
    """`autopilot` (`create-auto`) or `standard` (`create` + node pools)."""
    release_channel: ReleaseChannel
    """GKE release channel; decides which versions the control plane and nodes upgrade to."""
    deletion_protection: bool
    """When true, GKE refuses to delete the cluster and Pulumi protects it (`protect`): `pulumi destroy`
    fails at its preview, before deleting anything, until this is false and applied to the cluster
    (docs/pulumi-lifecycle.md: `pulumi up --target <cluster>`)."""
    min_master_version: str | None
    """Control-plane version to create the cluster at (the preflight picks it from the channel); after
    that the channel upgrades it, so a newer pick never upgrades a running cluster."""
    ray_operator: bool
    """Enable GKE's Ray operator add-on. Turn it off where KubeRay comes from its Helm chart instead
    (the A4X path): both would own the same CRDs."""
    cpu_machine_type: str
    """Standard: machine type of the CPU pool, which hosts the Ray head (tutorial: c2-standard-16)."""
    cpu_min_nodes: int
    """Standard: CPU pool autoscaling floor per zone, like gcloud's --min-nodes (tutorial: 1)."""
    cpu_max_nodes: int
    """Standard: CPU pool autoscaling ceiling per zone, like gcloud's --max-nodes (tutorial: 5)."""
    existing: NotRequired[bool]
    """Bring your own cluster: look `name` up in `location` and create nothing."""
    master_authorized_cidrs: NotRequired[Sequence[str]]
    """`ip`: when set, only these CIDRs (plus Google's own ranges) reach the control plane. `dns`: the
    only addresses outside the VPC the IP endpoint admits."""
    control_plane_endpoint: NotRequired[ControlPlaneEndpoint]
    """`dns` (default): clients use GKE's DNS-based endpoint (`*.gke.goog`: each request checked by
    IAM, `container.clusters.connect`, before it reaches the API server), and the IP endpoint is
    closed to addresses outside the VPC but `master_authorized_cidrs` (Google's public ranges too).
    `ip`: the IP endpoint, open to every address unless `master_authorized_cidrs` is set (clusters
    of earlier versions). An existing cluster's DNS endpoint is used only if it takes user traffic."""
    k8s_beta_apis: NotRequired[Sequence[str]]
    """Kubernetes beta APIs to enable (e.g. DRA_V1BETA1_APIS for the NVIDIA DRA driver)."""
    dedicated_node_service_account: NotRequired[bool]
    """Nodes run as `<cluster>-nodes` with only GKE's node role (default True), not as the project's
    Compute Engine default service account (Editor on most projects)."""
    gpu_metrics: NotRequired[bool]
    """DCGM GPU metrics in Managed Service for Prometheus (default True), as Cluster Toolkit's GPU blueprints."""
    private_nodes: NotRequired[bool]
    """Nodes get internal addresses only (default True); they reach the internet through Cloud NAT.
    Nodes reach the control plane on its internal endpoint, which authorized networks do not filter."""
    network: NotRequired[pulumi.Input[str] | None]
    """The cluster's own VPC (ClusterNetwork.network); None: GKE's choice, the project's `default`."""
    subnetwork: NotRequired[pulumi.Input[str] | None]
    """Its subnet, with the secondary ranges `pods_range` and `services_range` name."""
    pods_range: NotRequired[str]
    services_range: NotRequired[str]
    node_account_id: NotRequired[str]
    """Id of the nodes' dedicated service account; default `<name>-nodes` (node_account_id())."""
    resource_labels: NotRequired[dict[str, str]]
    """GCP labels on the cluster (the owning stack: domain.preflight.STACK_LABEL)."""
    binary_authorization: NotRequired[bool]
    """GKE admits only images the project's Binary Authorization policy allows (default False: the
    policy is the project owner's to write; see docs/security.md)."""
    upgrade_exclusion_start: NotRequired[str | None]
    """No minor or node auto-upgrades for domain.upgrade_exclusion.DAYS from then (an auto-upgrade drains GPU
    nodes in mid-run; control-plane patches still apply): an RFC3339 UTC time, or "" (AT_FIRST_UP) for the
    cluster's first `pulumi up` (UpgradeExclusionStart). None, absent or "none": no exclusion."""


class GkeCluster(pulumi.ComponentResource):
    """A GKE cluster as the tutorial creates it, with a kubeconfig and a Kubernetes provider for it."""

    name: pulumi.Output[str]
    location: pulumi.Output[str]
    endpoint: pulumi.Output[str]
    ca_certificate: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    """Secret. Authenticates through gke-gcloud-auth-plugin; holds no credential itself."""
    identity: pulumi.Output[str]
    """`projects/<p>/locations/<l>/clusters/<name>`: the cluster's id, unknown at preview only when the
    cluster is to be replaced; the Kubernetes provider's clusterIdentifier."""
    cluster: container.Cluster | None
    """The cluster this stack created (None for an existing one): what replaces the run with it."""
    provider: k8s.Provider
    """The one Kubernetes provider; pass it to every Kubernetes child."""
    cpu_pool: container.NodePool | None
    """Standard clusters: the CPU pool that hosts the Ray head and system pods."""
    node_service_account: pulumi.Output[str] | None
    """The nodes' dedicated service account (email), for node pools made outside this component."""
    node_identity: list[pulumi.Resource]
    """What node pools wait for: the cluster, and the account's role binding (nodes without it
    cannot write logs)."""

    def __init__(self, name: str, args: GkeClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("verl-gke:index:GkeCluster", name, {}, opts)
        self.cpu_pool = None
        self.cluster = None
        self.node_service_account = None
        self.node_identity = []
        if args.get("existing", False):
            self._look_up(args)
        else:
            # The cluster waits for what this component waits for.
            self._create(name, args, child_options(self, opts))
        self.kubeconfig = pulumi.Output.secret(
            pulumi.Output.all(self.name, self.endpoint, self.ca_certificate).apply(lambda a: gke_kubeconfig(*a))
        )
        if os.environ.get(DELETE_UNREACHABLE_ENV, "").lower() == "true":
            pulumi.log.warn(
                f"{DELETE_UNREACHABLE_ENV}=true: this run stores it in the Kubernetes provider's state, and until "
                "a `pulumi up` without it, a refresh that cannot reach the cluster forgets every Kubernetes "
                "object of the stack. Meant for one `pulumi refresh` of a cluster deleted out of band "
                "(docs/pulumi-lifecycle.md).")
        # Kubernetes objects wait for the CPU pool, and `pulumi destroy` removes them before it.
        self.provider = k8s.Provider(
            f"{name}-k8s",
            kubeconfig=self.kubeconfig,
            # The provider is replaced (and every object with it) only when this changes: not when the
            # kubeconfig is unknown at preview, nor when the endpoint or the CA change. A new cluster
            # has a new id only at preview; its replacement replaces the objects through the engine.
            cluster_identifier=self.identity,
            # No deleteUnreachable: a refresh that cannot reach the cluster fails instead of forgetting
            # the objects; PULUMI_K8S_DELETE_UNREACHABLE=true turns it on for one command.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.cpu_pool] if self.cpu_pool else []),
        )
        self.register_outputs({
            "name": self.name,
            "location": self.location,
            "endpoint": self.endpoint,
            "ca_certificate": self.ca_certificate,
            "kubeconfig": self.kubeconfig,
        })

    def _look_up(self, args: GkeClusterArgs) -> None:
        found = container.get_cluster_output(
            name=args["name"], location=args["location"], project=args["project"], opts=pulumi.InvokeOptions(parent=self)
        )
        self.name = pulumi.Output.from_input(args["name"])
        self.location = pulumi.Output.from_input(args["location"])
        self.identity = pulumi.Output.from_input(
            f"projects/{args['project']}/locations/{args['location']}/clusters/{args['name']}")
        # Any secret leaf (the client key) makes the whole lookup secret; endpoints and CA are not.
        ip = pulumi.Output.unsecret(found.endpoint)
        # Output.all would turn the typed results into plain dicts: read the DNS endpoint first.
        dns = pulumi.Output.unsecret(found.control_plane_endpoints_configs.apply(_open_dns_endpoint))
        self.endpoint = ip if args.get("control_plane_endpoint", "dns") == "ip" else pulumi.Output.all(
            ip, dns).apply(lambda a: a[1] or a[0])
        self.ca_certificate = pulumi.Output.unsecret(
            found.master_auths.apply(lambda auths: auths[0].cluster_ca_certificate))

    def _create(self, name: str, args: GkeClusterArgs, cluster_opts: pulumi.ResourceOptions) -> None:
        project, mode = args["project"], args["mode"]
        if mode not in ("autopilot", "standard"):
            raise ValueError(f"GkeCluster: mode = {mode!r}: must be 'autopilot' or 'standard'")
        standard = mode == "standard"
        addons: container.ClusterAddonsConfigArgsDict = {"gcs_fuse_csi_driver_config": {"enabled": True}}
        if args["ray_operator"]:
            addons["ray_operator_configs"] = [{"enabled": True}]
        authorized = args.get("master_authorized_cidrs") or []
        dns = args.get("control_plane_endpoint", "dns") == "dns"
        beta_apis = args.get("k8s_beta_apis")
        exclusion_start: pulumi.Input[str] | None = args.get("upgrade_exclusion_start")
        if exclusion_start == upgrade_exclusion.AT_FIRST_UP:
            exclusion_start = UpgradeExclusionStart(f"{name}-upgrade-exclusion", {
                "cluster": args["name"], "location": args["location"]}, opts=cluster_opts).start
        elif exclusion_start == upgrade_exclusion.OFF:
            exclusion_start = None
        node_identity: dict[str, object] = {}
        if args.get("dedicated_node_service_account", True):
            account = serviceaccount.Account(
                f"{name}-nodes", account_id=args.get("node_account_id") or node_account_id(args["name"]),
                project=project,
                display_name=f"GKE nodes of {args['name']} (verl-gke)", opts=cluster_opts)
            self.node_identity = [projects.IAMMember(
                f"{name}-nodes-role", project=project, role=NODE_ROLE,
                member=account.email.apply(lambda email: f"serviceAccount:{email}"), opts=cluster_opts)]
            self.node_service_account = account.email
            node_identity = {"service_account": account.email, "oauth_scopes": NODE_SCOPES}
        cluster = container.Cluster(
            f"{name}-cluster",
            name=args["name"],
            project=project,
            location=args["location"],
            enable_autopilot=None if standard else True,
            # Standard: the tutorial's c2-standard-16 pool is its own NodePool (below); the cluster's
            # built-in pool is created minimal and removed, as the provider recommends.
            remove_default_node_pool=True if standard else None,
            initial_node_count=1 if standard else None,
            enable_shielded_nodes=True if standard else None,
            # Pools made later (GKE's defaults for new node pools) and Autopilot's nodes.
            node_pool_defaults={"node_config_defaults": dict(KUBELET_READ_ONLY_PORT_CLOSED)} if standard else None,
            node_pool_auto_config=None if standard else {"node_kubelet_config": dict(KUBELET_READ_ONLY_PORT_CLOSED)},
            binary_authorization=({"evaluation_mode": "PROJECT_SINGLETON_POLICY_ENFORCE"}
                                  if args.get("binary_authorization") else None),
            release_channel={"channel": args["release_channel"]},
            maintenance_policy={
                # GKE wants a window beside an exclusion; patches land at 03:00 UTC.
                "daily_maintenance_window": {"start_time": MAINTENANCE_WINDOW_START},
                "maintenance_exclusions": [{
                    "exclusion_name": upgrade_exclusion.NAME,
                    "start_time": pulumi.Output.from_input(exclusion_start).apply(_log_window),
                    "end_time": pulumi.Output.from_input(exclusion_start).apply(upgrade_exclusion.end),
                    "exclusion_options": {"scope": upgrade_exclusion.SCOPE},
                }],
            } if exclusion_start is not None else None,
            monitoring_config={
                "enable_components": [*MONITORING_COMPONENTS, "DCGM"],
                "managed_prometheus": {"enabled": True},
            } if args.get("gpu_metrics", True) else None,
            deletion_protection=args["deletion_protection"],
            resource_labels=args.get("resource_labels"),
            min_master_version=args["min_master_version"],
            # Dataplane V2 + multi-networking carry the extra gVNIC/RDMA NICs.
            datapath_provider="ADVANCED_DATAPATH",
            enable_multi_networking=True,
            networking_mode="VPC_NATIVE",
            network=args.get("network"),
            subnetwork=args.get("subnetwork"),
            ip_allocation_policy={
                "stack_type": "IPV4",
                **({"cluster_secondary_range_name": args.get("pods_range"),
                    "services_secondary_range_name": args.get("services_range")} if args.get("subnetwork") else {}),
            },
            # GCS FUSE authenticates pods through Workload Identity.
            workload_identity_config={"workload_pool": f"{project}.svc.id.goog"},
            addons_config=addons,
            master_auth={"client_certificate_config": {"issue_client_certificate": False}},
            master_authorized_networks_config=(
                {"cidr_blocks": [{"cidr_block": c, "display_name": f"authorized-{i}"} for i, c in enumerate(authorized)],
                 # `dns`: the IP endpoint admits no address outside the VPC but these, not even Google
                 # Cloud's public IPs; nodes and Google's services use the internal endpoint or the DNS one.
                 **({"gcp_public_cidrs_access_enabled": False} if dns else {})}
                if authorized or dns else None
            ),
            # GKE's DNS-based endpoint, IAM-checked, for pulumi, kubectl and the CLI.
            control_plane_endpoints_config={"dns_endpoint_config": {"allow_external_traffic": True}} if dns else None,
            enable_k8s_beta_apis={"enabled_apis": list(beta_apis)} if beta_apis else None,
            private_cluster_config=(
                {"enable_private_nodes": True, "enable_private_endpoint": False}
                if args.get("private_nodes", True) else None
            ),
            # Standard: the built-in pool (removed) and the node pools take the account themselves;
            # Autopilot: it goes to every node GKE provisions.
            node_config=node_identity or None if standard else None,
            cluster_autoscaling={"auto_provisioning_defaults": node_identity} if node_identity and not standard else None,
            opts=cluster_opts.merge(pulumi.ResourceOptions(
                depends_on=self.node_identity, ignore_changes=["minMasterVersion"],
                # GKE checks deletion protection only at the cluster's own delete, the last of a destroy;
                # the engine checks `protect` in every delete step, previews too, so a destroy's preview
                # fails before anything is deleted. It also refuses to replace the cluster.
                protect=args["deletion_protection"],
                # A fixed name: a replacement deletes first, and deletes the run before it (GrpoJob).
                delete_before_replace=True)),
        )
        if standard:
            self.cpu_pool = container.NodePool(
                f"{name}-cpu-pool",
                name=HEAD_NODE_POOL,
                project=project,
                cluster=cluster.name,
                location=cluster.location,
                # gcloud's --num-nodes=1: one node per zone to start, even with a floor of 0.
                initial_node_count=max(args["cpu_min_nodes"], 1),
                autoscaling={"min_node_count": args["cpu_min_nodes"], "max_node_count": args["cpu_max_nodes"]},
                node_config={
                    "machine_type": args["cpu_machine_type"],
                    "workload_metadata_config": {"mode": "GKE_METADATA"},
                    "shielded_instance_config": shielded(True),
                    "kubelet_config": dict(KUBELET_READ_ONLY_PORT_CLOSED),
                    **node_identity,
                },
                # Its name is fixed (the Ray head selects it), so a replacement must delete first;
                # after creation the autoscaler owns the size.
                opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True, ignore_changes=["initialNodeCount"],
                                            depends_on=self.node_identity),
            )
        self.node_identity = [cluster, *self.node_identity]
        self.cluster = cluster
        self.identity = cluster.id
        self.name = cluster.name
        self.location = cluster.location
        self.endpoint = cluster.endpoint if not dns else cluster.control_plane_endpoints_config.apply(
            lambda c: cast(str, c.dns_endpoint_config.endpoint if c and c.dns_endpoint_config else None))
        # GKE issues every cluster a CA; the provider types the field optional. pulumi-gcp's secret
        # client key makes the whole masterAuth secret; the CA is public data (clients verify with it).
        self.ca_certificate = pulumi.Output.unsecret(
            cluster.master_auth.apply(lambda auth: cast(str, auth.cluster_ca_certificate)))
