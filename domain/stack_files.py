"""Reading stack config the way the Pulumi CLI hands it to a program, for offline runs.

The CLI merges `Pulumi.yaml` defaults under `Pulumi.<stack>.yaml` values and passes every
value as a string (arrays as JSON). `synth` and the tests do the same here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from domain.config import ConfigError

PROJECT_DIR = Path(__file__).resolve().parent.parent


def engine_string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def project_defaults(project_dir: Path = PROJECT_DIR) -> dict[str, Any]:
    """The declared defaults of Pulumi.yaml, as raw YAML values."""
    project = _load_yaml(project_dir / "Pulumi.yaml") or {}
    if not isinstance(project, dict) or not isinstance(project.get("config") or {}, dict):
        raise ConfigError(["Pulumi.yaml: the top level must be a mapping whose `config:` maps keys to declarations"],
                          "Pulumi.yaml")
    return {key: decl["default"] for key, decl in project.get("config", {}).items() if "default" in decl}


def stack_file(stack: str, project_dir: Path = PROJECT_DIR) -> Path:
    return project_dir / f"Pulumi.{stack}.yaml"


def stack_names(project_dir: Path = PROJECT_DIR) -> list[str]:
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in project_dir.glob("Pulumi.*.yaml"))


# What else Pulumi keeps at the top of a stack file.
_STACK_FILE_KEYS = ("config", "secretsprovider", "encryptedkey", "encryptionsalt", "environment")


def _load_yaml(path: Path) -> Any:
    """A YAML file's content; ConfigError naming the file (and line and column) when it is not UTF-8
    or not YAML."""
    try:
        return yaml.safe_load(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as error:
        raise ConfigError([f"{path.name}: not UTF-8 text (byte 0x{error.object[error.start]:02x} at offset "
                           f"{error.start}); save it as UTF-8"], path.name) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        reason = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError([f"{path.name}: not valid YAML at {where}: {reason}"], path.name) from None


def read_stack_file(path: Path) -> dict[str, Any]:
    """The `config:` mapping of a stack file; ConfigError naming the file (and line and column)
    for anything Pulumi would not read as config."""
    values = _load_yaml(path)
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError([f"{path.name}: the top level must be a mapping with a `config:` key, "
                           f"not a {type(values).__name__}"], path.name)
    problems = [f"{key}: not under `config:`, so Pulumi ignores it; indent it under `config:`"
                for key in values if key not in _STACK_FILE_KEYS]
    config = values.get("config") or {}
    if not isinstance(config, dict):
        problems.append(f"config: must map keys to values, not a {type(config).__name__}")
    if problems:
        raise ConfigError(problems, path.name)
    return config


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
    config = read_stack_file(path)
    merged: dict[str, Any] = {**project_defaults(project_dir), **config, **(overrides or {})}
    secret_keys = [k for k, v in merged.items() if isinstance(v, dict) and "secure" in v]
    raw = {k: ("[encrypted]" if k in secret_keys else engine_string(v)) for k, v in merged.items()}
    return raw, secret_keys
