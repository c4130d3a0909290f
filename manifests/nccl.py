"""Where the NCCL RDMA installer DaemonSets come from.

The tutorial applies them from `refs/heads/master` of GoogleCloudPlatform/container-engine-accelerators,
which has changed since it was written; here every URL names a commit.
"""

from __future__ import annotations

import re

RAW_BASE = "https://raw.githubusercontent.com/GoogleCloudPlatform/container-engine-accelerators"

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
_PATH = re.compile(r"^gpudirect-rdma/[A-Za-z0-9._-]+\.yaml$")


def installer_url(path: str, commit: str = NCCL_INSTALLER_COMMIT) -> str:
    """The raw URL of installer `path` (e.g. `gpudirect-rdma/nccl-rdma-installer.yaml`) at `commit`."""
    if not _COMMIT.match(commit):
        raise ValueError(f"NCCL installer commit = {commit!r}: must be a full 40-hex-digit commit, never a branch or tag")
    if not _PATH.match(path):
        raise ValueError(f"NCCL installer path = {path!r}: must be a YAML file under gpudirect-rdma/")
    return f"{RAW_BASE}/{commit}/{path}"
