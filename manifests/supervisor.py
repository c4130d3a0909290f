"""The run supervisor's Kubernetes objects: its program (workloads/run_supervisor.py and the modules
it imports) and config in a ConfigMap, a service account whose Role may keep the run records
(ConfigMaps), its Lease and this RayCluster's `spec.suspend`, two ValidatingAdmissionPolicies that hold
those writes to what they are for (its RayCluster patches change spec.suspend only; its ConfigMap writes
touch run records of this cluster only, never its own program), and a one-pod Deployment on the CPU
nodes. Pure builders. The run records (one ConfigMap per run, workloads/run_record.py) are created by
whoever decides first for a run and live as long as the namespace (`pulumi destroy` removes them).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from workloads.kube import AUTH_TOKEN_KEY
from manifests.staging import IMAGE, RUN_AS, SCRIPT_DIR, off_gpu_nodes, restricted_container
from workloads.run_record import CLUSTER_LABEL, COMPONENT, LEGACY_SUFFIX

NAME_SUFFIX = "-supervisor"
PROGRAM_FILES = ("run_supervisor.py", "run_lifecycle.py", "run_record.py", "run_lease.py", "run_logs.py", "kube.py",
                 "export_model.py", "gcs.py")
"""The modules of package `workloads` the supervisor runs, mounted as SCRIPT_DIR/workloads/<file>
(export_model.py also goes on to the Ray node that merges the model, as a job's working_dir)."""
MODULE = "workloads.run_supervisor"
CONFIG_FILE = "config.json"
DIGEST_ANNOTATION = "verl-gke/supervisor-sha256"
LABELS = {"app.kubernetes.io/name": "verl-gke", "app.kubernetes.io/component": "run-supervisor"}
"""Also the labels the Ray NetworkPolicy admits to the head's job API."""
RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}}
RAY_CLUSTER_SPEC_FIELDS = ("authOptions", "autoscalerOptions", "enableInTreeAutoscaling", "gcsFaultToleranceOptions",
                           "headGroupSpec", "headServiceAnnotations", "managedBy", "rayVersion", "upgradeStrategy",
                           "workerGroupSpecs")
"""RayCluster ray.io/v1 spec fields but suspend, from the pinned KubeRay v1.6.2 CRD (tests/k8s_schema.py;
a test fails when the CRD's list changes). Fields the schema does not know are pruned by the API server."""


@dataclass(frozen=True)
class SupervisorSpec:
    namespace: str
    ray_cluster: str
    programs: dict[str, str]
    """PROGRAM_FILES' texts by file name."""
    config: dict[str, Any]
    """SupervisorConfig's fields (workloads/run_supervisor.py) as JSON."""
    ray_token_secret: str | None = None
    """The Secret with the Ray cluster's token (manifests.ray_cluster.token_secret), where it has one."""

    @property
    def name(self) -> str:
        return f"{self.ray_cluster}{NAME_SUFFIX}"

    @property
    def digest(self) -> str:
        """Changes with the program or its config, so the pod restarts with the new ones."""
        text = "".join(self.programs[f] for f in PROGRAM_FILES) + json.dumps(self.config, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


def run_record_name(ray_cluster: str) -> str:
    """The prefix of the run record ConfigMaps of the stack whose RayCluster this is
    (`<prefix>-<12 hex of the run id>`, workloads/run_record.record_name); 0.5.1's one record."""
    return f"{ray_cluster}{LEGACY_SUFFIX}"


def _meta(spec: SupervisorSpec, name: str) -> dict[str, Any]:
    return {"name": name, "namespace": spec.namespace, "labels": dict(LABELS)}


def program_config_map(spec: SupervisorSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(spec, spec.name),
            "data": {**{f: spec.programs[f] for f in PROGRAM_FILES},
                     CONFIG_FILE: json.dumps(spec.config, indent=2, sort_keys=True)}}


def service_account(spec: SupervisorSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(spec, spec.name)}


def lease_name(ray_cluster: str) -> str:
    """The Lease that says who decides for the runs on this RayCluster (workloads/run_lease.py)."""
    return f"{ray_cluster}-decider"


def role(spec: SupervisorSpec) -> dict[str, Any]:
    """Read and patch one RayCluster (its `spec.suspend`); keep the run records (ConfigMaps: RBAC
    cannot limit list and create to names, nor any verb to labels, so the record admission policy
    holds the writes to run records of this cluster); read its own program's ConfigMap (to notice a
    rollout); keep its Lease (create cannot be limited to a name either); read the Ray token Secret,
    where there is one. No more."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(spec, spec.name),
        "rules": [
            {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "resourceNames": [spec.ray_cluster],
             "verbs": ["get", "patch"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "create", "update", "delete"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "resourceNames": [lease_name(spec.ray_cluster)], "verbs": ["get", "update"]},
            # The Ray token KubeRay writes anew when the RayCluster is replaced (the pod's env keeps the old).
            *([{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [spec.ray_token_secret],
                "verbs": ["get"]}] if spec.ray_token_secret else []),
        ],
    }


def _unchanged(path: str) -> str:
    """CEL: `path` is absent in both objects or equal in both."""
    return (f"has(object.{path}) == has(oldObject.{path}) && "
            f"(!has(object.{path}) || object.{path} == oldObject.{path})")


def admission_policy_name(spec: SupervisorSpec) -> str:
    """Cluster-scoped: the namespace makes it the stack's own."""
    return f"{spec.namespace}.{spec.name}"


def admission_policy(spec: SupervisorSpec) -> dict[str, Any]:
    """RBAC lets the supervisor patch the whole RayCluster; this policy lets its updates change
    spec.suspend only, so it cannot rewrite the pod templates KubeRay creates pods from.
    Kubernetes docs, "Validating Admission Policy"
    (https://kubernetes.io/docs/reference/access-authn-authz/validating-admission-policy/, read 2026-12-04):
    admissionregistration.k8s.io/v1 (GA in 1.30), matchConditions filter requests, `object`/`oldObject`
    and `request.userInfo` in CEL. Object types are not iterable in Kubernetes CEL, so each spec field is named.
    """
    # Owner references and finalizers too: a dangling owner makes the garbage collector delete the cluster.
    checks = [f"spec.{f}" for f in RAY_CLUSTER_SPEC_FIELDS] + [
        f"metadata.{f}" for f in ("labels", "annotations", "ownerReferences", "finalizers")]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": admission_policy_name(spec), "labels": dict(LABELS)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": spec.namespace}},
                "resourceRules": [{"apiGroups": ["ray.io"], "apiVersions": ["v1"], "operations": ["UPDATE"],
                                   "resources": ["rayclusters"], "resourceNames": [spec.ray_cluster]}],
            },
            "matchConditions": [{
                "name": "run-supervisor",
                "expression": f"request.userInfo.username == 'system:serviceaccount:{spec.namespace}:{spec.name}'",
            }],
            "validations": [{"expression": _unchanged(path),
                             "message": f"the run supervisor may change only spec.suspend, not {path}"}
                            for path in checks],
        },
    }


def admission_policy_binding(spec: SupervisorSpec, name: str | None = None) -> dict[str, Any]:
    name = name or admission_policy_name(spec)
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": dict(LABELS)},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {
                     "matchLabels": {"kubernetes.io/metadata.name": spec.namespace}}}},
    }


def record_policy_name(spec: SupervisorSpec) -> str:
    return f"{spec.namespace}.{spec.name}-records"


def _is_record(obj: str, spec: SupervisorSpec) -> str:
    """CEL: `obj` is a run record ConfigMap of this cluster (labels and name)."""
    labels = f"{obj}.metadata.labels"
    return (f"has({obj}.metadata.labels) && "
            f"'app.kubernetes.io/component' in {labels} && {labels}['app.kubernetes.io/component'] == '{COMPONENT}' && "
            f"'{CLUSTER_LABEL}' in {labels} && {labels}['{CLUSTER_LABEL}'] == '{spec.ray_cluster}' && "
            f"{obj}.metadata.name.startsWith('{run_record_name(spec.ray_cluster)}-')")


def record_admission_policy(spec: SupervisorSpec) -> dict[str, Any]:
    """The supervisor's ConfigMap writes (create, update, delete) touch run records of this cluster
    only, and the only Lease it creates is its own: RBAC cannot say so (resourceNames does not limit
    create), and without it the supervisor could rewrite its own program or take another cluster's Lease. On DELETE
    `object` is null and `oldObject` the object (Kubernetes docs, "Validating Admission Policy",
    variables `object` and `oldObject`)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": record_policy_name(spec), "labels": dict(LABELS)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": spec.namespace}},
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                                   "operations": ["CREATE", "UPDATE", "DELETE"]},
                                  # RBAC cannot limit create to a name (resourceNames does not apply to it).
                                  {"apiGroups": ["coordination.k8s.io"], "apiVersions": ["v1"],
                                   "resources": ["leases"], "operations": ["CREATE"]}],
            },
            "matchConditions": [{
                "name": "run-supervisor",
                "expression": f"request.userInfo.username == 'system:serviceaccount:{spec.namespace}:{spec.name}'",
            }],
            "validations": [
                {"expression": f"object == null || object.kind == 'Lease' || ({_is_record('object', spec)})",
                 "message": "the run supervisor may write only run record ConfigMaps of its RayCluster"},
                {"expression": f"object == null || object.kind != 'Lease' || "
                               f"object.metadata.name == '{lease_name(spec.ray_cluster)}'",
                 "message": f"the run supervisor may create only its Lease {lease_name(spec.ray_cluster)}"},
                {"expression": f"oldObject == null || ({_is_record('oldObject', spec)})",
                 "message": "the run supervisor may change or delete only run record ConfigMaps of its RayCluster"},
            ],
        },
    }


def role_binding(spec: SupervisorSpec) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(spec, spec.name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": spec.name},
        "subjects": [{"kind": "ServiceAccount", "name": spec.name, "namespace": spec.namespace}],
    }


def deployment(spec: SupervisorSpec) -> dict[str, Any]:
    """One pod (Recreate: a rollout never overlaps; two pods would still decide one at a time, by the
    Lease), off the GPU nodes."""
    args = ["--config", f"{SCRIPT_DIR}/{CONFIG_FILE}", "--namespace", spec.namespace,
            "--ray-cluster", spec.ray_cluster, "--program-dir", SCRIPT_DIR]
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
            # SCRIPT_DIR/workloads/ holds the program's modules under their package names.
            "command": ["python", "-m", MODULE, *args],
            "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}, {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
                    {"name": "PYTHONPATH", "value": SCRIPT_DIR},
                    # The head's Job API wants the cluster's token (workloads/run_lifecycle.RayJobs sends it).
                    *([{"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {
                        "name": spec.ray_token_secret, "key": AUTH_TOKEN_KEY}}}] if spec.ray_token_secret else [])],
            "resources": {kind: dict(values) for kind, values in RESOURCES.items()},
            "securityContext": restricted_container(),
            "volumeMounts": [{"name": "program", "mountPath": SCRIPT_DIR, "readOnly": True}],
        }],
        "volumes": [{"name": "program", "configMap": {
            "name": spec.name, "defaultMode": 0o444,
            "items": [*({"key": f, "path": f"workloads/{f}"} for f in PROGRAM_FILES),
                      {"key": CONFIG_FILE, "path": CONFIG_FILE}]}}],
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
