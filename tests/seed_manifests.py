"""The tutorial's own manifests, read from its code blocks (tests/tutorial), so tests compare the
builders' output with the spec itself rather than with a retyped copy of it."""

from __future__ import annotations

import ast
import operator
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

TUTORIAL_DIR = Path(__file__).parent / "tutorial"
TUTORIAL = "code-ja.txt"
"""The Japanese edition's code blocks: the only edition with the A4X steps."""

_VAR = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)\}")
_ARITH = re.compile(r"\$\(\((.+?)\)\)")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _arith(expr: str, env: dict[str, str]) -> str | None:
    """The shell's `$((...))` integer arithmetic (+, -, * over numbers and variables from `env`);
    None when it names a variable `env` lacks."""

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise KeyError(node.id)
            return int(env[node.id])
        raise AssertionError(f"unsupported shell arithmetic: $(({expr}))")

    try:
        return str(ev(ast.parse(expr, mode="eval").body))
    except KeyError:
        return None


def _substitute(text: str, env: dict[str, str]) -> str:
    """envsubst: variables in `env` are replaced, others stay as written, so a comparison that
    depends on one fails showing the literal `${NAME}`."""
    text = _ARITH.sub(lambda m: _arith(m.group(1), env) or m.group(0), text)
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def _blocks(seed: str) -> list[str]:
    """Each YAML block of the seed: from an `apiVersion:` line to the next blank line or heredoc end."""
    blocks: list[str] = []
    current: list[str] | None = None
    for line in (TUTORIAL_DIR / seed).read_text().splitlines():
        if current is None:
            if line.startswith("apiVersion:"):
                current = [line]
        elif line.strip() in ("", "EOF", "```"):
            blocks.append("\n".join(current))
            current = None
        else:
            current.append(line)
    if current:
        blocks.append("\n".join(current))
    return blocks


def tutorial_objects(env: dict[str, str], seed: str = TUTORIAL) -> list[dict[str, Any]]:
    """Every object of the seed's manifests in order, with `${VAR}` and `$((...))` filled from `env`."""
    return [doc for block in _blocks(seed) for doc in yaml.safe_load_all(_substitute(block, env)) if doc]


def tutorial_named(kind: str, name: str, env: dict[str, str], seed: str = TUTORIAL) -> list[dict[str, Any]]:
    """The seed's objects of `kind` named `name`, in the tutorial's order."""
    return [o for o in tutorial_objects(env, seed) if o["kind"] == kind and o["metadata"]["name"] == name]


def _helm_scalar(raw: str) -> Any:
    """A `--set` value as Helm reads it: booleans, integers, `{a,b}` lists, else a string."""
    if raw in ("true", "false"):
        return raw == "true"
    if re.fullmatch(r"-?\d+", raw):
        return int(raw)
    if raw.startswith("{") and raw.endswith("}"):
        return [_helm_scalar(item) for item in raw[1:-1].split(",") if item]
    return raw


def _helm_set(values: dict[str, Any], path: str, value: Any) -> None:
    """Set `a.b[0].c` in nested dicts and lists, as `helm --set` does."""
    keys: list[str | int] = []
    for part in path.split("."):
        name, *indexes = re.split(r"\[(\d+)\]", part)
        keys.append(name)
        keys.extend(int(i) for i in indexes if i)
    node: Any = values
    for key, following in zip(keys, keys[1:]):
        if isinstance(key, int):
            node.extend([None] * (key + 1 - len(node)))
        if node[key] if isinstance(key, int) else key in node:
            node = node[key]
            continue
        node[key] = [] if isinstance(following, int) else {}
        node = node[key]
    last = keys[-1]
    if isinstance(last, int):
        node.extend([None] * (last + 1 - len(node)))
    node[last] = value


def tutorial_helm_install(release: str, env: dict[str, str], seed: str = TUTORIAL) -> dict[str, Any]:
    """The tutorial's `helm upgrade --install <release> <chart> ...` command, parsed:
    {"chart", "version", "namespace", "values"} (values from its `--set` flags)."""
    lines = (TUTORIAL_DIR / seed).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"helm upgrade --install {release} "))
    command = []
    for line in lines[start:]:
        command.append(line.rstrip("\\").strip())
        if not line.endswith("\\"):
            break
    tokens = shlex.split(_substitute(" ".join(command), env))
    out: dict[str, Any] = {"chart": tokens[4], "version": None, "namespace": None, "values": {}}
    i = 5
    while i < len(tokens):
        flag, _, inline = tokens[i].partition("=")
        value = inline if inline else tokens[i + 1]
        i += 1 if inline else 2
        if flag == "--set":
            path, _, raw = value.partition("=")
            _helm_set(out["values"], path, _helm_scalar(raw))
        else:
            out[flag.removeprefix("--")] = value
    return out
