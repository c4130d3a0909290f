"""Reading stack config the way the Pulumi CLI hands it to a program, for offline runs.

The CLI merges `Pulumi.yaml` defaults under `Pulumi.<stack>.yaml` values and passes every
value as a string (arrays as JSON). `synth` and the tests do the same here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

PROJECT_DIR = Path(__file__).resolve().parent.parent


def engine_string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def project_defaults(project_dir: Path = PROJECT_DIR) -> dict[str, Any]:
    """The declared defaults of Pulumi.yaml, as raw YAML values."""
    project = yaml.safe_load((project_dir / "Pulumi.yaml").read_text())
    return {key: decl["default"] for key, decl in project.get("config", {}).items() if "default" in decl}


def stack_file(stack: str, project_dir: Path = PROJECT_DIR) -> Path:
    return project_dir / f"Pulumi.{stack}.yaml"


def stack_names(project_dir: Path = PROJECT_DIR) -> list[str]:
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in project_dir.glob("Pulumi.*.yaml"))


def raw_config(stack: str, project_dir: Path = PROJECT_DIR,
               overrides: dict[str, Any] | None = None) -> tuple[dict[str, str], list[str]]:
    """(config as the engine passes it, keys whose values are encrypted secrets).

    An encrypted (`secure:`) value cannot be read offline; it is passed as a marker string
    so the program sees the key as set, and reported as secret.
    """
    path = stack_file(stack, project_dir)
    if not path.exists():
        known = ", ".join(stack_names(project_dir))
        raise FileNotFoundError(f"no stack file {path.name}; stacks: {known}")
    values = yaml.safe_load(path.read_text()) or {}
    merged: dict[str, Any] = {**project_defaults(project_dir), **(values.get("config") or {}), **(overrides or {})}
    secret_keys = [k for k, v in merged.items() if isinstance(v, dict) and "secure" in v]
    raw = {k: ("[encrypted]" if k in secret_keys else engine_string(v)) for k, v in merged.items()}
    return raw, secret_keys
