"""Pod Security in the stack's namespace: the admission policy's CEL, evaluated by a CEL implementation
(cel-python) on the pods the stack creates, as GKE and KubeRay complete them, and on pods that go
beyond Baseline; the manifests against the real schemas."""

from __future__ import annotations

import copy
from typing import Any

import celpy
import pytest

from manifests import pod_security
from manifests.ray_cluster import WORKER_GROUP
from tests.k8s_schema import validate_core

NAMESPACE, CLUSTER = "verl-gke", "b200-ray-cluster"
POLICY = pod_security.admission_policy(namespace=NAMESPACE, ray_cluster=CLUSTER, worker_group=WORKER_GROUP)


def refusals(pod: dict[str, Any], policy: dict[str, Any] = POLICY) -> list[str]:
    """The messages of the policy's validations that fail for `pod` (its variables first, in order)."""
    env = celpy.Environment()
    variables = celpy.celtypes.MapType()
    activation: dict[str, Any] = {"object": celpy.json_to_cel(pod), "variables": variables}
    for variable in policy["spec"]["variables"]:
        variables[celpy.celtypes.StringType(variable["name"])] = env.program(
            env.compile(variable["expression"])).evaluate(activation)
    return [v["message"] for v in policy["spec"]["validations"]
            if not env.program(env.compile(v["expression"])).evaluate(activation)]


def with_gke_sidecar(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """As GKE's gcsfuse webhook completes a pod that mounts the bucket: its native sidecar and emptyDirs
    (GoogleCloudPlatform/gcs-fuse-csi-driver, pkg/webhook/sidecar_spec.go)."""
    spec = copy.deepcopy(pod_spec)
    spec.setdefault("initContainers", []).insert(0, {
        "name": "gke-gcsfuse-sidecar", "image": "gke.gcr.io/gcs-fuse-csi-driver-sidecar-mounter:v1", "restartPolicy": "Always",
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
                            "runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534},
        "volumeMounts": [{"name": "gke-gcsfuse-tmp", "mountPath": "/gcsfuse-tmp"}]})
    spec["volumes"] = [*spec.get("volumes", []), {"name": "gke-gcsfuse-tmp", "emptyDir": {}}]
    return spec


def ray_pod(template: dict[str, Any], group: str | None, cluster: str = CLUSTER) -> dict[str, Any]:
    """A pod KubeRay makes from a group's template: its labels, and for a worker the init container that
    waits for the GCS, with the worker container's security context (KubeRay 1.6 copies it)."""
    spec = with_gke_sidecar(template["spec"])
    labels = {"ray.io/cluster": cluster, "ray.io/node-type": "worker" if group else "head",
              "ray.io/group": group or "headgroup"}
    if group:
        ray = spec["containers"][0]
        spec["initContainers"].append({"name": "wait-gcs-ready", "image": ray["image"],
                                       "securityContext": copy.deepcopy(ray["securityContext"])})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": NAMESPACE, "labels": labels},
            "spec": spec}


def pods_of(result: Any) -> dict[str, dict[str, Any]]:
    pods = {}
    for m in result.manifests():
        if m["kind"] == "RayCluster":
            cluster = m["metadata"]["name"]
            pods["head"] = ray_pod(m["spec"]["headGroupSpec"]["template"], None, cluster)
            for group in m["spec"]["workerGroupSpecs"]:
                pods[group["groupName"]] = ray_pod(group["template"], group["groupName"], cluster)
        elif m["kind"] in ("Job", "Deployment") and m["metadata"].get("namespace") == NAMESPACE:
            template = m["spec"]["template"]
            pods[m["metadata"]["name"]] = {"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": "p", "namespace": NAMESPACE, "labels": template["metadata"].get("labels", {})},
                "spec": with_gke_sidecar(template["spec"])}
    return pods


def test_the_policy_and_its_binding_pass_the_kubernetes_schema():
    for version in ("1.30", "1.34"):
        validate_core(POLICY, version)
        validate_core(pod_security.admission_policy_binding(namespace=NAMESPACE), version)


@pytest.mark.parametrize("stack", ["a4", "a4-standard", "a4x"])
def test_every_pod_the_stack_creates_is_admitted(synth_stack, stack: str):
    result = synth_stack(stack)
    (policy,) = [m for m in result.manifests() if m["kind"] == "ValidatingAdmissionPolicy"
                 and m["metadata"]["name"] == f"{NAMESPACE}.pod-security"]
    pods = pods_of(result)
    assert {"head", WORKER_GROUP, "stage-data"} <= set(pods)
    for name, pod in pods.items():
        assert refusals(pod, policy) == [], name


def _worker(synth_stack) -> dict[str, Any]:
    return copy.deepcopy(pods_of(synth_stack("a4-standard"))[WORKER_GROUP])


def _head(synth_stack) -> dict[str, Any]:
    return copy.deepcopy(pods_of(synth_stack("a4-standard"))["head"])


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["spec"]["containers"][0]


REFUSES = "Pod Security (Baseline, verl-gke) refuses "


@pytest.mark.parametrize("change, what", [
    (lambda p: p["spec"].update(hostNetwork=True), "host namespaces (hostNetwork, hostPID, hostIPC)"),
    (lambda p: p["spec"].update(hostPID=True), "host namespaces (hostNetwork, hostPID, hostIPC)"),
    (lambda p: _container(p)["securityContext"].update(privileged=True), "privileged containers"),
    (lambda p: _container(p)["securityContext"]["capabilities"].update(add=["IPC_LOCK", "SYS_ADMIN"]),
     "capabilities beyond Baseline's (IPC_LOCK on the GPU workers only)"),
    (lambda p: p["spec"]["volumes"].append({"name": "root", "hostPath": {"path": "/"}}),
     "hostPath volumes (the GPU workers: /home/kubernetes/bin/gib, /home/kubernetes/bin/nvidia only)"),
    (lambda p: next(m for m in _container(p)["volumeMounts"] if m["name"] == "gib").pop("readOnly"),
     "a hostPath volume mounted writable"),
    (lambda p: p["spec"]["initContainers"].append({"name": "x", "image": "i", "volumeMounts": [
        {"name": "nvidia", "mountPath": "/n"}]}), "a hostPath volume mounted writable"),
    (lambda p: _container(p).setdefault("ports", []).append({"containerPort": 1, "hostPort": 22}), "host ports"),
    (lambda p: _container(p)["securityContext"].update(seccompProfile={"type": "Unconfined"}),
     "an unconfined seccomp profile"),
    (lambda p: p["spec"]["securityContext"].update(sysctls=[{"name": "kernel.core_pattern", "value": "|x"}]),
     "sysctls beyond the safe set"),
    (lambda p: _container(p)["securityContext"].update(procMount="Unmasked"), "an unmasked /proc"),
    (lambda p: _container(p)["securityContext"].update(appArmorProfile={"type": "Unconfined"}),
     "an unconfined AppArmor profile"),
    (lambda p: p["metadata"].setdefault("annotations", {}).update(
        {"container.apparmor.security.beta.kubernetes.io/ray-worker": "unconfined"}), "an unconfined AppArmor profile"),
    (lambda p: _container(p)["securityContext"].update(seLinuxOptions={"type": "spc_t"}),
     "SELinux options beyond Baseline's"),
    (lambda p: p["spec"].setdefault("ephemeralContainers", []).append(
        {"name": "debug", "image": "i", "securityContext": {"privileged": True}}), "privileged containers"),

    # Baseline v1.34, "Probes and lifecycle hooks": the host field is unset or "" (Pod Security Standards).
    (lambda p: _container(p).update(livenessProbe={"httpGet": {"host": "169.254.169.254", "port": 80}}),
     "a host in probes or lifecycle hooks"),
    (lambda p: _container(p).update(startupProbe={"tcpSocket": {"host": "10.0.0.1", "port": 22}}),
     "a host in probes or lifecycle hooks"),
    (lambda p: _container(p).update(lifecycle={"preStop": {"httpGet": {"host": "example.com", "port": 80}}}),
     "a host in probes or lifecycle hooks"),
    (lambda p: p["spec"]["initContainers"].append({"name": "x", "image": "i", "lifecycle": {
        "postStart": {"tcpSocket": {"host": "10.0.0.1", "port": 1}}}}), "a host in probes or lifecycle hooks"),
])
def test_a_gpu_worker_beyond_its_named_exceptions_is_refused(synth_stack, change, what: str):
    pod = _worker(synth_stack)
    assert refusals(pod) == []
    change(pod)
    assert refusals(pod) == [REFUSES + what]


def test_probes_and_hooks_without_a_host_pass(synth_stack):
    pod = _worker(synth_stack)
    _container(pod).update(readinessProbe={"httpGet": {"host": "", "port": 8265, "path": "/"}},
                           lifecycle={"preStop": {"exec": {"command": ["true"]}}, "postStart": {"tcpSocket": {"port": 1}}})
    assert refusals(pod) == []


def test_the_workers_exceptions_are_the_workers_alone(synth_stack):
    """The head (and any other pod) may neither mount the driver's host path nor add IPC_LOCK: a pod
    that only claims the worker group's labels in another RayCluster gets nothing either."""
    worker = _worker(synth_stack)
    head = _head(synth_stack)
    head["spec"]["volumes"] += [v for v in worker["spec"]["volumes"] if "hostPath" in v]
    _container(head)["volumeMounts"] += [m for m in _container(worker)["volumeMounts"] if m["name"] in ("gib", "nvidia")]
    _container(head)["securityContext"]["capabilities"]["add"] = ["IPC_LOCK"]
    assert sorted(refusals(head)) == sorted([
        REFUSES + "capabilities beyond Baseline's (IPC_LOCK on the GPU workers only)",
        REFUSES + "hostPath volumes (the GPU workers: /home/kubernetes/bin/gib, /home/kubernetes/bin/nvidia only)"])
    worker["metadata"]["labels"]["ray.io/cluster"] = "another-cluster"
    assert len(refusals(worker)) == 2


def test_it_binds_pods_of_the_stacks_namespace_with_deny():
    rules = POLICY["spec"]["matchConstraints"]
    assert rules["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
    assert rules["resourceRules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                                       "resources": ["pods", "pods/ephemeralcontainers"]}]
    assert POLICY["spec"]["failurePolicy"] == "Fail"
    binding = pod_security.admission_policy_binding(namespace=NAMESPACE)
    assert binding["spec"] == {"policyName": f"{NAMESPACE}.pod-security", "validationActions": ["Deny"],
                               "matchResources": {"namespaceSelector": rules["namespaceSelector"]}}
