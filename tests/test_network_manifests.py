"""network-mapping.yaml and the NCCL installer URLs, as the tutorial's "Configure network mappings"
and "Create the GKE cluster" steps define them."""

from __future__ import annotations

import re

import pytest

from domain.platforms import PLATFORMS
from manifests import nccl
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


@pytest.mark.parametrize(
    ("platform", "mode", "file"),
    [
        ("a4", "standard", "nccl-rdma-installer.yaml"),
        ("a4", "autopilot", "nccl-rdma-installer-autopilot.yaml"),
        ("a3u", "standard", "nccl-rdma-installer.yaml"),
        ("a3u", "autopilot", "nccl-rdma-installer-autopilot.yaml"),
        ("a4x", "standard", "nccl-rdma-installer-a4x.yaml"),
    ],
)
def test_each_platform_and_mode_gets_its_installer(platform, mode, file):
    url = nccl.installer_url(PLATFORMS[platform].nccl_installer[mode])
    assert url.endswith(f"/{nccl.NCCL_INSTALLER_COMMIT}/gpudirect-rdma/{file}")


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
