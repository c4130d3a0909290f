"""The NCCL RDMA installer DaemonSet: verl-gke's own on Standard clusters, Google's manifest on Autopilot.

The tutorial applies Google's manifests from `refs/heads/master` of
GoogleCloudPlatform/container-engine-accelerators, which has changed since it was written, and whose
installer image is named by tag. On Standard clusters verl-gke builds the same DaemonSet itself
(`installer_daemonset`, written after Google's at NCCL_INSTALLER_COMMIT) so that its image is pulled
by digest. Autopilot gets Google's manifest at that commit, as written (`installer_url`).
"""

from __future__ import annotations

import re
from typing import Any

from domain.platforms import NCCL_INSTALLER_REPO, Platform, is_nccl_installer_url

NCCL_INSTALLER_COMMIT = "07a8e6c9b2208ee865a1fb9b9b246e10adfd7738"
"""The last commit (2026-04-02) whose installers still run `container_entry.sh install --install-nccl`.

The tutorial's workers mount the host's /home/kubernetes/bin/nvidia at /usr/local/nvidia and put
/usr/local/nvidia/lib64 on LD_LIBRARY_PATH, so NCCL is looked up there first, next to the gIB net
plugin (libnccl-net_internal.so) that NCCL_NET_PLUGIN names. `--install-nccl` is what puts the NCCL
build that ships with the plugin into that directory. The verl images carry only the NCCL of their
PyTorch wheel, under site-packages, and the tutorial was never run with that NCCL driving the gIB
plugin. The next commit, 2da1c92 (2026-05-06), dropped the flag from the Standard and A4X
installers (the Autopilot one kept it), which would silently switch Standard clusters to that
untested pairing and make Standard and Autopilot differ. This commit is the one the tutorial's pod
specs were written against, for x86 and arm64 alike; override the URL to opt into a newer one.
"""

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def installer_url(path: str, commit: str = NCCL_INSTALLER_COMMIT) -> str:
    """The raw URL of installer `path` (e.g. `gpudirect-rdma/nccl-rdma-installer.yaml`) at `commit`."""
    if not _COMMIT.match(commit):
        raise ValueError(f"NCCL installer commit = {commit!r}: must be a full 40-hex-digit commit, never a branch or tag")
    url = f"{NCCL_INSTALLER_REPO}/{commit}/{path}"
    if not is_nccl_installer_url(url):
        raise ValueError(f"NCCL installer path = {path!r}: must be a YAML file under gpudirect-rdma/")
    return url


def google_installer_url(platform: Platform, mode: str) -> str | None:
    """Google's manifest for `mode` where verl-gke applies it as is (Autopilot), else None."""
    if mode == "autopilot" and platform.autopilot_nccl_installer:
        return installer_url(platform.autopilot_nccl_installer)
    return None


NAME = "nccl-rdma-installer"
NAMESPACE = "kube-system"
PAUSE_IMAGE = "gke.gcr.io/pause:3.8@sha256:880e63f94b145e46f1b1082bb71b85e21f16b99b180b9996407d61240ceb9830"
"""The container that keeps the pod (and so the installed files' owner) alive; Google's manifests pin it."""
HOST_LIB64 = "/home/kubernetes/bin/nvidia/lib64"
"""Where the host's GPU driver keeps its libraries; the Ray workers mount /home/kubernetes/bin/nvidia."""
HOST_GIB = "/home/kubernetes/bin/gib"
"""Where the gIB plugin and its tuner configs go (NCCL_NET_PLUGIN, NCCL_TUNER_CONFIG_PATH)."""
_MOUNT_ROOT = "/usr/local"
"""The installer's script copies into /usr/local<host path> (its container_entry.sh)."""
_INSTALL = (
    "set -ex\n"
    "/scripts/container_entry.sh install --install-nccl\n"
    f"cp -r /var/lib/gib/lib64/. {_MOUNT_ROOT}{HOST_LIB64}\n"
    f"cp -r /var/lib/gib/. {_MOUNT_ROOT}{HOST_GIB}\n"
    "echo \"installation finishes\"\n"
)

_UNPRIVILEGED = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def installer_daemonset(platform: Platform, image: str) -> dict[str, Any]:
    """The DaemonSet that puts the gIB NCCL plugin and its NCCL build on every GPU node of `platform`.

    `image` is the installer image by digest (`name:tag@sha256:...`). The pod spec follows Google's
    at NCCL_INSTALLER_COMMIT: a privileged init container with host network and PID runs the
    installer's script into host paths, then an unprivileged pause container keeps the pod.
    """
    labels = {"k8s-app": NAME}
    selector = [{"key": "cloud.google.com/gke-accelerator", "operator": "In", "values": [platform.accelerator]},
                {"key": "kubernetes.io/arch", "operator": "In", "values": [platform.arch]}]
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            # All at once: the pods serve nothing, and one node at a time through a whole A4X rack
            # could outlast pulumi-kubernetes' 10-minute DaemonSet await.
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
            "template": {
                "metadata": {"labels": {"name": NAME, **labels}},
                "spec": {
                    "priorityClassName": "system-node-critical",
                    # Kubernetes runs a privileged container unconfined whatever the pod says
                    # (Kubernetes docs, "Restrict a Container's Syscalls with seccomp"): this binds
                    # the pause container, which stays.
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": selector}]}}},
                    # GPU nodes carry the nvidia.com/gpu taint and, under Spot, more.
                    "tolerations": [{"operator": "Exists"}],
                    "hostNetwork": True,
                    "hostPID": True,
                    "volumes": [
                        {"name": "library-dir-host", "hostPath": {"path": HOST_LIB64, "type": "DirectoryOrCreate"}},
                        {"name": "gib", "hostPath": {"path": HOST_GIB}},
                    ],
                    "initContainers": [{
                        "name": NAME,
                        "image": image,
                        "resources": {"requests": {"cpu": "150m"}},
                        "securityContext": {"privileged": True},
                        "volumeMounts": [
                            {"name": "library-dir-host", "mountPath": f"{_MOUNT_ROOT}{HOST_LIB64}"},
                            {"name": "gib", "mountPath": f"{_MOUNT_ROOT}{HOST_GIB}"},
                        ],
                        "command": ["/bin/sh", "-c"],
                        "args": [_INSTALL],
                    }],
                    "containers": [{"name": "pause", "image": PAUSE_IMAGE, "securityContext": _UNPRIVILEGED}],
                },
            },
        },
    }
