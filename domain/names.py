"""Names of what a stack creates that must be unique in its GCP project, derived from the stack.

Four stacks (or more) deploy into one project: each global name (bucket, VPCs, firewall rules,
service accounts) and each regional one shared by stacks in a region (subnets, router, NAT) carries
the stack's slug, so no two stacks ever ask GCP for the same name. Names a user set stay as set.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from domain.config import StackConfig

MAX_SLUG = 16
"""Keeps `verl-<slug>-nodes` within a service account id's 30 characters and `verl-<slug>-<project>`
within a bucket name's 63."""


def stack_slug(stack: str) -> str:
    """`a4-standard` as is; a stack name that GCP names cannot hold (uppercase, `_`, `.`, too long,
    a leading digit) as a cleaned prefix plus 4 hex of its hash, so distinct stacks stay distinct."""
    slug = re.sub(r"[^a-z0-9]+", "-", stack.lower()).strip("-")
    if slug == stack and len(slug) <= MAX_SLUG and slug[:1].isalpha():
        return slug
    digest = hashlib.sha256(stack.encode()).hexdigest()[:4]
    prefix = slug[:MAX_SLUG - 5].rstrip("-")
    return f"{prefix}-{digest}" if prefix[:1].isalpha() else f"s{digest}{prefix[:MAX_SLUG - 5]}".rstrip("-")


@dataclass(frozen=True)
class StackNames:
    bucket: str
    gvnic_prefix: str
    """`<prefix>-net`, `<prefix>-sub`, `<prefix>-internal` (manifests.network_mapping.NetworkNames)."""
    rdma_prefix: str
    network: str
    """The cluster's own VPC."""
    subnet: str
    """Its subnet in the region, with the pods and services ranges."""
    router: str
    nat: str
    node_account_id: str
    """The nodes' dedicated service account."""
    service_account: str
    """The Ray pods' Kubernetes service account (granted by its UID: components/gcs_fuse_storage.py)."""
    staging_service_account: str
    """The staging Job's: the only identity that may read the Hugging Face token."""


def stack_names(cfg: StackConfig, stack: str) -> StackNames:
    base = f"verl-{stack_slug(stack)}"
    return StackNames(
        bucket=cfg.bucket_name or f"{base}-{cfg.project}",
        gvnic_prefix=cfg.gvnic_network_prefix or f"{base}-gvnic",
        rdma_prefix=cfg.rdma_network_prefix or f"{base}-rdma",
        network=f"{base}-net",
        subnet=f"{base}-nodes",
        router=f"{base}-router",
        nat=f"{base}-nat",
        node_account_id=f"{base}-nodes",
        service_account=cfg.service_account or f"verl-ray-{stack_slug(stack)}",
        staging_service_account=f"{cfg.service_account or f'verl-ray-{stack_slug(stack)}'}-staging",
    )
