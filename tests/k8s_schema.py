"""Offline schema checks for the Kubernetes objects the program defines.

`validate_custom` checks a custom resource (RayCluster, RayJob, ComputeDomain) against the
`openAPIV3Schema` of the served version in the pinned CRD files (`crd_paths`);
`validate_core` checks a core object with `kubernetes-validate` for a Kubernetes version.
Both raise AssertionError naming every problem, so they read well inside tests.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate.utils import VersionNotSupportedError

from domain.cache import cache_root
from tests import computeclass_schema

CRD_DIR_ENV = "VERL_GKE_CRD_DIR"
"""A folder holding the CRD files below (offline machines); unset, they are downloaded and cached."""

CACHE_DIR = cache_root() / "crds"
DOWNLOAD_TIMEOUT_S = 60


@dataclass(frozen=True)
class CrdFile:
    name: str
    """The file name, in VERL_GKE_CRD_DIR and in the cache."""
    url: str
    """Pinned to the release's commit: the CRDs of the KubeRay chart and NVIDIA DRA driver the program installs."""
    sha256: str


_KUBERAY = "https://raw.githubusercontent.com/ray-project/kuberay/598eb66aa077c55ae04fa87b192238a3ec184e88"
_NVIDIA_DRA = "https://raw.githubusercontent.com/NVIDIA/k8s-dra-driver-gpu/7020737a5e6d17d53003b19b1c473fa352f59232"
CRD_FILES = (
    CrdFile("kuberay-v1.6.2-ray.io_rayclusters.yaml",
            f"{_KUBERAY}/helm-chart/kuberay-operator/crds/ray.io_rayclusters.yaml",
            "1d51d8c4ce065b22c2069af0ebd72ae25f4a6968e5c5f93a3106ba6fc35bcc1d"),
    CrdFile("kuberay-v1.6.2-ray.io_rayjobs.yaml",
            f"{_KUBERAY}/helm-chart/kuberay-operator/crds/ray.io_rayjobs.yaml",
            "ecae45d9a5dc1be68f1074ba784c495ef9d439d295253b61e1bd51f7b08522f5"),
    CrdFile("nvidia-dra-driver-gpu-v25.3.2-resource.nvidia.com_computedomains.yaml",
            f"{_NVIDIA_DRA}/deployments/helm/nvidia-dra-driver-gpu/crds/resource.nvidia.com_computedomains.yaml",
            "35efe465138d4a125be5b54b85bcd26b4b4a45dea947cfdc3ceb4ff6021cdb52"),
)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _download(crd: CrdFile) -> bytes:
    with urllib.request.urlopen(crd.url, timeout=DOWNLOAD_TIMEOUT_S) as response:
        return response.read()


def crd_paths() -> list[Path]:
    """The pinned CRD files, each checked against its sha256: from $VERL_GKE_CRD_DIR when set,
    else from the cache, downloading what it lacks. One AssertionError names every problem."""
    local = os.environ.get(CRD_DIR_ENV)
    folder = Path(local) if local else CACHE_DIR
    paths, problems = [], []
    for crd in CRD_FILES:
        path = folder / crd.name
        if not local and not path.is_file():
            try:
                data = _download(crd)
            except OSError as error:
                problems.append(f"{crd.url}: {error}")
                continue
            if _sha256(data) != crd.sha256:
                problems.append(f"{crd.url}: sha256 {_sha256(data)}, expected {crd.sha256}")
                continue
            folder.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".partial")
            partial.write_bytes(data)
            partial.replace(path)
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif _sha256(path.read_bytes()) != crd.sha256:
            problems.append(f"{path}: sha256 differs from the pinned {crd.sha256}")
        else:
            paths.append(path)
    if problems:
        raise AssertionError(
            "the CRD schemas the tests check against are not available:\n  " + "\n  ".join(problems)
            + f"\nSet {CRD_DIR_ENV} to a folder holding {', '.join(c.name for c in CRD_FILES)}, "
            "or give this machine access to:\n  " + "\n  ".join(c.url for c in CRD_FILES))
    return paths


@functools.cache
def _crds() -> dict[tuple[str, str], dict[str, Any]]:
    """Every pinned CRD, keyed by (group, kind)."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for path in crd_paths():
        with path.open() as f:
            for doc in yaml.load_all(f, Loader=yaml.CSafeLoader):
                if doc and doc.get("kind") == "CustomResourceDefinition":
                    spec = doc["spec"]
                    found[(spec["group"], spec["names"]["kind"])] = doc
    return found


def _strict(schema: Any) -> Any:
    """The schema with unknown fields rejected: the API server would prune them (or refuse them
    with kubectl's strict field validation), so a misspelt field is a bug either way."""
    if isinstance(schema, dict):
        out = {key: _strict(value) for key, value in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


# OpenAPI v3.0 schemas follow JSON Schema draft 4 (boolean exclusive bounds), except that a
# whole-number float is an integer: the API server decodes 2.0 as 2, as Pulumi's engine sends ints.
_OpenApiValidator = jsonschema.validators.extend(
    jsonschema.Draft4Validator,
    type_checker=jsonschema.Draft4Validator.TYPE_CHECKER.redefine(
        "integer", lambda checker, instance: jsonschema.Draft7Validator.TYPE_CHECKER.is_type(instance, "integer")
    ),
)


@functools.cache
def _custom_validator(group: str, version: str, kind: str) -> jsonschema.protocols.Validator:
    documented = _DOCUMENTED.get((group, version, kind))
    if documented is not None:
        return _OpenApiValidator(_strict(copy.deepcopy(documented)))
    crd = _crds().get((group, kind))
    if crd is None:
        known = ", ".join(f"{k} ({g})" for g, k in sorted(_crds())) or "none"
        raise AssertionError(f"no CRD for kind {kind} in group {group} in the pinned CRDs; known: {known}")
    served = {v["name"]: v for v in crd["spec"]["versions"] if v.get("served")}
    if version not in served:
        raise AssertionError(
            f"{group}/{version} is not a served version of {kind}; served: {', '.join(sorted(served))}"
        )
    schema = _strict(copy.deepcopy(served[version]["schema"]["openAPIV3Schema"]))
    return _OpenApiValidator(schema)


# Kinds whose CRD the platform installs without publishing a file to pin: their documented schema.
_DOCUMENTED = {("cloud.google.com", "v1", "ComputeClass"): computeclass_schema.SCHEMA}


def _where(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out.lstrip(".") or "<root>"


def _label(obj: dict[str, Any]) -> str:
    name = obj.get("metadata", {}).get("name", "<unnamed>")
    return f"{obj.get('apiVersion', '?')} {obj.get('kind', '?')}/{name}"


def validate_custom(obj: dict[str, Any]) -> None:
    """Validate a custom resource against its CRD's served-version schema (unknown fields rejected).

    CEL rules (`x-kubernetes-validations`) are not evaluated: the ones in these CRDs only guard
    updates (immutability) or fields this program does not set.
    """
    api_version = obj.get("apiVersion", "")
    if "/" not in api_version:
        raise AssertionError(f"{_label(obj)}: apiVersion {api_version!r} is not group/version")
    group, version = api_version.split("/", 1)
    validator = _custom_validator(group, version, obj.get("kind", ""))
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        lines = [f"  {_where(e.absolute_path)}: {e.message}" for e in errors]
        raise AssertionError(f"{_label(obj)} has {len(errors)} schema error(s):\n" + "\n".join(lines))


def validate_core(obj: dict[str, Any], k8s_version: str = "1.34") -> None:
    """Validate a core object with kubernetes-validate's strict schemas for `k8s_version`.

    kubernetes-validate stops at the first error; the message names its path.
    """
    try:
        kubernetes_validate.validate(obj, k8s_version, strict=True)
    except kubernetes_validate.ValidationError as e:
        raise AssertionError(
            f"{_label(obj)} is invalid for Kubernetes {e.version}: {_where(e.path)}: {e.message}"
        ) from None
    except kubernetes_validate.SchemaNotFoundError as e:
        raise AssertionError(f"{_label(obj)}: {e.message}") from None
    except VersionNotSupportedError as e:
        raise AssertionError(f"{_label(obj)}: kubernetes-validate has no schemas for Kubernetes {e.version}") from None
