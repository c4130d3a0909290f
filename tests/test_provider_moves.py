"""Dynamic providers across a move of their module, driven through the installed SDK's own provider
host (pulumi/dynamic/__main__.py 3.272.0, `DynamicResourceProviderServicer`, without its `main()`),
called with the protocol's requests. What the servicer does, read in that file, below."""

# `Check` and `Diff` unpickle the provider from the new
# inputs' `__provider` (the old one only when the new is unknown); `Update` stores the new inputs'
# `__provider` in the outputs; `Read` and `Delete` unpickle the one stored in the outputs. So a stack
# whose state names a module path that no longer imports can refresh and destroy only after an update
# stored the new reference, and the engine calls `Update` only when `Diff` reports a change
# (pkg/resource/deploy/step_generator.go `continueStepsFromDiff`): pulumi/pulumi#6238.

from __future__ import annotations

import asyncio
import base64
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dill
import grpc
import pulumi.dynamic
import pytest
from google.protobuf import struct_pb2
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime import proto, rpc

from components import grpo_job, pinned_image
from components.provider_reference import STATE_REFERENCES
from components.grpo_job import GrpoJobProvider
from components.pinned_image import PinnedImageProvider
from verl_gke import synth

PROVIDER_KEY = "__provider"
OLD_HOME = "verl_gke_provider_old_home"
"""A module path that no longer imports: where a provider lived before a move."""



def _host() -> Any:
    """A fresh servicer from the installed pulumi/dynamic/__main__.py (its provider cache included)."""
    path = Path(pulumi.dynamic.__file__).with_name("__main__.py")
    body, call = path.read_text().rstrip().rsplit("\n", 1)
    assert call == "main()", "the host's module no longer ends by serving: read it again"
    namespace: dict[str, Any] = {"__name__": "pulumi_dynamic_host"}
    exec(compile(body, str(path), "exec"), namespace)  # noqa: S102 - the installed SDK's own code
    return namespace["DynamicResourceProviderServicer"]()


class _Aborted(Exception):
    pass


class _Context:
    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise _Aborted(details)


def _struct(props: dict[str, Any]) -> struct_pb2.Struct:
    return asyncio.run(rpc.serialize_properties(props, {}))


def _props(message: struct_pb2.Struct) -> dict[str, Any]:
    return rpc.deserialize_properties(message)


@contextmanager
def _moved(provider_class: type) -> Iterator[str]:
    """The provider pickled as it was while it lived in OLD_HOME; the module is gone afterwards."""
    old_home = types.ModuleType(OLD_HOME)
    moved = type(provider_class.__name__, (provider_class,), {"__module__": OLD_HOME})
    setattr(old_home, provider_class.__name__, moved)
    sys.modules[OLD_HOME] = old_home
    try:
        pickled = serialize_provider(moved())
    finally:
        del sys.modules[OLD_HOME]
    assert OLD_HOME.encode() in base64.b64decode(pickled)  # by reference, not by value
    yield pickled


def _pinned_outs(provider: str) -> dict[str, Any]:
    return {**pinned_image.outs("verlai/verl:vllm011.latest", "sha256:" + "ab" * 32), PROVIDER_KEY: provider}


def test_a_stale_reference_breaks_refresh_until_an_update_stores_the_new_one() -> None:
    host, current = _host(), serialize_provider(PinnedImageProvider())
    with _moved(PinnedImageProvider) as stale:
        state = _pinned_outs(stale)
    inputs = {"image": state["image"], "digest": None, "ref": None, PROVIDER_KEY: current}
    with pytest.raises(_Aborted, match=f"No module named '{OLD_HOME}'"):
        host.Read(proto.ReadRequest(id=state["ref"], properties=_struct(state)), _Context())

    diff = host.Diff(proto.DiffRequest(id=state["ref"], olds=_struct(state), news=_struct(inputs)), _Context())
    assert diff.changes == proto.DiffResponse.DIFF_SOME and list(diff.replaces) == []
    updated = _props(host.Update(proto.UpdateRequest(id=state["ref"], olds=_struct(state), news=_struct(inputs)),
                                 _Context()).properties)
    # The pin is kept (no registry asked) and the state now names the importable module.
    assert updated == _pinned_outs(current)
    read = host.Read(proto.ReadRequest(id=state["ref"], properties=_struct(updated)), _Context())
    assert _props(read.properties) == updated


def test_the_run_takes_a_moved_provider_reference_as_an_update(synth_stack) -> None:
    host, current = _host(), serialize_provider(GrpoJobProvider())
    job = next(r for r in synth_stack("a4-standard").registrations if r.type == synth.GRPO_JOB_TYPE)
    inputs = {**synth.engine_numbers({k: v for k, v in job.inputs.items() if k != PROVIDER_KEY}),
              PROVIDER_KEY: current}
    with _moved(GrpoJobProvider) as stale:
        state = {**grpo_job.planned_outs(inputs, "RUNNING"), PROVIDER_KEY: stale}
    state["submission_id"] = sid = "verl-grpo-a4-standard-0123456789ab"
    with pytest.raises(_Aborted, match=f"No module named '{OLD_HOME}'"):
        host.Delete(proto.DeleteRequest(id=sid, properties=_struct(state)), _Context())

    diff = host.Diff(proto.DiffRequest(id=sid, olds=_struct(state), news=_struct(inputs)), _Context())
    assert diff.changes == proto.DiffResponse.DIFF_SOME and list(diff.replaces) == []
    updated = _props(host.Update(proto.UpdateRequest(id=sid, olds=_struct(state), news=_struct(inputs)),
                                 _Context()).properties)
    assert updated[PROVIDER_KEY] == current
    assert (updated["submission_id"], updated["status"]) == (sid, "RUNNING")


@pytest.mark.parametrize("provider", [GrpoJobProvider(), PinnedImageProvider()])
def test_an_unchanged_reference_is_no_change(provider, synth_stack) -> None:
    host, current = _host(), serialize_provider(provider)
    if isinstance(provider, GrpoJobProvider):
        job = next(r for r in synth_stack("a4-standard").registrations if r.type == synth.GRPO_JOB_TYPE)
        inputs = {**synth.engine_numbers(job.inputs), PROVIDER_KEY: current}
        state = {**grpo_job.planned_outs(inputs, "RUNNING"), PROVIDER_KEY: current}
    else:
        state = _pinned_outs(current)
        inputs = {"image": state["image"], "digest": None, "ref": None, PROVIDER_KEY: current}
    diff = host.Diff(proto.DiffRequest(id="id", olds=_struct(state), news=_struct(inputs)), _Context())
    assert diff.changes == proto.DiffResponse.DIFF_NONE


@pytest.mark.parametrize("module,name", sorted(STATE_REFERENCES))
def test_every_reference_a_stack_holds_still_loads(module, name) -> None:
    """The bytes a stack's state holds for each reference it ever held load in the host."""
    live = getattr(sys.modules[module], name)
    assert (live.__module__, live.__qualname__) == (module, name)
    loaded = dill.loads(base64.b64decode(serialize_provider(live())))
    assert type(loaded) is live


def test_every_dynamic_provider_of_the_program_is_a_listed_reference() -> None:
    """Each ResourceProvider class in components/ is pickled into a state by reference to its module:
    each must be in STATE_REFERENCES, or a move of it would go unchecked."""
    import importlib
    import inspect

    found = set()
    for path in sorted(Path(grpo_job.__file__).parent.glob("*.py")):
        module = importlib.import_module(f"components.{path.stem}")
        found |= {(cls.__module__, cls.__qualname__) for _, cls in inspect.getmembers(module, inspect.isclass)
                  if issubclass(cls, pulumi.dynamic.ResourceProvider) and cls.__module__ == module.__name__}
    assert found == set(STATE_REFERENCES)
    assert ("components.upgrade_exclusion", "UpgradeExclusionStartProvider") in found


def test_the_exclusion_start_takes_a_moved_provider_reference_as_an_update() -> None:
    from components.upgrade_exclusion import UpgradeExclusionStartProvider

    host, current = _host(), serialize_provider(UpgradeExclusionStartProvider())
    with _moved(UpgradeExclusionStartProvider) as stale:
        state = {"cluster": "gke", "location": "us-central1", "start": "2026-01-01T00:00:00Z", PROVIDER_KEY: stale}
    inputs = {"cluster": "gke", "location": "us-central1", "start": None, PROVIDER_KEY: current}
    diff = host.Diff(proto.DiffRequest(id="gke@s", olds=_struct(state), news=_struct(inputs)), _Context())
    assert diff.changes == proto.DiffResponse.DIFF_SOME and list(diff.replaces) == []
    updated = _props(host.Update(proto.UpdateRequest(id="gke@s", olds=_struct(state), news=_struct(inputs)),
                                 _Context()).properties)
    assert (updated["start"], updated[PROVIDER_KEY]) == ("2026-01-01T00:00:00Z", current)
