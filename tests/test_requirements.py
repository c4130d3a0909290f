"""The two install sets: the runtime (requirements.txt: what synth, `pulumi up` and the verl-gke CLI
import) and the tests on top (requirements-torch.txt, requirements-dev.txt); and the Makefile
targets that install them."""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
# What runs on the user's machine and in the provider host. workloads/ runs in the cluster's
# images (its import-time stdlib rule is tests/test_layout.py's).
RUNTIME_SOURCES = ("__main__.py", "access", "components", "domain", "manifests", "verl_gke")
PROJECT = {"access", "components", "domain", "manifests", "verl_gke", "workloads", "tests"}


def _requirements(name: str) -> list[Requirement]:
    """The requirement lines of a requirements file (options and `-r` includes skipped)."""
    lines = (line.split("#", 1)[0].strip() for line in (ROOT / name).read_text().splitlines())
    return [Requirement(line) for line in lines if line and not line.startswith("-")]


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(requirements: list[Requirement]) -> set[str]:
    """The distributions `requirements` install here, with every dependency their metadata names
    (markers evaluated with the extras asked for)."""
    found: set[str] = set()
    todo = [(req.name, frozenset(req.extras)) for req in requirements if req.marker is None or req.marker.evaluate()]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        if (_key(name), extras) in seen:
            continue
        seen.add((_key(name), extras))
        found.add(_key(name))
        for line in metadata.requires(name) or []:
            dep = Requirement(line)
            if dep.marker is None or any(dep.marker.evaluate({"extra": extra}) for extra in extras | {""}):
                todo.append((dep.name, frozenset(dep.extras)))
    return found


def _imported_top_levels() -> dict[str, str]:
    """Top-level modules the runtime sources import at any depth (lazy imports count), to a file
    that imports each."""
    files = [ROOT / "__main__.py"] + [p for d in RUNTIME_SOURCES[1:] for p in sorted((ROOT / d).rglob("*.py"))]
    found: dict[str, str] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return {m: f for m, f in found.items() if m not in sys.stdlib_module_names and m not in PROJECT}


def test_no_test_only_package_in_the_runtime() -> None:
    runtime = {_key(req.name) for req in _requirements("requirements.txt")}
    tests = {_key(req.name) for name in ("requirements-dev.txt", "requirements-torch.txt")
             for req in _requirements(name)}
    assert tests, "requirements-dev.txt names no package"
    assert runtime & tests == set()
    assert {"pytest", "torch", "ruff", "transformers"} <= tests


def test_everything_the_runtime_imports_is_installed_by_requirements_txt() -> None:
    closure = _closure(_requirements("requirements.txt"))
    providers = metadata.packages_distributions()
    imported = _imported_top_levels()
    assert {"pulumi", "pulumi_gcp", "pulumi_kubernetes", "ray", "yaml", "hydra", "matplotlib"} <= set(imported)
    missing = {module: f"{where} (from {providers.get(module)})" for module, where in imported.items()
               if not {_key(dist) for dist in providers.get(module, [])} & closure}
    assert missing == {}


def test_the_tests_torch_is_the_cpu_build_wherever_pypi_has_cuda() -> None:
    torch_file = (ROOT / "requirements-torch.txt").read_text()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in torch_file.splitlines()
    for name in ("requirements-torch.txt", "constraints.txt"):
        pins = {str(req.marker): str(req.specifier) for req in _requirements(name) if req.name == "torch"}
        assert pins == {'sys_platform == "linux"': "==2.13.0+cpu", 'sys_platform != "linux"': "==2.13.0"}, name
    # requirements-dev.txt does not name torch (or the index): pip would ask the index for every package.
    dev = (ROOT / "requirements-dev.txt").read_text()
    assert "download.pytorch.org" not in dev and "torch" not in {req.name for req in _requirements("requirements-dev.txt")}


def _rule(makefile: str, target: str) -> tuple[list[str], list[str]]:
    """A Makefile rule's prerequisites and recipe lines."""
    match = re.search(rf"^{re.escape(target)}:([^\n]*)\n((?:\t[^\n]*\n)*)", makefile, re.M)
    assert match, target
    return match.group(1).split(), [line.strip() for line in match.group(2).splitlines()]


def test_make_synth_installs_only_the_runtime_and_make_test_adds_the_test_set() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for target in ("synth", "synth-all"):
        assert _rule(makefile, target)[0] == ["$(RUNTIME)"]
    prerequisites, recipe = _rule(makefile, "$(RUNTIME)")
    assert "requirements-dev.txt" not in prerequisites
    installs = [line for line in recipe if " -c " in line]
    assert installs == ["$(PIP) uv -c constraints.txt", "$(UV) -r requirements.txt -c constraints.txt"]
    for target in ("test", "lint"):
        assert _rule(makefile, target)[0] == ["$(TESTSET)"]
    prerequisites, recipe = _rule(makefile, "$(TESTSET)")
    assert prerequisites[0] == "$(RUNTIME)"
    assert [line.rstrip(" \\") for line in recipe if " -r " in line] == [
        "$(UV) --offline --no-deps -r requirements-torch.txt -c constraints.txt 2>/dev/null ||",
        "$(UV) --no-deps -r requirements-torch.txt -c constraints.txt",
        "$(UV) -r requirements-dev.txt -c constraints.txt",
    ]


def test_the_install_is_uv_pinned_with_the_same_files_and_shows_each_package() -> None:
    """uv installs the pinned sets (itself pinned in constraints.txt, installed by pip with nothing compiled);
    its lines (each package installed) are the install's progress, so it is not quiet."""
    makefile = (ROOT / "Makefile").read_text()
    (pip,) = [line for line in makefile.splitlines() if line.startswith("PIP :=")]
    assert pip == "PIP := $(BIN)/pip install --progress-bar off --disable-pip-version-check --no-compile"
    (uv,) = [line for line in makefile.splitlines() if line.startswith("UV :=")]
    assert uv.endswith("$(BIN)/uv pip install --python $(BIN)/python") and "--quiet" not in uv and "compile" not in uv
    assert "uv==" in (ROOT / "constraints.txt").read_text()
    assert "uv lists each package" in "".join(_rule(makefile, "$(RUNTIME)")[1])
