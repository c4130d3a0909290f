"""network-mapping.yaml and the NCCL installer (verl-gke's DaemonSet on Standard, Google's pinned
manifest on Autopilot), as the tutorial's "Configure network mappings" and "Create the GKE cluster"
steps define them."""

from __future__ import annotations

import re

import pytest

from domain.platforms import PLATFORMS, has_digest
from manifests import nccl
from tests.k8s_schema import validate_core
from manifests.network_mapping import NetworkNames, network_mapping

NAMES = NetworkNames(gvnic_prefix="verl-gvnic", rdma_prefix="verl-rdma", rdma_nics=8)


def test_names_follow_the_tutorials_gcloud_commands():
    assert NAMES.gvnic_network == "verl-gvnic-net"
    assert NAMES.gvnic_subnet == "verl-gvnic-sub"
    assert NAMES.gvnic_firewall == "verl-gvnic-internal"
    assert NAMES.rdma_network == "verl-rdma-net"
    assert NAMES.rdma_subnets == tuple(f"verl-rdma-sub-{n}" for n in range(8))


def test_mapping_is_gvnic_then_eight_rdma_pairs_in_file_order():
    objects = network_mapping(NAMES)
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        (kind, name)
        for name in ["gvnic-1", *(f"rdma-{n}" for n in range(8))]
        for kind in ("GKENetworkParamSet", "Network")
    ]


def test_gvnic_pair_is_exactly_the_tutorials():
    param_set, network = network_mapping(NAMES)[:2]
    assert param_set == {
        "apiVersion": "networking.gke.io/v1",
        "kind": "GKENetworkParamSet",
        "metadata": {"name": "gvnic-1"},
        "spec": {"vpc": "verl-gvnic-net", "vpcSubnet": "verl-gvnic-sub", "deviceMode": "NetDevice"},
    }
    assert network == {
        "apiVersion": "networking.gke.io/v1",
        "kind": "Network",
        "metadata": {"name": "gvnic-1"},
        "spec": {
            "type": "Device",
            "parametersRef": {"group": "networking.gke.io", "kind": "GKENetworkParamSet", "name": "gvnic-1"},
        },
    }


def test_last_rdma_pair_points_at_subnet_7():
    param_set, network = network_mapping(NAMES)[-2:]
    assert param_set == {
        "apiVersion": "networking.gke.io/v1",
        "kind": "GKENetworkParamSet",
        "metadata": {"name": "rdma-7"},
        "spec": {"vpc": "verl-rdma-net", "vpcSubnet": "verl-rdma-sub-7", "deviceMode": "RDMA"},
    }
    assert network["spec"]["parametersRef"]["name"] == "rdma-7"


def test_every_rdma_param_set_uses_its_own_subnet():
    param_sets = [o for o in network_mapping(NAMES) if o["kind"] == "GKENetworkParamSet"][1:]
    assert [(p["spec"]["vpcSubnet"], p["spec"]["deviceMode"]) for p in param_sets] == [
        (f"verl-rdma-sub-{n}", "RDMA") for n in range(8)
    ]


def test_a4x_multi_network_layout_has_four_rdma_rails():
    names = NetworkNames(gvnic_prefix="a4x-gvnic", rdma_prefix="a4x-rdma", rdma_nics=PLATFORMS["a4x"].rdma_nics)
    objects = network_mapping(names)
    assert len(objects) == 2 * (1 + 4)
    assert objects[-2]["spec"] == {"vpc": "a4x-rdma-net", "vpcSubnet": "a4x-rdma-sub-3", "deviceMode": "RDMA"}


def test_installer_url_is_pinned_to_a_full_commit():
    url = nccl.installer_url("gpudirect-rdma/nccl-rdma-installer.yaml")
    assert url == (
        "https://raw.githubusercontent.com/GoogleCloudPlatform/container-engine-accelerators/"
        "07a8e6c9b2208ee865a1fb9b9b246e10adfd7738/gpudirect-rdma/nccl-rdma-installer.yaml"
    )
    assert "refs/heads" not in url and "/master/" not in url


def test_pinned_commit_is_the_last_one_with_install_nccl():
    # 2da1c92 dropped --install-nccl from the Standard and A4X installers.
    assert re.fullmatch(r"[0-9a-f]{40}", nccl.NCCL_INSTALLER_COMMIT)
    assert nccl.NCCL_INSTALLER_COMMIT != "2da1c92ff7bd772a2c833710bb6c21dcfe6dfaae"


@pytest.mark.parametrize(("platform", "mode", "file"), [
    ("a4", "autopilot", "nccl-rdma-installer-autopilot.yaml"),
    ("a3u", "autopilot", "nccl-rdma-installer-autopilot.yaml"),
    ("a4", "standard", None),
    ("a3u", "standard", None),
    ("a4x", "standard", None),
])
def test_only_autopilot_applies_googles_manifest(platform, mode, file):
    url = nccl.google_installer_url(PLATFORMS[platform], mode)
    assert url == (None if file is None else nccl.installer_url(f"gpudirect-rdma/{file}"))


PINNED = "@sha256:" + "ab" * 32


@pytest.mark.parametrize("platform", sorted(p for p in PLATFORMS if PLATFORMS[p].nccl_installer_image))  # g2: none (TCP)
def test_installer_daemonset_is_a_valid_object_that_pulls_every_image_by_digest(platform):
    image = PLATFORMS[platform].nccl_installer_image + PINNED
    daemonset = nccl.installer_daemonset(PLATFORMS[platform], image)
    validate_core(daemonset)
    pod = daemonset["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    assert init["image"] == image
    assert all(has_digest(c["image"]) for c in [*pod["initContainers"], *pod["containers"]])
    assert (daemonset["metadata"]["namespace"], daemonset["metadata"]["name"]) == ("kube-system", "nccl-rdma-installer")
    # A re-run is harmless and the pods serve nothing: every node at once, within the provider's await.
    assert daemonset["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}}


@pytest.mark.parametrize(("platform", "accelerator", "arch", "image"), [
    ("a4", "nvidia-b200", "amd64", "us-docker.pkg.dev/gce-ai-infra/gpudirect-gib/nccl-plugin-gib:v1.1.1"),
    ("a3u", "nvidia-h200-141gb", "amd64", "us-docker.pkg.dev/gce-ai-infra/gpudirect-gib/nccl-plugin-gib:v1.1.1"),
    ("a4x", "nvidia-gb200", "arm64", "us-docker.pkg.dev/gce-ai-infra/gpudirect-gib/nccl-plugin-gib-arm64:v1.1.0"),
])
def test_installer_runs_googles_image_of_the_pinned_commit_only_on_the_platforms_gpu_nodes(
        platform, accelerator, arch, image):
    assert PLATFORMS[platform].nccl_installer_image == image
    pod = nccl.installer_daemonset(PLATFORMS[platform], image + PINNED)["spec"]["template"]["spec"]
    [term] = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "cloud.google.com/gke-accelerator", "operator": "In", "values": [accelerator]},
        {"key": "kubernetes.io/arch", "operator": "In", "values": [arch]},
    ]
    assert pod["tolerations"] == [{"operator": "Exists"}]


def test_installer_puts_the_plugin_and_its_nccl_where_the_ray_workers_look():
    pod = nccl.installer_daemonset(PLATFORMS["a4"], "x" + PINNED)["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    script = init["args"][0]
    # --install-nccl: the NCCL build that ships with the plugin (the pinned commit's reason).
    assert script.splitlines()[:2] == ["set -ex", "/scripts/container_entry.sh install --install-nccl"]
    host = {v["name"]: v["hostPath"] for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    assert host["library-dir-host"] == {"path": "/home/kubernetes/bin/nvidia/lib64", "type": "DirectoryOrCreate"}
    assert host["gib"] == {"path": "/home/kubernetes/bin/gib"}
    assert set(host) == {"library-dir-host", "gib"}
    assert f"cp -r /var/lib/gib/lib64/. {mounts['library-dir-host']}" in script
    assert f"cp -r /var/lib/gib/. {mounts['gib']}" in script
    assert mounts == {"library-dir-host": "/usr/local/home/kubernetes/bin/nvidia/lib64",
                      "gib": "/usr/local/home/kubernetes/bin/gib"}
    # NCCL_NET_PLUGIN and the tuner config live in the folder the gib volume fills.
    assert PLATFORMS["a4"].nccl_env["NCCL_NET_PLUGIN"].startswith("/usr/local/gib/lib64/")
    # Privileged and on the host's network and PIDs: the installer's script needs them; the pause
    # container that stays has no privilege, no capability and the runtime's seccomp profile.
    assert init["securityContext"] == {"privileged": True}
    assert (pod["hostNetwork"], pod["hostPID"]) == (True, True)
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["containers"] == [{"name": "pause", "image": nccl.PAUSE_IMAGE, "securityContext": {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]


@pytest.mark.parametrize(
    ("path", "commit", "message"),
    [
        ("gpudirect-rdma/nccl-rdma-installer.yaml", "master", "commit = 'master': must be a full 40-hex-digit commit"),
        ("gpudirect-rdma/nccl-rdma-installer.yaml", "07a8e6c", "commit = '07a8e6c': must be a full 40-hex-digit"),
        ("../etc/passwd", nccl.NCCL_INSTALLER_COMMIT, "path = '../etc/passwd': must be a YAML file under gpudirect-rdma/"),
    ],
)
def test_moving_refs_and_odd_paths_are_refused(path, commit, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        nccl.installer_url(path, commit)
