"""A project's Binary Authorization policy that admits exactly a stack's images at their pinned digests.

In the format `gcloud container binauthz policy import` reads (Google's policy YAML reference). The
system policy (globalPolicyEvaluationMode ENABLE, Google's "block (almost) all deployments" example)
admits the Google-maintained images GKE itself runs; each of the stack's images is one allowlist
pattern, the full reference its pod specs name (`name:tag@sha256:...`, no wildcard); the default
rule ALWAYS_DENY refuses everything else, an image by tag included. The policy is the user's to
import: nothing in the program applies it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml

from domain.platforms import has_digest

DEFAULT_RULE = {"evaluationMode": "ALWAYS_DENY", "enforcementMode": "ENFORCED_BLOCK_AND_AUDIT_LOG"}


def policy(project: str, references: Iterable[str]) -> dict[str, Any]:
    """The policy of `project` admitting `references` (each `name[:tag]@sha256:<64 hex>`) and GKE's own."""
    refs = sorted(set(references))
    if unpinned := [r for r in refs if not has_digest(r)]:
        raise ValueError(f"no digest, so no pattern can pin them: {', '.join(unpinned)}")
    return {"name": f"projects/{project}/policy",
            "globalPolicyEvaluationMode": "ENABLE",
            "admissionWhitelistPatterns": [{"namePattern": r} for r in refs],
            "defaultAdmissionRule": dict(DEFAULT_RULE)}


def policy_yaml(project: str, references: Iterable[str]) -> str:
    """`policy` as the YAML `gcloud container binauthz policy import` reads."""
    return yaml.safe_dump(policy(project, references), sort_keys=False)
