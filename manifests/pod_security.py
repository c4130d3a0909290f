"""Pod Security for the stack's namespace: the Baseline level, and the GPU workers' two named
exceptions, enforced by a ValidatingAdmissionPolicy.

The GPU workers need read-only host paths (WORKER_HOST_PATHS: the NVIDIA driver, the gIB NCCL plugin)
and IPC_LOCK (NCCL's RDMA pins buffers), which no Pod Security level admits and GKE exposes no
exemptions; so the namespace's `enforce` label stays `privileged` and this policy enforces Baseline's
controls (Pod Security Standards, Kubernetes 1.34) on every pod, with those exceptions for the GPU
worker group alone. It runs after the mutating webhooks, so it sees the gcsfuse sidecar. Pure builders.
"""

from __future__ import annotations

from typing import Any

from manifests import dra
from manifests.nccl import HOST_GIB

WORKER_HOST_PATHS = (HOST_GIB, dra.NVIDIA_DRIVER_ROOT)
"""The gIB plugin and the NVIDIA driver the GPU workers mount read-only (manifests/ray_cluster.py)."""
WORKER_CAPABILITIES = ("IPC_LOCK",)
BASELINE_CAPABILITIES = ("AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT")
SAFE_SYSCTLS = ("kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes")
SELINUX_TYPES = ("", "container_t", "container_init_t", "container_kvm_t", "container_engine_t")
LABELS = {"app.kubernetes.io/name": "verl-gke", "app.kubernetes.io/component": "pod-security"}


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _unset_or(path: str, value: str) -> str:
    """CEL: the field at `path` (`object.x.y`) is absent or equals `value`."""
    return f"(!has({path}) || {path} == {value})"


def variables(ray_cluster: str, worker_group: str) -> list[dict[str, str]]:
    containers = ("object.spec.containers"
                  " + (has(object.spec.initContainers) ? object.spec.initContainers : [])"
                  " + (has(object.spec.ephemeralContainers) ? object.spec.ephemeralContainers : [])")
    return [
        {"name": "containers", "expression": containers},
        {"name": "gpuWorker", "expression": (
            "has(object.metadata.labels)"
            f" && 'ray.io/cluster' in object.metadata.labels && object.metadata.labels['ray.io/cluster'] == '{ray_cluster}'"
            f" && 'ray.io/group' in object.metadata.labels && object.metadata.labels['ray.io/group'] == '{worker_group}'")},
        {"name": "hostPathVolumes", "expression": (
            "has(object.spec.volumes) ? object.spec.volumes.filter(v, has(v.hostPath)).map(v, v.name) : []")},
        {"name": "capabilities", "expression": (
            "variables.gpuWorker ? " + _cel_list(BASELINE_CAPABILITIES + WORKER_CAPABILITIES)
            + " : " + _cel_list(BASELINE_CAPABILITIES))},
    ]


def _no_host(handler: str) -> str:
    """CEL: the handler at `handler` (`c.livenessProbe`) has no httpGet or tcpSocket host but ''."""
    parts = handler.split(".")
    present = " && ".join(f"has({'.'.join(parts[:i + 1])})" for i in range(1, len(parts)))
    return (f"(!({present}) || (" + " && ".join(
        f"(!has({handler}.{kind}) || !has({handler}.{kind}.host) || {handler}.{kind}.host == '')"
        for kind in ("httpGet", "tcpSocket")) + "))")


def _each_container(condition: str) -> str:
    return f"variables.containers.all(c, {condition})"


def validations() -> list[dict[str, str]]:
    """Each Baseline control (and the workers' exceptions) as one validation naming what it refuses."""
    sc = "has(c.securityContext)"
    pod_sc = "has(object.spec.securityContext)"
    checks = [
        ("host namespaces (hostNetwork, hostPID, hostIPC)",
         " && ".join(_unset_or(f"object.spec.{f}", "false") for f in ("hostNetwork", "hostPID", "hostIPC"))),
        ("privileged containers",
         _each_container(f"!{sc} || !has(c.securityContext.privileged) || c.securityContext.privileged == false")),
        ("Windows HostProcess containers",
         f"(!{pod_sc} || !has(object.spec.securityContext.windowsOptions) || "
         "!has(object.spec.securityContext.windowsOptions.hostProcess) || "
         "object.spec.securityContext.windowsOptions.hostProcess == false) && "
         + _each_container(f"!{sc} || !has(c.securityContext.windowsOptions) || "
                           "!has(c.securityContext.windowsOptions.hostProcess) || "
                           "c.securityContext.windowsOptions.hostProcess == false")),
        ("capabilities beyond Baseline's (IPC_LOCK on the GPU workers only)",
         _each_container(f"!{sc} || !has(c.securityContext.capabilities) || "
                         "!has(c.securityContext.capabilities.add) || "
                         "c.securityContext.capabilities.add.all(a, a in variables.capabilities)")),
        (f"hostPath volumes (the GPU workers: {', '.join(WORKER_HOST_PATHS)} only)",
         "!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.hostPath) || "
         f"(variables.gpuWorker && v.hostPath.path in {_cel_list(WORKER_HOST_PATHS)}))"),
        ("a hostPath volume mounted writable",
         _each_container("!has(c.volumeMounts) || c.volumeMounts.all(m, !(m.name in variables.hostPathVolumes) || "
                         "(has(m.readOnly) && m.readOnly == true))")),
        ("host ports",
         _each_container("!has(c.ports) || c.ports.all(p, !has(p.hostPort) || p.hostPort == 0)")),
        ("an unconfined AppArmor profile",
         f"(!{pod_sc} || !has(object.spec.securityContext.appArmorProfile) || "
         "object.spec.securityContext.appArmorProfile.type != 'Unconfined') && "
         + _each_container(f"!{sc} || !has(c.securityContext.appArmorProfile) || "
                           "c.securityContext.appArmorProfile.type != 'Unconfined'")
         + " && (!has(object.metadata.annotations) || object.metadata.annotations.all(k, "
         "!k.startsWith('container.apparmor.security.beta.kubernetes.io/') || "
         "object.metadata.annotations[k] == 'runtime/default' || object.metadata.annotations[k].startsWith('localhost/')))"),
        ("SELinux options beyond Baseline's",
         f"(!{pod_sc} || !has(object.spec.securityContext.seLinuxOptions) || "
         "(!has(object.spec.securityContext.seLinuxOptions.user) && !has(object.spec.securityContext.seLinuxOptions.role)"
         f" && (!has(object.spec.securityContext.seLinuxOptions.type) || object.spec.securityContext.seLinuxOptions.type"
         f" in {_cel_list(SELINUX_TYPES)}))) && "
         + _each_container(f"!{sc} || !has(c.securityContext.seLinuxOptions) || "
                           "(!has(c.securityContext.seLinuxOptions.user) && !has(c.securityContext.seLinuxOptions.role)"
                           " && (!has(c.securityContext.seLinuxOptions.type) || c.securityContext.seLinuxOptions.type"
                           f" in {_cel_list(SELINUX_TYPES)}))")),
        ("an unmasked /proc",
         _each_container(f"!{sc} || !has(c.securityContext.procMount) || c.securityContext.procMount == 'Default'")),
        ("an unconfined seccomp profile",
         f"(!{pod_sc} || !has(object.spec.securityContext.seccompProfile) || "
         "object.spec.securityContext.seccompProfile.type != 'Unconfined') && "
         + _each_container(f"!{sc} || !has(c.securityContext.seccompProfile) || "
                           "c.securityContext.seccompProfile.type != 'Unconfined'")),
        # Baseline from v1.34 ("Probes and lifecycle hooks"): a host would make the kubelet call another machine.
        ("a host in probes or lifecycle hooks",
         _each_container(" && ".join(
             _no_host(f"c.{handler}") for handler in ("livenessProbe", "readinessProbe", "startupProbe",
                                                      "lifecycle.postStart", "lifecycle.preStop")))),
        ("sysctls beyond the safe set",
         f"!{pod_sc} || !has(object.spec.securityContext.sysctls) || "
         f"object.spec.securityContext.sysctls.all(s, s.name in {_cel_list(SAFE_SYSCTLS)})"),
    ]
    return [{"expression": expression, "message": f"Pod Security (Baseline, verl-gke) refuses {what}"}
            for what, expression in checks]


def policy_name(namespace: str) -> str:
    """Cluster-scoped: the namespace makes it the stack's own."""
    return f"{namespace}.pod-security"


def admission_policy(*, namespace: str, ray_cluster: str, worker_group: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": policy_name(namespace), "labels": dict(LABELS)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                                   "resources": ["pods", "pods/ephemeralcontainers"]}],
            },
            "variables": variables(ray_cluster, worker_group),
            "validations": validations(),
        },
    }


def admission_policy_binding(*, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy_name(namespace), "labels": dict(LABELS)},
        "spec": {"policyName": policy_name(namespace), "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {
                     "matchLabels": {"kubernetes.io/metadata.name": namespace}}}},
    }
