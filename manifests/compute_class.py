"""The GKE custom ComputeClass that orders the GPU workers' capacity kinds (reservation, flex-start,
Spot, on-demand): GKE's autoscaler tries each priority in turn and falls back to the next when it
cannot get nodes (GKE "About custom ComputeClasses"; fields from GKE's ComputeClass CRD reference,
https://cloud.google.com/kubernetes-engine/docs/reference/crds/computeclass).

Standard: each kind is a node pool verl-gke creates (its RDMA networks, reservation or flex-start
setting), labelled and tainted with the class; the priorities name the pools. Autopilot: the
priorities describe the nodes (machine type, GPUs, kind) and GKE creates them.
"""

from __future__ import annotations

from typing import Any

from domain.platforms import gpu_pool_name

COMPUTE_CLASS_LABEL = "cloud.google.com/compute-class"
"""The node label (and, on Standard pools, the taint key) a class's nodes carry; pods select it."""
GPU_CLASS_NAME = "verl-gpu"


pool_name = gpu_pool_name
"""The Standard node pool of one capacity kind when a class orders several (domain.platforms)."""


def toleration(name: str = GPU_CLASS_NAME) -> dict[str, str]:
    """Of the taint GKE asks for on manually created pools of a class (`<label>=<name>:NoSchedule`)."""
    return {"key": COMPUTE_CLASS_LABEL, "operator": "Equal", "value": name, "effect": "NoSchedule"}


def _kind_rule(kind: str, reservation: str, project: str) -> dict[str, Any]:
    """Autopilot: how a priority asks for `kind` of capacity."""
    if kind == "reservation":
        specific: dict[str, Any] = {"name": reservation}
        parts = reservation.split("/")
        if len(parts) >= 4 and parts[0] == "projects" and parts[2] == "reservations":
            specific = {"name": parts[3], "project": parts[1]}  # a reservation shared from another project
        elif project:
            specific["project"] = project
        return {"reservations": {"affinity": "Specific", "specific": [specific]}}
    if kind == "flex-start":
        return {"flexStart": {"enabled": True}}
    return {"spot": kind == "spot"}


def compute_class(*, kinds: list[str], autopilot: bool, machine_type: str = "", accelerator: str = "",
                  gpus_per_node: int = 0, reservation: str = "", project: str = "",
                  name: str = GPU_CLASS_NAME) -> dict[str, Any]:
    """The class whose priorities are `kinds` in order. Nothing outside them: `DoNotScaleUp` rather
    than any machine GKE might find."""
    if autopilot:
        priorities = [{"machineType": machine_type, "gpu": {"type": accelerator, "count": gpus_per_node},
                       **_kind_rule(kind, reservation, project)} for kind in kinds]
    else:
        priorities = [{"nodepools": [pool_name(kind)]} for kind in kinds]
    return {
        "apiVersion": "cloud.google.com/v1",
        "kind": "ComputeClass",
        "metadata": {"name": name},
        "spec": {
            "priorities": priorities,
            # Autopilot always creates its nodes; on Standard the pools exist already.
            "nodePoolAutoCreation": {"enabled": autopilot},
            "whenUnsatisfiable": "DoNotScaleUp",
        },
    }
