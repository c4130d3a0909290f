"""The run supervisor's Kubernetes objects: its program and config in a ConfigMap, a ConfigMap for
its state, a service account whose Role may patch only this RayCluster and that state ConfigMap,
and a one-pod Deployment on the CPU nodes (workloads/run_supervisor.py). Pure builders.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from manifests.staging import IMAGE, RUN_AS, SCRIPT_DIR, off_gpu_nodes, restricted_container

NAME_SUFFIX = "-supervisor"
SCRIPT_FILE = "run_supervisor.py"
CONFIG_FILE = "config.json"
DIGEST_ANNOTATION = "verl-gke/supervisor-sha256"
LABELS = {"app.kubernetes.io/name": "verl-gke", "app.kubernetes.io/component": "run-supervisor"}
"""Also the labels the Ray NetworkPolicy admits to the head's job API."""
RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}}


@dataclass(frozen=True)
class SupervisorSpec:
    namespace: str
    ray_cluster: str
    worker_group: str
    script: str
    config: dict[str, Any]
    """SupervisorConfig's fields (workloads/run_supervisor.py) as JSON."""

    @property
    def name(self) -> str:
        return f"{self.ray_cluster}{NAME_SUFFIX}"

    @property
    def state_config_map(self) -> str:
        return f"{self.name}-state"

    @property
    def digest(self) -> str:
        """Changes with the program or its config, so the pod restarts with the new ones."""
        text = self.script + json.dumps(self.config, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


def _meta(spec: SupervisorSpec, name: str) -> dict[str, Any]:
    return {"name": name, "namespace": spec.namespace, "labels": dict(LABELS)}


def program_config_map(spec: SupervisorSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(spec, spec.name),
            "data": {SCRIPT_FILE: spec.script, CONFIG_FILE: json.dumps(spec.config, indent=2, sort_keys=True)}}


def state_config_map(spec: SupervisorSpec) -> dict[str, Any]:
    """Written by the supervisor only; Pulumi creates it empty and leaves its data alone."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(spec, spec.state_config_map),
            "data": {"state.json": "{}"}}


def service_account(spec: SupervisorSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(spec, spec.name)}


def role(spec: SupervisorSpec) -> dict[str, Any]:
    """Read and patch one RayCluster (its worker replicas) and one ConfigMap (its state): no more."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(spec, spec.name),
        "rules": [
            {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "resourceNames": [spec.ray_cluster],
             "verbs": ["get", "patch"]},
            {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [spec.state_config_map],
             "verbs": ["get", "patch"]},
        ],
    }


def role_binding(spec: SupervisorSpec) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(spec, spec.name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": spec.name},
        "subjects": [{"kind": "ServiceAccount", "name": spec.name, "namespace": spec.namespace}],
    }


def deployment(spec: SupervisorSpec) -> dict[str, Any]:
    """One pod (Recreate: never two supervisors of one run), off the GPU nodes."""
    args = ["--config", f"{SCRIPT_DIR}/{CONFIG_FILE}", "--namespace", spec.namespace,
            "--ray-cluster", spec.ray_cluster, "--worker-group", spec.worker_group,
            "--state-config-map", spec.state_config_map]
    pod = {
        "serviceAccountName": spec.name,
        # The one pod of the stack that calls the Kubernetes API: its token is mounted.
        "automountServiceAccountToken": True,
        "affinity": off_gpu_nodes(),
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "supervisor",
            "image": IMAGE,
            "command": ["python", f"{SCRIPT_DIR}/{SCRIPT_FILE}", *args],
            "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}, {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
            "resources": {kind: dict(values) for kind, values in RESOURCES.items()},
            "securityContext": restricted_container(),
            "volumeMounts": [{"name": "program", "mountPath": SCRIPT_DIR, "readOnly": True}],
        }],
        "volumes": [{"name": "program", "configMap": {"name": spec.name, "defaultMode": 0o444}}],
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(spec, spec.name),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": dict(LABELS)},
            "template": {"metadata": {"labels": dict(LABELS), "annotations": {DIGEST_ANNOTATION: spec.digest}},
                         "spec": pod},
        },
    }
