"""Config values as the Pulumi CLI types them, so that synth refuses what `pulumi up` would.

Each key's declared type in Pulumi.yaml is checked as the CLI checks stack values (pulumi/pulumi
pkg/workspace/config.go `validateStackConfigValue`): a string is any text, an integer what Go's
strconv.Atoi reads or a YAML number without a fraction, a boolean "true"/"false" or a YAML boolean, an
array a YAML list of the items' type, an object a YAML mapping. Stack files are read as yaml.v3 reads
them (YAML 1.2) and each value handed over as text as `MarshalString` writes it: `read_stack_yaml` and
`engine_string` do the same offline.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

_ATOI = re.compile(r"[+-]?[0-9]+")
_INT64 = range(-(2**63), 2**63)


@dataclass(frozen=True)
class Declared:
    """A key's type as Pulumi.yaml declares it."""

    type: str
    items: str | None = None
    """An array's items' type."""

    @property
    def name(self) -> str:
        """As the CLI names it in its refusal: `array<string>`."""
        return f"array<{self.items}>" if self.items else self.type


class TypeProblem(ValueError):
    """A value the CLI refuses for its declared type; the message says what is allowed."""


def declarations(config: dict[str, Any]) -> dict[str, Declared]:
    """Pulumi.yaml's `config:` block -> key -> Declared (keys without a type are left out)."""
    out = {}
    for key, decl in config.items():
        if isinstance(decl, dict) and isinstance(decl.get("type"), str):
            items = decl.get("items")
            out[key] = Declared(decl["type"], items.get("type") if isinstance(items, dict) else None)
    return out


def _is(value: Any, kind: str | None) -> bool:
    """`ValidateConfigValue` for one JSON value (an array's item) of type `kind`."""
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        if isinstance(value, bool):
            return False
        if isinstance(value, int | float):
            return float(value).is_integer()
        return isinstance(value, str) and bool(_ATOI.fullmatch(value)) and int(value) in _INT64
    if kind == "boolean":
        return isinstance(value, bool) or value in ("true", "false")
    if kind == "object":
        return isinstance(value, dict)
    return False


_FRACTION = re.compile(r"[0-9]+\.[0-9]*[1-9][0-9]*")
_PLURAL = {"string": "strings", "integer": "whole numbers", "boolean": "booleans (true or false)",
           "object": "maps"}


def from_engine(text: str, declared: Declared) -> Any:
    """The program's value of a config text the engine passes for a key of this declared type; raises
    TypeProblem, in our words, where the CLI refuses it."""
    if declared.type == "boolean":
        if text in ("true", "false"):
            return text == "true"
        raise TypeProblem("must be true or false (Pulumi's boolean type: `pulumi up` refuses any other spelling).")
    if declared.type == "integer":
        if _ATOI.fullmatch(text) and int(text) in _INT64:
            return int(text)
        if _FRACTION.fullmatch(text):  # 1.5: say what it rounds to, and that no fraction gets through Pulumi
            low = math.floor(float(text))
            raise TypeProblem(f"must be a whole number such as {low} or {low + 1} (Pulumi's integer type has no "
                              "fractions).")
        raise TypeProblem("must be a whole number such as 2 (Pulumi's integer type).")
    if declared.type not in ("array", "object"):
        return text
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if declared.type == "object":
        if not isinstance(value, dict):
            raise TypeProblem("must be a map (Pulumi's object type: a YAML mapping in the stack file; one entry is "
                              "set with `pulumi config set --path <key>.<name> <value>`).")
        return value
    if not isinstance(value, list):
        raise TypeProblem('must be a list such as ["a", "b"] (Pulumi\'s array type: a YAML list in the stack file).')
    if declared.items and not all(_is(item, declared.items) for item in value):
        raise TypeProblem(f"must be a list of {_PLURAL.get(declared.items, declared.items)} (Pulumi's "
                          f"{declared.name} type).")
    return value


def shape_problem(value: Any, declared: Declared) -> str | None:
    """What the CLI refuses in a stack file's value before its text is looked at: an empty value, one value
    for an array or object, a list or mapping for a single value. None when the shape fits."""
    if value is None:
        return f"empty; give it a value or remove the line (Pulumi refuses an empty {declared.name})."
    many = isinstance(value, list | dict) and not is_secure(value)
    if declared.type in ("array", "object") and not many and not is_secure(value):
        kind = "list" if declared.type == "array" else "mapping"
        return (f"must be a YAML {kind} in the stack file (Pulumi.yaml declares it {declared.name}; Pulumi "
                "refuses a single value).")
    if declared.type not in ("array", "object") and many:
        return f"must be one value, not a YAML list or mapping (Pulumi.yaml declares it {declared.name})."
    if isinstance(value, float) and not math.isfinite(value):
        return "is .inf or .nan, which Pulumi cannot store as config."
    return None


def is_secure(value: Any) -> bool:
    """An encrypted stack value: `{secure: <ciphertext>}`."""
    return isinstance(value, dict) and set(value) == {"secure"}


def engine_string(value: Any) -> str:
    """A stack file's value as the engine hands it to the program (config.Value's text)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        # Go's encoding/json: no fraction for a whole number, the shortest digits otherwise.
        return str(int(value)) if value.is_integer() and abs(value) < 1e21 else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


# --- YAML 1.2 as yaml.v3 resolves plain scalars (its resolve.go) -------------------------------

class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader with yaml.v3's implicit types instead of YAML 1.1's."""


_REPLACED = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
             "tag:yaml.org,2002:null", "tag:yaml.org,2002:timestamp"}
_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in _REPLACED]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                    list("tTfF"))
_Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"),
                                    ["~", "n", "N", ""])
# v3 drops every '_' and tries strconv.ParseInt(s, 0, 64) (0x, 0o, 0b, a leading 0 for octal), then
# ParseFloat for its float pattern; .inf and .nan are floats.
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+|[0-9][0-9_]*)$"),
    list("-+0123456789"))
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:\.[0-9_]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
               r"|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def _go_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int | float:
    text = loader.construct_scalar(node).replace("_", "")
    sign, digits = (-1, text[1:]) if text[:1] == "-" else (1, text.lstrip("+"))
    try:
        if digits[:2].lower() in ("0x", "0o", "0b"):
            return sign * int(digits, 0)
        return sign * int(digits, 8 if len(digits) > 1 and digits[0] == "0" else 10)
    except ValueError:
        return float(text)  # 019: not octal, and v3's float pattern takes it


_Yaml12Loader.add_constructor("tag:yaml.org,2002:int", _go_int)


def _unique_keys(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    """yaml.v3 refuses a mapping key given twice (PyYAML would keep the last): so does this."""
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if isinstance(key, str) and key in seen:
            raise DuplicateKey(key, seen[key], key_node.start_mark.line + 1)
        seen.setdefault(key, key_node.start_mark.line + 1)
    return loader.construct_mapping(node)


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key: str, first: int, second: int) -> None:
        super().__init__(f"{key} is given twice, at lines {first} and {second} (Pulumi refuses a key given twice); "
                         "keep one")


_Yaml12Loader.add_constructor("tag:yaml.org,2002:map", _unique_keys)


def read_stack_yaml(text: str) -> Any:
    """A stack file's YAML as the Pulumi CLI reads it (yaml.v3): raises yaml.YAMLError."""
    return yaml.load(text, Loader=_Yaml12Loader)  # noqa: S506 a SafeLoader subclass
