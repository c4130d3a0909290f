"""One program run under the synth's mock engine, looked up by logical name and type; shared by the
component tests so each checks what the engine would get without its own recording monitor."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pulumi
from google.protobuf import json_format

from verl_gke import synth

MANIFEST_KEYS = ("apiVersion", "kind", "metadata", "spec")


@dataclass(frozen=True)
class SentRequest:
    """What a register request carries that `synth.Registration` masks or leaves out."""

    raw_inputs: dict[str, Any]
    """The inputs as sent: secret values still inside their secret wrappers, nothing masked."""
    timeouts: tuple[str, str]
    """customTimeouts (create, update); "" where not set."""
    delete_before_replace: bool | None
    """None where the program leaves it to the provider's diff."""
    replace_on_changes: list[str]
    retain_on_delete: bool
    ignore_changes: list[str]
    aliases: list[dict[str, Any]]
    """Each alias spec as sent (name, type, parentUrn, ...; Pulumi's Alias.Spec)."""
    protect: bool | None
    deleted_with: str | None
    replace_with: list[str]
    """URNs of the resources whose replacement replaces this one."""


class OptionsMonitor(synth.RecordingMonitor):
    """The synth's recording monitor, plus each register request's `SentRequest` by logical name."""

    def __init__(self, mocks_: pulumi.runtime.Mocks) -> None:
        super().__init__(mocks_)
        self.sent: dict[str, SentRequest] = {}

    def RegisterResource(self, request: Any) -> Any:
        response = super().RegisterResource(request)
        self.sent[request.name] = SentRequest(
            raw_inputs=json_format.MessageToDict(request.object),
            timeouts=(request.customTimeouts.create, request.customTimeouts.update),
            delete_before_replace=request.deleteBeforeReplace if request.deleteBeforeReplaceDefined else None,
            replace_on_changes=list(request.replaceOnChanges),
            retain_on_delete=request.retainOnDelete,
            ignore_changes=list(request.ignoreChanges),
            aliases=[json_format.MessageToDict(a.spec) for a in request.aliases],
            protect=request.protect if request.HasField("protect") else None,
            deleted_with=request.deletedWith or None,
            replace_with=sorted(request.replace_with),
        )
        return response


class MockRun:
    """What one program registered (provider URN, parent, dependencies, masked inputs: see
    `synth.Registration`) and its resolved stack outputs."""

    def __init__(self, program: Callable[[], object]) -> None:
        self.monitor = OptionsMonitor(synth.SynthMocks())
        self.registrations, self.outputs = synth.run_in_mocks(program, monitor=self.monitor)
        self.by_name = {r.name: r for r in self.registrations}

    def inputs(self, name: str) -> dict[str, Any]:
        return self.by_name[name].inputs

    def urn(self, name: str) -> str:
        return self.by_name[name].urn

    def deps(self, name: str) -> list[str]:
        return self.by_name[name].dependencies

    def sent(self, name: str) -> SentRequest:
        return self.monitor.sent[name]

    def of_type(self, type_: str) -> list[synth.Registration]:
        return [r for r in self.registrations if r.type == type_]

    def one(self, type_: str) -> synth.Registration:
        (found,) = self.of_type(type_)
        return found

    def counts(self) -> Counter[str]:
        return Counter(r.type for r in self.registrations)

    @staticmethod
    def manifest(registration: synth.Registration) -> dict[str, Any]:
        """The Kubernetes object as sent; a KeyError if any of its four top-level keys is missing."""
        return {k: registration.inputs[k] for k in MANIFEST_KEYS}
