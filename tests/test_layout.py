"""The architecture as an import graph read with `ast`: the domain at the bottom, no circles."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("workloads", "domain", "manifests", "access", "verl_gke", "components")
# Each package and what it may import of the project, bottom up. access/ (the Ray head, the cluster's
# API, registries) is shared by the CLI and the components, which never import each other, but for
# verl_gke.synth: the offline engine that runs the program.
MAY_IMPORT = {
    "workloads": {"workloads"},
    "domain": {"domain"},
    "manifests": {"manifests", "domain", "workloads"},
    "access": {"access", "manifests", "domain", "workloads"},
    "verl_gke": {"verl_gke", "access", "manifests", "domain", "workloads"},
    "components": {"components", "access", "manifests", "domain", "workloads"},
}
ENGINE_STAND_IN = "verl_gke.synth"
BOTTOM = "domain.staged"
"""What the program and the staging Job share (names, checks, the wheel's download): below every layer,
so the workloads may import it too; it imports nothing of the project and ships beside stage_data.py."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in (ROOT / package).glob("*.py")}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules `path` imports, at any depth of the file (lazy imports count)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        found |= {name for name in names if name in modules}
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as a path, or [] (depth-first search with colours)."""
    colour: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        colour[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if colour.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if not colour.get(nxt) and (found := visit(nxt)):
                return found
        colour[node] = 2
        stack.pop()
        return []

    for node in sorted(graph):
        if not colour.get(node) and (found := visit(node)):
            return found
    return []


def test_no_import_cycles_between_project_modules():
    assert _cycle(_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


def test_each_package_imports_only_the_layers_below_it():
    wrong = sorted(f"{module} imports {target}" for module, targets in _graph().items() for target in targets
                   if module != ENGINE_STAND_IN and target != BOTTOM
                   and target.split(".")[0] not in MAY_IMPORT[module.split(".")[0]])
    assert wrong == []


def test_the_bottom_module_imports_nothing_of_the_project():
    assert _graph()[BOTTOM] == set()


def test_the_engine_stand_in_is_the_only_module_above_the_components():
    graph = _graph()
    above = sorted(m for m, targets in graph.items()
                   if m.startswith("verl_gke") and any(t.startswith("components") for t in targets))
    assert above == [ENGINE_STAND_IN]


def test_the_job_provider_module_holds_only_the_provider():
    """Head access, the Lease, the gates and the polls live in components/job_*.py."""
    assert len((ROOT / "components" / "grpo_job.py").read_text().splitlines()) <= 500


def test_the_domain_and_the_workloads_never_import_pulumi():
    offenders = []
    for name, path in _modules().items():
        if name.split(".")[0] in ("domain", "workloads", "manifests"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                        else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                offenders += [f"{name}: {m}" for m in mods if m.split(".")[0] in ("pulumi", "pulumi_gcp", "pulumi_kubernetes")]
    assert offenders == []


def test_the_workloads_import_only_the_standard_library_at_load():
    """They run in the cluster's stock images; a third-party import inside a function is for the
    step that runs where that library is (staging's pyarrow and huggingface_hub)."""
    import sys

    offenders = []
    for name, path in _modules().items():
        if name.startswith("workloads") or name == BOTTOM:
            for node in ast.parse(path.read_text()).body:
                mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                        else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                top = {m.split(".")[0] for m in mods}
                offenders += [f"{name}: {t}" for t in top
                              if t and t not in sys.stdlib_module_names and t not in ("workloads", "domain", "__future__")]
    assert offenders == []


def test_every_package_is_installed():
    """The verl-gke command and Pulumi's provider host import the project from its install."""
    import tomllib

    installed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert sorted(installed) == sorted(PACKAGES)
