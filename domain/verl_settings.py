"""verl's settings by verl's own names: the `verl-gke:verl` map, checked against the pinned verl's config.

Keys are verl's config paths as `pulumi config set --path verl-gke:verl.data.train_batch_size 128`
nests them. Each is checked against the platform's pinned verl's composed `ppo_trainer.yaml`: an
unknown path is refused with the nearest one, a value must have verl's declared type (read from the
wheel's source, never imported), and no string may hold a Hydra interpolation. Pure: no Pulumi.
"""

from __future__ import annotations

import ast
import copy
import difflib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from domain.platforms import VerlRelease
from domain.verl_wheel import config_dir, unpacked

CONFIG_NAME = "ppo_trainer"
INTERPOLATION = "${"
_INT = re.compile(r"^[-+]?[0-9]+$")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the map, named by its verl path ("" for the map as a whole)."""

    path: str
    value: Any
    message: str


def compose_run(folder: Path, args: list[str]) -> DictConfig:
    """verl's `ppo_trainer` config with `args` applied, as `main_ppo` composes it (read-only: one
    composition serves every caller with the same folder and args)."""
    return _composition(folder, tuple(args))


@lru_cache(maxsize=16)
def _composition(folder: Path, args: tuple[str, ...]) -> DictConfig:
    # A composition is some 0.2 CPU s, and a synth needs each twice (the program's check, synth's plan).
    with initialize_config_dir(config_dir=str(folder), version_base=None, job_name="verl-gke"):
        composed = compose(CONFIG_NAME, overrides=list(args))
    OmegaConf.set_readonly(composed, True)
    return composed


@lru_cache(maxsize=None)
def defaults_of(release: VerlRelease) -> DictConfig:
    """verl's own composed defaults for `release` (read-only; composed once per process)."""
    return compose_run(config_dir(release), [])


def decode(value: Any) -> tuple[dict[str, Any], list[Problem]]:
    """The map as the engine hands it over (JSON text of an object) or as YAML gives it -> {path: value}.

    Nested maps join into dotted paths (`{"data": {"train_batch_size": 1}}` and `{"data.train_batch_size": 1}`
    both give `data.train_batch_size`); a leaf is a scalar, null or a list."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError:
            return {}, [Problem("", value, "must be a map of verl config paths to values, such as "
                                "{\"data\": {\"train_batch_size\": 128}}; set one with `pulumi config set --path "
                                "verl-gke:verl.data.train_batch_size 128`.")]
    if not isinstance(value, Mapping):
        return {}, [Problem("", value, "must be a map of verl config paths to values (`pulumi config set --path "
                            "verl-gke:verl.<path> <value>`).")]
    flat: dict[str, Any] = {}
    problems: list[Problem] = []

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        for key, item in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(item, Mapping) and item:
                walk(item, path)
            elif path in flat:
                problems.append(Problem(path, item, "is set twice (nested and dotted); set it once."))
            else:
                flat[path] = item

    walk(value, "")
    return flat, problems


@dataclass(frozen=True)
class Kind:
    """What verl accepts at a path: Python types by name, whether null is allowed, a closed set of values."""

    types: frozenset[str]
    nullable: bool = False
    choices: tuple[Any, ...] = ()

    @property
    def any(self) -> bool:
        return not self.types

    def describe(self) -> str:
        if self.choices:
            return "one of " + ", ".join(json.dumps(c) for c in self.choices)
        names = {"bool": "true or false", "int": "a whole number", "float": "a number", "str": "a string",
                 "list": "a list", "dict": "a map"}
        shown = [names[t] for t in ("bool", "int", "float", "str", "list", "dict") if t in self.types
                 and not (t == "int" and "float" in self.types)]
        return " or ".join(shown + (["null"] if self.nullable else []))


_ANY = Kind(frozenset())
_TYPE_NAMES = {"int": "int", "float": "float", "bool": "bool", "str": "str", "list": "list", "List": "list",
               "Sequence": "list", "tuple": "list", "Tuple": "list", "dict": "dict", "Dict": "dict"}


def _kind_of_annotation(node: ast.expr | None) -> Kind:
    """A dataclass field's annotation as a Kind; anything else (a nested config class, Any) accepts all."""
    if node is None:
        return _ANY
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a string annotation
        try:
            return _kind_of_annotation(ast.parse(node.value, mode="eval").body)
        except SyntaxError:
            return _ANY
    if isinstance(node, ast.Constant) and node.value is None:  # the None of `X | None`, dropped by _union
        return Kind(frozenset({"none"}), nullable=True)
    if isinstance(node, ast.Name):
        name = _TYPE_NAMES.get(node.id)
        return Kind(frozenset({name})) if name else _ANY
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union([_kind_of_annotation(node.left), _kind_of_annotation(node.right)])
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        outer, inner = node.value.id, node.slice
        args = list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]
        if outer == "Optional":
            kind = _kind_of_annotation(args[0])
            return Kind(kind.types, True, kind.choices) if not kind.any else _ANY
        if outer == "Union":
            return _union([_kind_of_annotation(a) for a in args])
        if outer == "Literal" and all(isinstance(a, ast.Constant) for a in args):
            values = tuple(a.value for a in args if isinstance(a, ast.Constant))
            return Kind(frozenset(type(v).__name__ for v in values if v is not None), None in values,
                        tuple(v for v in values if v is not None))
        name = _TYPE_NAMES.get(outer)
        return Kind(frozenset({name})) if name else _ANY
    return _ANY


def _union(kinds: list[Kind]) -> Kind:
    if any(k.any for k in kinds):
        return _ANY
    types = frozenset().union(*(k.types for k in kinds)) - {"none"}
    return Kind(types, any(k.nullable for k in kinds), tuple(c for k in kinds for c in k.choices))


@lru_cache(maxsize=None)
def _classes_in(package: Path) -> dict[str, ast.ClassDef]:
    """The classes defined in one module (a .py file) or one package's own files, by name."""
    files = sorted(package.glob("*.py")) if package.is_dir() else [package]
    found: dict[str, ast.ClassDef] = {}
    for path in files:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        found.update({n.name: n for n in tree.body if isinstance(n, ast.ClassDef)})
    return found


@lru_cache(maxsize=None)
def _fields(root: Path, target: str) -> dict[str, ast.expr]:
    """The annotated fields of verl's config dataclass `target` (`verl.workers.config.FSDPActorConfig`),
    its bases' included, read from the wheel's source."""
    module, _, name = target.rpartition(".")
    base = root.joinpath(*module.split("."))
    package = base if base.is_dir() else base.with_suffix(".py")
    classes = _classes_in(package)
    out: dict[str, ast.expr] = {}

    def collect(cls_name: str, seen: frozenset[str]) -> None:
        cls = classes.get(cls_name)
        if cls is None or cls_name in seen:
            return
        for parent in cls.bases:
            if isinstance(parent, ast.Name):
                collect(parent.id, seen | {cls_name})
        out.update({s.target.id: s.annotation for s in cls.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)})

    collect(name, frozenset())
    return out


def _python_kind(value: Any) -> Kind:
    """The Kind of verl's default where no dataclass declares one: its type; a number takes a number."""
    if value is None:
        return _ANY
    if isinstance(value, bool):
        return Kind(frozenset({"bool"}))
    if isinstance(value, float):
        return Kind(frozenset({"float", "int"}))
    if isinstance(value, (list, ListConfig)):
        return Kind(frozenset({"list"}))
    if isinstance(value, (dict, DictConfig)):
        return Kind(frozenset({"dict"}))
    return Kind(frozenset({type(value).__name__}))


STRING_OR_LIST = frozenset({"trainer.logger"})
"""Plain (non-dataclass) paths whose list default verl also reads from one string (verl/utils/tracking.py,
0.6.1 and 0.9.0: `if isinstance(default_backend, str): default_backend = [default_backend]`)."""


def kind_at(release: VerlRelease, path: str) -> Kind:
    """What verl accepts at `path` (a path in its config)."""
    if path in STRING_OR_LIST:
        return Kind(frozenset({"list", "str"}))
    parent_path, _, key = path.rpartition(".")
    parent = OmegaConf.select(defaults_of(release), parent_path) if parent_path else defaults_of(release)
    target = parent.get("_target_") if isinstance(parent, DictConfig) else None
    if isinstance(target, str) and target.startswith("verl."):
        annotation = _fields(unpacked(release), target).get(key)
        if annotation is not None:
            kind = _kind_of_annotation(annotation)
            if "float" in kind.types:
                kind = Kind(kind.types | {"int"}, kind.nullable, kind.choices)
            return kind
    return _python_kind(_resolved(defaults_of(release), path))


def coerce(value: Any, kind: Kind) -> tuple[bool, Any]:
    """(accepted, value as verl takes it). `pulumi config set --path` stores true/false as booleans,
    integers as numbers and everything else as a string ("2e-5", "0.7"): a string is read as the type
    verl wants when it spells one; a number where verl wants a string is that number's text."""
    if value is None:
        return kind.nullable or kind.any, None
    if kind.any:
        return True, value
    types = kind.types
    if isinstance(value, str) and "str" not in types:
        value = _parsed(value, types)
    if kind.choices:
        return value in kind.choices, value
    if isinstance(value, bool):
        return "bool" in types, value
    if isinstance(value, int):
        if "int" in types:
            return True, value
        if "float" in types:
            return True, float(value)
        return "str" in types, str(value)
    if isinstance(value, float):
        if "float" in types:
            return math.isfinite(value), value
        if "int" in types and value.is_integer():
            return True, int(value)
        return "str" in types and math.isfinite(value), str(value)
    if isinstance(value, list):
        return "list" in types, value
    return type(value).__name__ in types, value


def _parsed(text: str, types: frozenset[str]) -> Any:
    """`text` as the bool or number verl wants, when it spells one; else unchanged."""
    word = text.strip()
    if "bool" in types and word.lower() in ("true", "false"):
        return word.lower() == "true"
    if "int" in types and _INT.match(word):
        return int(word)
    if "float" in types:
        try:
            return float(word)
        except ValueError:
            return text
    return text


def _resolved(cfg: DictConfig, path: str) -> Any:
    value = OmegaConf.select(cfg, path, throw_on_missing=False)
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _leaf_paths(cfg: DictConfig) -> list[str]:
    out: list[str] = []

    def walk(node: DictConfig, prefix: str) -> None:
        for key in node.keys():
            path = f"{prefix}.{key}" if prefix else str(key)
            child = node._get_node(key)
            if isinstance(child, DictConfig) and len(child):
                walk(child, path)
            else:
                out.append(path)

    walk(cfg, "")
    return out


@lru_cache(maxsize=None)
def known_paths(release: VerlRelease) -> tuple[str, ...]:
    """Every leaf path of verl's composed config (an empty map is a leaf)."""
    return tuple(_leaf_paths(defaults_of(release)))


def nearest(path: str, release: VerlRelease) -> str | None:
    """The path of verl's config a misspelt or shortened `path` most likely means."""
    paths = known_paths(release)
    ends = [p for p in paths if p.endswith("." + path)]
    if len(ends) == 1:
        return ends[0]
    close = difflib.get_close_matches(path, paths, n=1, cutoff=0.85)
    return close[0] if close else None


def _open_map(release: VerlRelease, path: str) -> bool:
    """Whether `path` is a new key inside a map verl leaves empty for the user (an `override_config`)."""
    parent = path.rpartition(".")[0]
    while parent:
        node = OmegaConf.select(defaults_of(release), parent, throw_on_missing=False)
        if node is not None:
            return isinstance(node, DictConfig) and len(node) == 0
        parent = parent.rpartition(".")[0]
    return False


def has_interpolation(value: Any) -> bool:
    """`${` anywhere in a string of `value` (a Hydra/OmegaConf interpolation, which resolves where it is read)."""
    if isinstance(value, str):
        return INTERPOLATION in value
    if isinstance(value, Mapping):
        return any(has_interpolation(k) or has_interpolation(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(has_interpolation(v) for v in value)
    return False


def check(given: Mapping[str, Any], release: VerlRelease, owned: Mapping[str, str],
          bounds: Mapping[str, tuple[Callable[[Any], bool], str]],
          elsewhere: Mapping[str, str] = {}) -> tuple[dict[str, Any], list[Problem]]:  # noqa: B006 read only
    """({path: value as verl takes it} of the accepted entries, every problem of the others).

    `owned` maps a path verl-gke sets itself to why it does (the key to set instead); `bounds` a path to
    a test its value must pass and what the test allows; `elsewhere` a section another verl release has to
    where it runs."""
    accepted: dict[str, Any] = {}
    problems: list[Problem] = []
    defaults = defaults_of(release)
    for path, value in given.items():
        if has_interpolation(path) or has_interpolation(value):
            problems.append(Problem(path, value, "no Hydra/OmegaConf interpolation (${...}): it would be resolved "
                                    "where the config is read (${oc.env:...} reads that machine's environment). "
                                    "Write the value itself."))
            continue
        if path in owned:
            problems.append(Problem(path, value, owned[path]))
            continue
        if not is_known(release, path):
            if _open_map(release, path):
                accepted[path] = value
                continue
            if section := next((s for s in elsewhere if path.startswith(s + ".")), None):
                problems.append(Problem(path, value, f"verl {release.version}'s config has no {section}: "
                                        f"{elsewhere[section]}"))
                continue
            guess = nearest(path, release)
            hint = f"; did you mean {guess}?" if guess else ""
            problems.append(Problem(path, value, f"verl {release.version}'s config has no {path}{hint}"))
            continue
        kind = kind_at(release, path)
        ok, typed = coerce(value, kind)
        if not ok:
            default = _resolved(defaults, path)
            problems.append(Problem(path, value, f"must be {kind.describe()} (verl {release.version}'s default: "
                                    f"{json.dumps(default, default=str)})."))
            continue
        if path in bounds and not bounds[path][0](typed):
            problems.append(Problem(path, value, f"must be {bounds[path][1]}."))
            continue
        accepted[path] = typed
    return accepted, problems




@dataclass(frozen=True)
class VerlSettings:
    """The run's verl config: the platform's defaults under the user's values, composed with verl's own."""

    release: VerlRelease
    values: tuple[tuple[str, Any], ...]
    """(path, value) of every key the job's command line sets, in command-line order."""
    given: frozenset[str] = frozenset()
    """The paths the user set in verl-gke:verl."""
    added: frozenset[str] = frozenset()
    """Paths new to verl's config (keys of a map it leaves open): Hydra takes them as `+path=value`."""
    composed: DictConfig = field(default=None, compare=False, repr=False, hash=False)  # type: ignore[assignment]

    def get(self, path: str) -> Any:
        """The value verl will read at `path` (interpolations resolved, containers as plain lists and dicts)."""
        return _resolved(self.composed, path)

    @property
    def version(self) -> str:
        return self.release.version


def settings(release: VerlRelease, values: Iterable[tuple[str, Any]], given: Iterable[str] = ()) -> VerlSettings:
    """The run's settings: `values` applied to verl's defaults for `release`, as the command line applies them."""
    values = tuple(values)
    added = frozenset(path for path, _ in values if not is_known(release, path))
    return VerlSettings(release, values, frozenset(given), added, _composed(release, _frozen(values)))


def is_known(release: VerlRelease, path: str) -> bool:
    """Whether verl's config has `path` (a value verl leaves mandatory, `???`, included)."""
    parent_path, _, key = path.rpartition(".")
    parent = OmegaConf.select(defaults_of(release), parent_path) if parent_path else defaults_of(release)
    return isinstance(parent, DictConfig) and key in parent.keys()


def _frozen(values: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in values)


@lru_cache(maxsize=64)
def _composed(release: VerlRelease, values: tuple[tuple[str, Any], ...]) -> DictConfig:
    cfg = copy.deepcopy(defaults_of(release))
    OmegaConf.set_readonly(cfg, False)
    with open_dict(cfg):
        for path, value in values:
            OmegaConf.update(cfg, path, list(value) if isinstance(value, tuple) else value, merge=False,
                             force_add=True)
    OmegaConf.set_readonly(cfg, True)
    return cfg
