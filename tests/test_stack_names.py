"""Four stacks in one project: every name GCP keeps unique per project (or per region) differs."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from domain.config import load_config
from domain.names import MAX_SLUG, stack_names, stack_slug
from domain.stack_files import raw_config
from tests.conftest import BASE_CONFIG, STACKS
from verl_gke import synth

# type -> scope of its name (global in the project, or per region / zone).
GLOBAL = ("gcp:storage/bucket:Bucket", "gcp:compute/network:Network", "gcp:compute/firewall:Firewall")
REGIONAL = ("gcp:compute/subnetwork:Subnetwork", "gcp:compute/router:Router", "gcp:compute/routerNat:RouterNat",
            "gcp:compute/resourcePolicy:ResourcePolicy")


def _names(result) -> list[tuple[str, ...]]:
    out = []
    for r in result.registrations:
        if r.type in GLOBAL:
            out.append((r.type, r.inputs["name"]))
        elif r.type in REGIONAL:
            out.append((r.type, r.inputs.get("region", ""), r.inputs["name"]))
        elif r.type == "gcp:serviceaccount/account:Account":
            out.append((r.type, r.inputs["accountId"]))
        elif r.type == "gcp:container/cluster:Cluster":
            out.append((r.type, r.inputs["location"], r.inputs["name"]))
    return out


def test_the_four_stacks_in_one_project_ask_for_no_name_twice(synth_stack) -> None:
    assert len({r.inputs["project"] for s in STACKS for r in synth_stack(s).registrations
                if r.type == "gcp:storage/bucket:Bucket"}) == 1
    counts = Counter(name for stack in STACKS for name in _names(synth_stack(stack)))
    assert [name for name, n in counts.items() if n > 1] == []
    assert len(counts) > 4 * 5  # the check saw every stack's networks, bucket and accounts


def test_default_names_carry_the_stack(synth_stack) -> None:
    names = _names(synth_stack("a4-standard"))
    assert ("gcp:storage/bucket:Bucket", "verl-a4-standard-replace-me-project") in names
    assert ("gcp:compute/network:Network", "verl-a4-standard-net") in names
    assert ("gcp:compute/network:Network", "verl-a4-standard-gvnic-net") in names
    assert ("gcp:compute/firewall:Firewall", "verl-a4-standard-gvnic-internal") in names
    assert ("gcp:serviceaccount/account:Account", "verl-a4-standard-nodes") in names


def test_names_a_user_set_are_kept() -> None:
    cfg = load_config({**BASE_CONFIG, "verl-gke:bucketName": "my-bucket", "verl-gke:gvnicNetworkPrefix": "verl-gvnic",
                       "verl-gke:rdmaNetworkPrefix": "verl-rdma"})
    names = stack_names(cfg, "a4")
    assert (names.bucket, names.gvnic_prefix, names.rdma_prefix) == ("my-bucket", "verl-gvnic", "verl-rdma")


@pytest.mark.parametrize("stack", ["a4", "A4", "a4_x", "1ray", "dev.eu-west", "x" * 80, "a-very-long-stack-name-here"])
def test_every_stack_name_gives_names_within_gcps_limits(stack: str) -> None:
    cfg = load_config({**BASE_CONFIG, "gcp:project": "p" + "x" * 28 + "9"})  # the longest project id
    names = stack_names(cfg, stack)
    slug = stack_slug(stack)
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", slug) and len(slug) <= MAX_SLUG
    assert len(names.bucket) <= 63
    assert re.fullmatch(r"[a-z][-a-z0-9]{4,28}[a-z0-9]", names.node_account_id)
    for name in (names.network, names.subnet, names.router, names.nat, f"{names.gvnic_prefix}-internal",
                 f"{names.rdma_prefix}-sub-7"):
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63, name


def test_stacks_that_differ_only_in_case_or_punctuation_get_different_names() -> None:
    assert len({stack_slug(s) for s in ("a4", "A4", "a4_", "a4.", "a4-")}) == 5


def test_each_stacks_bucket_grant_names_its_own_service_account_only(synth_stack) -> None:
    """Each grant names its own stack's service account object by UID (any cluster of the project
    would match a namespace-and-name principal); the per-stack names keep the objects apart too."""
    from components.gcs_fuse_storage import ksa_principal

    members = set()
    for stack in STACKS:
        cfg = load_config(raw_config(stack)[0])
        result = synth_stack(stack)
        (grant,) = [r for r in result.registrations if r.type == "gcp:storage/bucketIAMMember:BucketIAMMember"
                    and r.inputs["role"] == "roles/storage.objectViewer"]
        assert grant.inputs["member"] == ksa_principal(
            project_number="123456789012", project=cfg.project,
            uid=synth.mock_uid("ServiceAccount", cfg.namespace, f"verl-ray-{stack}"))
        assert [m["metadata"] for m in result.manifests() if m["kind"] == "ServiceAccount"
                and m["metadata"]["name"] == f"verl-ray-{stack}"] == [{"name": f"verl-ray-{stack}",
                                                                       "namespace": cfg.namespace}]
        members.add(grant.inputs["member"])
    assert len(members) == len(STACKS)


def test_a_service_account_set_in_config_is_kept() -> None:
    assert stack_names(load_config({**BASE_CONFIG, "verl-gke:serviceAccount": "my-ksa"}), "a4").service_account == "my-ksa"
    assert stack_names(load_config(BASE_CONFIG), "Dev.A4x").service_account == f"verl-ray-{stack_slug('Dev.A4x')}"
