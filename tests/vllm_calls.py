"""What verl asks of vLLM, read from verl's source, and how two vLLM sources answer it.

Static reading with `ast` only (importing verl or vLLM needs torch and CUDA): the names verl imports
from vLLM (through re-exports and `MODULE_ATTRS`), the members it touches, the engine arguments and
engine methods it uses. `findings(verl, image, ci)` lists where the image's vLLM differs from the one
verl's CI ran: a missing name, a signature, a body, a field's type or default. Not followed: attribute
chains on run-time objects (except RUN_MODEL) and inherited methods (docs/checkpoints-and-a4x.md)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SERVER = "verl/workers/rollout/vllm_rollout/vllm_async_server.py"
"""verl's vLLM server: it builds the `vllm serve` arguments and drives the engine."""
ENGINE_ARGS = ("vllm.engine.arg_utils", "EngineArgs")
ENGINE = ("vllm.v1.engine.async_llm", "AsyncLLM")
RUN_MODEL = ("vllm.model_executor.models.qwen2", "Qwen2ForCausalLM")
"""The model class vLLM serves Qwen2.5-32B-Instruct with (architectures: Qwen2ForCausalLM); verl's
weight sync calls its `load_weights`."""
_ARG_DICTS = {"args", "dp_args", "lora_args", "engine_kwargs"}
_VERSION_LITERAL = re.compile(r"""(?:parse|Version)\(\s*["'](\d+(?:\.\d+)*)["']\s*\)""")


@dataclass(frozen=True)
class Use:
    """One `from vllm.<module> import <name>` (name None: `import vllm.<module>`) in a verl file."""

    file: str
    module: str
    name: str | None
    guarded: bool
    """Inside a `try` whose handler catches ImportError: verl runs on without it."""


def _is_vllm(module: str | None) -> bool:
    return module is not None and (module == "vllm" or module.startswith("vllm."))


def _catches_import_error(node: ast.Try) -> bool:
    names = set()
    for handler in node.handlers:
        for n in ast.walk(handler.type) if handler.type else ():
            if isinstance(n, ast.Name):
                names.add(n.id)
    return bool(names & {"ImportError", "ModuleNotFoundError", "Exception"})


def _imports(node: ast.AST, file: str, guarded: bool) -> Iterator[Use]:
    for child in ast.iter_child_nodes(node):
        inner = guarded or (isinstance(node, ast.Try) and child in node.body and _catches_import_error(node))
        if isinstance(child, ast.ImportFrom) and child.level == 0 and _is_vllm(child.module):
            yield from (Use(file, child.module, a.name, inner) for a in child.names)
        elif isinstance(child, ast.Import):
            yield from (Use(file, a.name, None, inner) for a in child.names if _is_vllm(a.name))
        yield from _imports(child, file, inner)


def uses(verl_root: Path) -> list[Use]:
    """Every vLLM import in verl's package, in file order."""
    return [use for path in sorted((verl_root / "verl").rglob("*.py"))
            for use in _imports(ast.parse(path.read_text()), path.relative_to(verl_root).as_posix(), False)]


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def module_file(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _top_level(tree: ast.Module) -> dict[str, ast.stmt]:
    """Names a module binds at import time (under `if`/`try` too), each to its first binding."""
    out: dict[str, ast.stmt] = {}

    def walk(body: list[ast.stmt]) -> None:
        for s in body:
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.setdefault(s.name, s)
            elif isinstance(s, ast.Assign):
                for t in s.targets:
                    if isinstance(t, ast.Name):
                        out.setdefault(t.id, s)
            elif isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
                out.setdefault(s.target.id, s)
            elif isinstance(s, (ast.Import, ast.ImportFrom)):
                for a in s.names:
                    out.setdefault((a.asname or a.name).split(".")[0], s)
            elif isinstance(s, ast.If):
                walk(s.body)
                walk(s.orelse)
            elif isinstance(s, ast.Try):
                walk(s.body)
                for h in s.handlers:
                    walk(h.body)
                walk(s.orelse)

    walk(tree.body)
    return out


def _lazy(tree: ast.Module) -> dict[str, str]:
    """vllm/__init__.py's `MODULE_ATTRS = {"LLM": ".entrypoints.llm:LLM", ...}` (served by __getattr__)."""
    for s in tree.body:
        if isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "MODULE_ATTRS" for t in s.targets):
            return ast.literal_eval(s.value)
    return {}


def _absolute(module: str, path: Path, relative: str) -> str:
    level = len(relative) - len(relative.lstrip("."))
    if not level:
        return relative
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    package = package[: len(package) - (level - 1)]
    rest = relative.lstrip(".")
    return ".".join(package + ([rest] if rest else []))


Definition = tuple[str, ast.stmt | None]
"""(module, the defining statement), or (module, None) where the name is a module."""


def resolve(root: Path, module: str, name: str, depth: int = 0) -> Definition | None:
    """Where `from <module> import <name>` finds its object in the tree at `root`; None: ImportError."""
    path = module_file(root, module)
    if path is None or depth > 20:
        return None
    tree = _tree(path)
    node = _top_level(tree).get(name)
    if node is None:
        if name in (lazy := _lazy(tree)):
            target, attr = lazy[name].split(":")
            return resolve(root, _absolute(module, path, target), attr, depth + 1)
        submodule = f"{module}.{name}"
        return (submodule, None) if module_file(root, submodule) else None
    if isinstance(node, ast.ImportFrom):
        source = _absolute(module, path, "." * node.level + (node.module or ""))
        original = next(a.name for a in node.names if (a.asname or a.name) == name)
        if not source.startswith("vllm"):
            return (module, node)  # re-exported from another package: compare the import itself
        return resolve(root, source, original, depth + 1)
    if isinstance(node, ast.Import):
        return (name, None)
    return (module, node)


def _members(cls: ast.ClassDef) -> dict[str, ast.stmt]:
    out: dict[str, ast.stmt] = {}
    for s in cls.body:
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[s.name] = s
        elif isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
            out[s.target.id] = s
        elif isinstance(s, ast.Assign):
            for t in s.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = s
    return out


def _signature(node: ast.stmt) -> str:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return ast.dump(node.args) + (ast.dump(node.returns) if node.returns else "")
    if isinstance(node, ast.AnnAssign):
        return ast.dump(node.annotation) + (ast.dump(node.value) if node.value else "")
    if isinstance(node, ast.ClassDef):
        return ast.dump(ast.Tuple([*node.bases, *(k.value for k in node.keywords)]))
    return ast.dump(node)


def _body(node: ast.stmt) -> str:
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return "".join(ast.dump(s) for s in body)


def _compare(label: str, image: ast.stmt | None, ci: ast.stmt | None) -> Iterator[tuple[str, str]]:
    if image is None or ci is None:
        yield label, "missing in the image's vLLM" if ci is not None else "missing in the CI's vLLM"
    elif type(image) is not type(ci) or _signature(image) != _signature(ci):
        yield label, "signature differs"
    elif not isinstance(image, ast.ClassDef) and _body(image) != _body(ci):
        yield label, "body differs"


def _touched(path: Path) -> set[str]:
    """Attribute names and keyword names a verl file uses: what it can ask of a vLLM class."""
    names = {"__init__", "__post_init__"}
    for n in ast.walk(_tree(path)):
        if isinstance(n, ast.Attribute):
            names.add(n.attr)
        elif isinstance(n, ast.keyword) and n.arg:
            names.add(n.arg)
    return names


def _class_members(label: str, image: ast.ClassDef, ci: ast.ClassDef,
                   touched: set[str]) -> Iterator[tuple[str, str]]:
    if _signature(image) != _signature(ci):
        yield f"{label} (bases)", "signature differs"
    mine, theirs = _members(image), _members(ci)
    for member in sorted(touched & (set(mine) | set(theirs))):
        yield from _compare(f"{label}.{member}", mine.get(member), theirs.get(member))


def engine_arg_keys(verl_root: Path) -> set[str]:
    """The `vllm serve` options verl's server sets: string keys it puts into its argument dicts."""
    tree = _tree(verl_root / SERVER)
    launch = next(n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef)
                  and any(isinstance(c, ast.Name) and c.id == "build_cli_args_from_config" for c in ast.walk(n)))
    keys: set[str] = set()

    def literal_keys(d: ast.Dict) -> set[str]:
        return {k.value for k in d.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}

    for n in ast.walk(launch):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Name) and t.id in _ARG_DICTS and isinstance(n.value, ast.Dict):
                    keys |= literal_keys(n.value)
                if (isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id in _ARG_DICTS
                        and isinstance(t.slice, ast.Constant)):
                    keys.add(t.slice.value)
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "update"
              and isinstance(n.func.value, ast.Name) and n.func.value.id in _ARG_DICTS):
            keys |= set().union(*(literal_keys(a) for a in n.args if isinstance(a, ast.Dict)))
    return keys


def engine_methods(verl_root: Path) -> set[str]:
    """Methods verl's server calls on its engine (`self.engine.x(...)`, `engine_client.x(...)`)."""
    out = set()
    for n in ast.walk(_tree(verl_root / SERVER)):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
            receiver = n.func.value
            name = receiver.attr if isinstance(receiver, ast.Attribute) else getattr(receiver, "id", None)
            if name in ("engine", "engine_client"):
                out.add(n.func.attr)
    return out


def version_literals(verl_root: Path) -> set[str]:
    """Every version verl compares against (`version.parse("0.22.0")`): vLLM gates among them."""
    out: set[str] = set()
    for path in (verl_root / "verl").rglob("*.py"):
        out |= set(_VERSION_LITERAL.findall(path.read_text()))
    return out


def _class(root: Path, where: tuple[str, str]) -> ast.ClassDef:
    found = resolve(root, *where)
    assert found is not None and isinstance(found[1], ast.ClassDef), f"{where} is not a class under {root}"
    return found[1]


def findings(verl_root: Path, image: Path, ci: Path) -> dict[str, str]:
    """`vllm.<module>:<name>[.<member>]` -> how the image's vLLM differs from the CI's, for everything
    verl asks of it; empty when the image's vLLM answers verl exactly as the one verl's CI ran."""
    out: dict[str, str] = {}
    by_symbol: dict[tuple[str, str | None], list[Use]] = {}
    for use in uses(verl_root):
        by_symbol.setdefault((use.module, use.name), []).append(use)
    for (module, name), sites in sorted(by_symbol.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        label = f"{module}:{name}" if name else module
        if name is None:
            if (module_file(image, module) is None) != (module_file(ci, module) is None):
                out[label] = "module missing in one of them"
            continue
        mine, theirs = resolve(image, module, name), resolve(ci, module, name)
        if mine is None or theirs is None:
            if mine is not None or theirs is not None or not all(s.guarded for s in sites):
                out[label] = ("missing in the image's vLLM" if theirs else "missing in the CI's vLLM" if mine
                              else "missing in both")
            continue
        a, b = mine[1], theirs[1]
        if a is None or b is None:
            if (a is None) != (b is None):
                out[label] = "a module in one, an object in the other"
            continue
        if isinstance(a, ast.ClassDef) and isinstance(b, ast.ClassDef):
            touched = set().union(*(_touched(verl_root / s.file) for s in sites))
            out.update(_class_members(label, a, b, touched))
        else:
            out.update(_compare(label, a, b))
    args_image, args_ci = _members(_class(image, ENGINE_ARGS)), _members(_class(ci, ENGINE_ARGS))
    for key in sorted(engine_arg_keys(verl_root)):
        out.update(_compare(f"{ENGINE_ARGS[0]}:{ENGINE_ARGS[1]}.{key}", args_image.get(key), args_ci.get(key)))
    engine_image, engine_ci = _members(_class(image, ENGINE)), _members(_class(ci, ENGINE))
    for method in sorted(engine_methods(verl_root)):
        out.update(_compare(f"{ENGINE[0]}:{ENGINE[1]}.{method}", engine_image.get(method), engine_ci.get(method)))
    model_image, model_ci = _members(_class(image, RUN_MODEL)), _members(_class(ci, RUN_MODEL))
    out.update(_compare(f"{RUN_MODEL[0]}:{RUN_MODEL[1]}.load_weights",
                        model_image.get("load_weights"), model_ci.get("load_weights")))
    return out
