"""GKE's ComputeClass (cloud.google.com/v1), as GKE documents it.

GKE installs this CRD itself and publishes no CRD file to pin (unlike KubeRay and the NVIDIA DRA
driver), so manifests are checked against this schema, written from GKE's reference page
https://cloud.google.com/kubernetes-engine/docs/reference/crds/computeclass (read 2026-12-03): the
fields verl-gke writes and their neighbours, unknown fields rejected, enums as documented.
"""

from __future__ import annotations

from typing import Any

_RESERVATIONS: dict[str, Any] = {
    "type": "object",
    "required": ["affinity"],
    "properties": {
        "affinity": {"type": "string", "enum": ["Specific", "AnyBestEffort", "None"]},
        "specific": {"type": "array", "items": {
            "type": "object", "required": ["name"],
            "properties": {"name": {"type": "string"}, "project": {"type": "string"},
                           "reservationBlock": {"type": "object", "properties": {"name": {"type": "string"}}}},
        }},
    },
}

_PRIORITY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "machineFamily": {"type": "string"},
        "machineType": {"type": "string"},
        "minCores": {"type": "integer"},
        "minMemoryGb": {"type": "integer"},
        "spot": {"type": "boolean"},
        "nodepools": {"type": "array", "items": {"type": "string"}},
        "gpu": {"type": "object", "required": ["type", "count"],
                "properties": {"type": {"type": "string"}, "count": {"type": "integer", "minimum": 1},
                               "driverVersion": {"type": "string"}}},
        "reservations": _RESERVATIONS,
        "flexStart": {"type": "object", "properties": {"enabled": {"type": "boolean"},
                                                       "nodeRecycling": {"type": "object"}}},
        "maxRunDurationSeconds": {"type": "integer"},
        "placement": {"type": "object", "properties": {"policyName": {"type": "string"}}},
    },
}

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"type": "string", "enum": ["cloud.google.com/v1"]},
        "kind": {"type": "string", "enum": ["ComputeClass"]},
        "metadata": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}},
                     "additionalProperties": True},
        "spec": {
            "type": "object",
            "required": ["priorities"],
            "properties": {
                "priorities": {"type": "array", "minItems": 1, "items": _PRIORITY},
                "nodePoolAutoCreation": {"type": "object", "properties": {"enabled": {"type": "boolean"}}},
                "whenUnsatisfiable": {"type": "string", "enum": ["ScaleUpAnyway", "DoNotScaleUp"]},
                "activeMigration": {"type": "object", "properties": {"optimizeRulePriority": {"type": "boolean"}}},
                "description": {"type": "string"},
            },
        },
    },
}
