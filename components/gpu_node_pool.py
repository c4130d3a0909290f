"""The tutorial's `gcloud container node-pools create gpu-pool` (A4, A3 Ultra) and the A4X pool that
Cluster Toolkit's gke-a4x blueprint builds. Standard clusters only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NotRequired, TypedDict

import pulumi
from pulumi_gcp import compute, container

from components.children import child_options
from components.gke_cluster import KUBELET_READ_ONLY_PORT_CLOSED, NODE_SCOPES, shielded
from domain.platforms import GPU_POOL_NAME, PLATFORMS, PlatformName
from domain.pricing import CapacityKind
from manifests import compute_class as cc

RESERVATION_KEY = "compute.googleapis.com/reservation-name"
# GKE runs its managed DRANET driver (which publishes the NICs as mrdma.google.com devices) only on
# nodes with this label; the accelerator network profile alone attaches the NICs but exposes none
# (GKE "Allocate network resources by using GKE managed DRANET"; Cluster Toolkit enable_dranet).
DRANET_NODE_LABEL = "cloud.google.com/gke-networking-dra-driver"
# GKE puts this taint on GPU nodes of clusters that also have CPU pools; the Ray workers tolerate it.
GPU_TAINT: container.NodePoolNodeConfigTaintArgsDict = {"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}


NodeNetwork = container.NodePoolNetworkConfigAdditionalNodeNetworkConfigArgsDict
"""One extra NIC of every node: the `network` and `subnetwork` it is attached to."""


class GpuNodePoolArgs(TypedDict):
    project: str
    cluster: pulumi.Input[str]
    """Name of the cluster (GkeCluster.name), so the pool waits for it and is destroyed before it."""
    location: str
    """The cluster's location (control-plane region)."""
    zone: str
    """The one zone of the GPU nodes (the tutorial's NODE_ZONE, where the reservation is)."""
    platform: PlatformName
    """Key of domain.platforms.PLATFORMS: machine type, accelerator and GPU count come from there."""
    reservation: str | None
    """Specific reservation the nodes consume (the tutorial's RESERVATION); None consumes none."""
    nodes: int
    """Nodes created with the pool (the tutorial starts 2); the autoscaler owns the size afterwards."""
    max_nodes: int
    """Autoscaling ceiling for the whole pool (the tutorial's --total-max-nodes=10)."""
    spot: bool
    """Spot VMs instead of on-demand/reserved capacity."""
    additional_node_networks: NotRequired[pulumi.Input[Sequence[pulumi.Input[NodeNetwork]]] | None]
    """Extra NICs, gVNIC first then RDMA 0..N-1 (RdmaNetwork.node_networks)."""
    accelerator_network_profile: NotRequired[str | None]
    """`auto`: GKE creates and attaches the accelerator networks itself (A4X DRANET)."""
    accelerator_topology: NotRequired[str | None]
    """NVLink domain for a COMPACT placement under a HIGH_THROUGHPUT workload policy (A4X: `1x72`)."""
    image_streaming: NotRequired[bool]
    """GKE image streaming (default True): containers start while the image is still being read,
    for images in Artifact Registry; other registries are pulled as usual."""
    service_account: NotRequired[pulumi.Input[str] | None]
    """The nodes' service account (GkeCluster.node_service_account); None: Compute Engine's default."""
    capacity: NotRequired[CapacityKind | None]
    """Where the nodes come from; None: the reservation if named, else Spot if `spot`, else on-demand."""
    compute_class: NotRequired[str | None]
    """A custom ComputeClass whose priorities name this pool: its label and taint go on the nodes."""
    pool_name: NotRequired[str]
    """The pool's name (default GPU_POOL_NAME); one per capacity kind when a ComputeClass orders several."""


class GpuNodePool(pulumi.ComponentResource):
    """The GPU node pool, on its reservation and extra networks, with its placement policy if any."""

    node_pool: container.NodePool
    """The pool itself: the run is replaced with it (its replacement deletes the workers)."""

    def __init__(self, name: str, args: GpuNodePoolArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("verl-gke:index:GpuNodePool", name, {}, opts)
        platform_name = args["platform"]
        if platform_name not in PLATFORMS:
            raise ValueError(f"GpuNodePool: platform = {platform_name!r}: must be one of {', '.join(sorted(PLATFORMS))}")
        platform = PLATFORMS[platform_name]
        networks = args.get("additional_node_networks")
        profile = args.get("accelerator_network_profile")
        if networks is not None and profile is not None:
            raise ValueError(
                f"GpuNodePool: accelerator_network_profile = {profile!r} makes GKE attach the networks itself; "
                "leave additional_node_networks unset with it"
            )
        if not 1 <= args["nodes"] <= args["max_nodes"]:
            raise ValueError(
                f"GpuNodePool: nodes = {args['nodes']}, max_nodes = {args['max_nodes']}: need 1 <= nodes <= max_nodes"
            )
        reservation = args["reservation"]
        if args["spot"] and reservation:
            raise ValueError(
                f"GpuNodePool: spot = True with reservation = {reservation!r}: Spot VMs cannot consume a "
                "reservation; set reservation to None for Spot, or spot to False"
            )
        kind = args.get("capacity") or ("reservation" if reservation else "spot" if args["spot"] else "on-demand")
        if (kind == "reservation") != bool(reservation) or (args["spot"] and kind != "spot"):
            raise ValueError(f"GpuNodePool: capacity = {kind!r} with reservation = {reservation!r}, spot = "
                             f"{args['spot']}: a reservation is consumed by capacity 'reservation' only, Spot is 'spot'")
        flex = kind == "flex-start"
        if flex and args.get("accelerator_topology"):
            raise ValueError("GpuNodePool: capacity = 'flex-start' with an accelerator_topology: a fixed-size "
                             "COMPACT pool cannot start at zero nodes")
        name_in_gke = args.get("pool_name") or GPU_POOL_NAME
        klass = args.get("compute_class")
        project, location = args["project"], args["location"]
        # Both have fixed names, so a replacement must delete first.
        child = child_options(self, opts).merge(pulumi.ResourceOptions(delete_before_replace=True))

        placement: container.NodePoolPlacementPolicyArgsDict | None = None
        topology = args.get("accelerator_topology")
        if topology:
            policy = compute.ResourcePolicy(
                f"{name}-workload-policy",
                # Unique per project and region, like the cluster name it starts with.
                name=pulumi.Output.from_input(args["cluster"]).apply(lambda c: f"{c}-{name_in_gke}-placement"),
                project=project,
                # The policy lives in the nodes' region, also when the cluster is zonal.
                region=args["zone"].rsplit("-", 1)[0],
                workload_policy={"type": "HIGH_THROUGHPUT", "accelerator_topology": topology},
                opts=child,
            )
            placement = {"type": "COMPACT", "policy_name": policy.name}

        fixed = args.get("accelerator_topology") is not None
        network_config: container.NodePoolNetworkConfigArgsDict | None = None
        if networks is not None:
            network_config = {"additional_node_network_configs": networks}
        elif profile is not None:
            network_config = {"accelerator_network_profile": profile}

        # Flex-start nodes come when pods wait for them and go after seven days at most: the pool starts
        # empty, scales from zero in any zone of its list, and is not auto-repaired (GKE "Run a small batch
        # workload with flex-start provisioning mode": --flex-start --num-nodes=0 --location-policy=ANY
        # --reservation-affinity=none --no-enable-autorepair).
        flex_settings: dict = ({"management": {"auto_repair": False, "auto_upgrade": True}} if flex else {})
        self.node_pool = container.NodePool(
            f"{name}-pool",
            name=name_in_gke,
            **flex_settings,
            project=project,
            cluster=args["cluster"],
            location=location,
            node_locations=[args["zone"]],
            # A4X: a fixed size. A 1x72 pool holds a whole NVLink sub-block; scaling it down gives
            # the machines back, and they may not come back (Cluster Toolkit's gke-a4x does the same).
            **({"node_count": args["nodes"]} if fixed else {
                "initial_node_count": 0 if flex else args["nodes"],
                "autoscaling": {"total_min_node_count": 0, "total_max_node_count": args["max_nodes"],
                                **({"location_policy": "ANY"} if flex else {})},
            }),
            placement_policy=placement,
            network_config=network_config,
            # A reservation has no spare machine for a surge node: upgrade one node at a time in place
            # (Cluster Toolkit's setting for reserved GPU pools).
            upgrade_settings={"strategy": "SURGE", "max_surge": 0, "max_unavailable": 1},
            node_config={
                "machine_type": platform.machine_type,
                # From the platform table, not GKE's default for the machine.
                "disk_type": platform.boot_disk_type,
                "disk_size_gb": platform.boot_disk_gb,
                "guest_accelerators": [{
                    "type": platform.accelerator,
                    "count": platform.gpus_per_node,
                    "gpu_driver_installation_config": {"gpu_driver_version": "DEFAULT"},
                }],
                "reservation_affinity": (
                    {"consume_reservation_type": "SPECIFIC_RESERVATION", "key": RESERVATION_KEY, "values": [reservation]}
                    if reservation else {"consume_reservation_type": "NO_RESERVATION"}
                ),
                "spot": kind == "spot",
                **({"flex_start": True} if flex else {}),
                "taints": [GPU_TAINT, *([{"key": cc.COMPUTE_CLASS_LABEL, "value": klass, "effect": "NO_SCHEDULE"}]
                                        if klass else [])],
                **({"labels": {**({DRANET_NODE_LABEL: "true"} if profile is not None else {}),
                               **({cc.COMPUTE_CLASS_LABEL: klass} if klass else {})}}
                   if profile is not None or klass else {}),
                "workload_metadata_config": {"mode": "GKE_METADATA"},
                "shielded_instance_config": shielded(platform.secure_boot),
                "kubelet_config": dict(KUBELET_READ_ONLY_PORT_CLOSED),
                "gcfs_config": {"enabled": args.get("image_streaming", True)},
                **({"service_account": args["service_account"], "oauth_scopes": NODE_SCOPES}
                   if args.get("service_account") else {}),
                # Ephemeral storage on the machine's Local SSDs: the workers' 500-1000Gi would not fit
                # on the boot disk. 0 = the machine type's bundled count (GKE API,
                # EphemeralStorageLocalSsdConfig.local_ssd_count), where the table has none.
                "ephemeral_storage_local_ssd_config": {"local_ssd_count": platform.local_ssd_count or 0},
            },
            # After creation the autoscaler owns the size; GKE reports the machine's own Local SSD count
            # back where 0 was sent (Cluster Toolkit's gke-node-pool ignores both the same way).
            opts=child.merge(pulumi.ResourceOptions(
                ignore_changes=[*([] if fixed else ["initialNodeCount"]), "nodeConfig.ephemeralStorageLocalSsdConfig"],
            )),
        )
        self.register_outputs({})
