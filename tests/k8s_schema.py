"""Offline schema checks for the Kubernetes objects the program defines.

`validate_custom` checks a custom resource (RayCluster, RayJob, ComputeDomain) against the
`openAPIV3Schema` of the served version in the CRD files of the shared dir (FIELD-NOTES 4);
`validate_core` checks a core object with `kubernetes-validate` for a Kubernetes version.
Both raise AssertionError naming every problem, so they read well inside tests.
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate.utils import VersionNotSupportedError

SHARED_DIR_ENV = "VERL_GKE_SHARED_DIR"
"""Overrides where the shared dir is; by default `../shared` from the repo root (as in CI)."""

REPO_ROOT = Path(__file__).resolve().parent.parent


def shared_dir() -> Path:
    """The shared dir holding `crds/`: $VERL_GKE_SHARED_DIR, else `<repo>/../shared`."""
    override = os.environ.get(SHARED_DIR_ENV)
    path = Path(override) if override else REPO_ROOT.parent / "shared"
    if not (path / "crds").is_dir():
        raise AssertionError(
            f"no CRD directory at {path / 'crds'}: put the shared dir beside the repo "
            f"or set {SHARED_DIR_ENV} to its path"
        )
    return path


@functools.cache
def _crds() -> dict[tuple[str, str], dict[str, Any]]:
    """Every CRD in shared/crds, keyed by (group, kind)."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted((shared_dir() / "crds").glob("*.yaml")):
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
    crd = _crds().get((group, kind))
    if crd is None:
        known = ", ".join(f"{k} ({g})" for g, k in sorted(_crds())) or "none"
        raise AssertionError(f"no CRD for kind {kind} in group {group} under {shared_dir() / 'crds'}; known: {known}")
    served = {v["name"]: v for v in crd["spec"]["versions"] if v.get("served")}
    if version not in served:
        raise AssertionError(
            f"{group}/{version} is not a served version of {kind}; served: {', '.join(sorted(served))}"
        )
    schema = _strict(copy.deepcopy(served[version]["schema"]["openAPIV3Schema"]))
    return _OpenApiValidator(schema)


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
