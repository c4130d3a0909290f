"""synth's written output is the same bytes on every run of the same program: what proves a
refactor pure is a byte-for-byte diff of dist/."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pulumi
import pytest

from domain.stack_files import PROJECT_DIR
from verl_gke import output_dir, synth


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


STACKS = ("a4", "a4x")  # one of each platform family (x86, Arm)
# `python -m verl_gke.synth STACK --out DIR` for each pair of arguments, in one process (one import of the program):
# a run that leaves state behind for the next shows as a difference too.
_SYNTH_EACH = """
import runpy, sys
for stack, out in zip(sys.argv[1::2], sys.argv[2::2]):
    sys.argv = ["verl_gke.synth", stack, "--out", out]
    try:
        runpy.run_module("verl_gke.synth", run_name="__main__", alter_sys=True)
    except SystemExit as exited:
        if exited.code:
            raise
"""


@pytest.fixture(scope="module")
def written_by_another_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], dict[str, bytes]]]:
    """The files a child process's synth of each stack wrote, started at once and read when a test asks."""
    # Different hash seeds (str sets, dicts of protobuf maps) and, each process its own, memory
    # addresses (sets of objects): neither may reach the output. The other run is the session's own
    # synth of the stack (another process, its hash seed random unless set: then this one differs).
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    root = tmp_path_factory.mktemp("synth")
    process = subprocess.Popen([sys.executable, "-c", _SYNTH_EACH, *(a for s in STACKS for a in (s, str(root / s)))],
                               cwd=PROJECT_DIR, env={**os.environ, "PYTHONHASHSEED": seed}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)

    finished = functools.cache(lambda: process.communicate(timeout=540)[1])  # its stderr, once it exited

    def written(stack: str) -> dict[str, bytes]:
        stderr = finished()
        assert process.returncode == 0, stderr.decode()[-2000:]
        return _tree(root / stack)

    yield written
    process.kill()
    process.wait()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("stack", STACKS)
def test_two_synth_runs_in_separate_processes_write_the_same_bytes(stack: str, synth_stack,
                                                                    written_by_another_process) -> None:
    expected = {name: text.encode() for name, text in synth.render(synth_stack(stack)).items()}  # meanwhile
    written = written_by_another_process(stack)
    assert json.loads(written.pop(output_dir.MARKER))["files"] == list(expected)
    assert sorted(written) == sorted(expected)
    assert [name for name in written if written[name] != expected[name]] == []


def test_a_resources_hash_is_its_type_and_name_not_its_address():
    # Pulumi keeps resources in sets (a component's children, an Output's resources) and awaits
    # them in the set's order: with address hashes, which resource registered first changed per run.
    made: list[pulumi.Resource] = []

    def program() -> None:
        made.extend(pulumi.ComponentResource("test:index:Thing", "same") for _ in range(2))
        made.append(pulumi.ComponentResource("test:index:Thing", "other"))

    synth.run_in_mocks(program)
    same, again, other = made
    assert hash(same) == hash(again) != hash(other)
    assert same != again  # identity still decides equality


def test_mapping_keys_are_written_sorted_and_lists_keep_their_order():
    registration = synth.Registration(urn="u", type="kubernetes:core/v1:ConfigMap", name="n", parent=None, custom=True,
                                      provider=None, dependencies=[],
                                      inputs={"metadata": {"name": "n", "labels": {"b": "1", "a": "2"}},
                                              "kind": "ConfigMap", "apiVersion": "v1", "data": {"z": "1", "y": "2"},
                                              "items": [{"b": 1, "a": 2}, "x", "a"]})
    files = synth.render(synth.SynthResult("s", [registration], {}))
    assert files["manifests/01-configmap-n.yaml"] == (
        "apiVersion: v1\ndata:\n  y: '2'\n  z: '1'\nkind: ConfigMap\nmetadata:\n  labels:\n    a: '2'\n    b: '1'\n"
        "  name: n\n")
    assert '"inputs": {\n      "apiVersion": "v1",\n      "data": {\n        "y": "2",\n        "z": "1"\n      },\n' \
           '      "items": [\n        {\n          "a": 2,\n          "b": 1\n        },\n        "x",\n        "a"\n' \
           '      ],\n      "kind": "ConfigMap",' in files["resources.json"]
    assert files["resources.json"].startswith('[\n  {\n    "urn": "u",\n    "type": ')
