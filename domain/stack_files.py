"""Reading stack config the way the Pulumi CLI hands it to a program, for offline runs.

The CLI merges `Pulumi.yaml` defaults under `Pulumi.<stack>.yaml` values and passes every
value as a string (arrays as JSON). `synth` and the tests do the same here.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

from domain.problems import ConfigError, problem_line
from domain.pulumi_config import (  # noqa: F401 engine_string: the engine's text of a value, for readers of stack files
    Declared, DuplicateKey, declarations, engine_string, is_secure, read_stack_yaml, shape_problem,
)

PROJECT_DIR = Path(__file__).resolve().parent.parent


def _project_config(project_dir: Path) -> dict[str, Any]:
    project = _load_yaml(project_dir / "Pulumi.yaml") or {}
    if not isinstance(project, dict) or not isinstance(project.get("config") or {}, dict):
        raise ConfigError(["Pulumi.yaml: the top level must be a mapping whose `config:` maps keys to declarations"],
                          "Pulumi.yaml")
    return project.get("config") or {}


def project_defaults(project_dir: Path = PROJECT_DIR) -> dict[str, Any]:
    """The declared defaults of Pulumi.yaml, as raw YAML values."""
    return {key: decl["default"] for key, decl in _project_config(project_dir).items()
            if isinstance(decl, dict) and "default" in decl}


@functools.cache
def declared_types(project_dir: Path = PROJECT_DIR) -> dict[str, Declared]:
    """Each key's type as Pulumi.yaml declares it, which the Pulumi CLI enforces on every stack value."""
    return declarations(_project_config(project_dir))


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
        return copy.deepcopy(_parsed(path.read_bytes().decode("utf-8")))
    except UnicodeDecodeError as error:
        raise ConfigError([f"{path.name}: not UTF-8 text (byte 0x{error.object[error.start]:02x} at offset "
                           f"{error.start}); save it as UTF-8"], path.name) from None
    except DuplicateKey as error:
        raise ConfigError([f"{path.name}: {error}"], path.name) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        reason = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError([f"{path.name}: not valid YAML at {where}: {reason}"], path.name) from None


@functools.lru_cache(maxsize=16)
def _parsed(text: str) -> Any:
    """A YAML text parsed once per process (Pulumi.yaml alone is some 25 ms of pure-Python YAML a read)."""
    return read_stack_yaml(text)


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
    declared = declared_types(project_dir)
    shapes = [(key, value, shape_problem(value, declared[key])) for key, value in config.items() if key in declared]
    problems = [f"{key}: {problem}" if value is None else problem_line(key, value, problem)
                for key, value, problem in shapes if problem]
    if problems:
        raise ConfigError(problems, path.name)
    merged: dict[str, Any] = {**project_defaults(project_dir), **config, **(overrides or {})}
    secret_keys = [k for k, v in merged.items() if is_secure(v)]
    raw = {k: ("[encrypted]" if k in secret_keys else engine_string(v)) for k, v in merged.items()}
    return raw, secret_keys
