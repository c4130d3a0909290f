"""The PinnedImage dynamic provider, driven directly (as the engine calls it) against the loopback
registry stand-in: the digest is asked for in `create` only and kept until the tag changes."""

from __future__ import annotations

import base64
import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulumi
import pulumi.dynamic
import pytest
from pulumi.dynamic.dynamic import serialize_provider

from components import pinned_image
from components.pinned_image import PinnedImage, PinnedImageProvider
from tests.mock_run import MockRun
from tests.registry_api import OCI_INDEX, Manifest, RegistryStandIn, serve
from access import registry
from verl_gke import synth
from access.registry import RegistryError

IMAGE = "verlai/verl:vllm011.dev7"
FIRST = "sha256:" + "a1" * 32
MOVED = "sha256:" + "b2" * 32
DEV8 = "sha256:" + "c3" * 32


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[RegistryStandIn]:
    """The stand-in in Docker Hub's place: the provider's real client, only its base URL changed."""
    stand_in = RegistryStandIn(manifests={("verlai/verl", "vllm011.dev7"): Manifest(OCI_INDEX, FIRST),
                                          ("verlai/verl", "vllm011.dev8"): Manifest(OCI_INDEX, DEV8)})
    with serve(stand_in):
        monkeypatch.setattr(pinned_image, "resolve_digest",
                            functools.partial(registry.resolve_digest, base_url=stand_in.url))
        yield stand_in


def test_create_pins_the_tag_by_the_digest_the_registry_serves(hub: RegistryStandIn) -> None:
    created = PinnedImageProvider().create({"image": IMAGE})
    assert created.id == f"{IMAGE}@{FIRST}"
    assert created.outs == {"image": IMAGE, "digest": FIRST, "ref": f"{IMAGE}@{FIRST}"}


def test_create_fails_with_the_registrys_answer(hub: RegistryStandIn) -> None:
    with pytest.raises(RegistryError) as error:
        PinnedImageProvider().create({"image": "verlai/verl:gone"})
    assert str(error.value) == "verlai/verl:gone: tag gone not found in registry-1.docker.io/verlai/verl (HTTP 404)"


def test_read_keeps_the_stored_digest_after_the_tag_moved(hub: RegistryStandIn) -> None:
    provider = PinnedImageProvider()
    created = provider.create({"image": IMAGE})
    hub.manifests[("verlai/verl", "vllm011.dev7")] = Manifest(OCI_INDEX, MOVED)  # the tag is pushed again
    asked = len(hub.requests)
    read = provider.read(created.id, dict(created.outs))
    assert (read.id, read.outs) == (f"{IMAGE}@{FIRST}", created.outs)
    assert len(hub.requests) == asked  # a refresh does not ask the registry


def test_diff_replaces_only_when_the_tag_changes() -> None:
    olds = {"image": IMAGE, "digest": FIRST, "ref": f"{IMAGE}@{FIRST}"}
    same = PinnedImageProvider().diff(olds["ref"], olds, {"image": IMAGE})
    assert (same.changes, same.replaces) == (False, [])
    changed = PinnedImageProvider().diff(olds["ref"], olds, {"image": "verlai/verl:vllm011.dev8"})
    assert (changed.changes, changed.replaces) == (True, ["image"])


def test_a_new_tag_is_resolved_anew_by_the_replacement(hub: RegistryStandIn) -> None:
    assert PinnedImageProvider().create({"image": "verlai/verl:vllm011.dev8"}).outs["digest"] == DEV8


@pytest.mark.parametrize(("news", "reason"), [
    ({"image": f"verlai/verl@{FIRST}"}, f"verlai/verl@{FIRST}: already pinned by digest; only a tag is resolved"),
    ({"image": "verlai/verl"}, "verlai/verl: no tag to resolve (name:tag)"),
    ({}, "image = None: must be a tagged image reference, name:tag"),
])
def test_check_refuses_what_is_not_a_tag(news: dict[str, Any], reason: str) -> None:
    checked = PinnedImageProvider().check({}, news)
    assert [(f.property, f.reason) for f in checked.failures] == [("image", reason)]
    assert PinnedImageProvider().check({}, {"image": IMAGE}).failures == []


def test_the_provider_is_pickled_by_reference() -> None:
    """Stacks' state names `components.pinned_image.PinnedImageProvider`; the host imports it."""
    raw = base64.b64decode(serialize_provider(PinnedImageProvider()))
    assert b"components.pinned_image" in raw and b"PinnedImageProvider" in raw
    assert b"def create" not in raw and len(raw) < 200


def test_the_resource_sends_the_tag_and_gets_synths_marked_placeholder() -> None:
    def program() -> None:
        pin = PinnedImage("verl-image", {"image": IMAGE})
        pulumi.export("ref", pin.ref)
        pulumi.export("digest", pin.digest)

    run = MockRun(program)
    (registered,) = run.of_type(synth.PINNED_IMAGE_TYPE)
    assert {k: v for k, v in registered.inputs.items() if k != "__provider"} == {"image": IMAGE}
    # No registry offline: synth does not make a digest up, it marks where it goes.
    assert run.outputs == {"ref": f"{IMAGE}@{synth.UNRESOLVED_DIGEST}", "digest": synth.UNRESOLVED_DIGEST}


# What pulumi/dynamic/__main__.py's get_provider does with props["__provider"], then the calls a
# `pulumi up` that keeps the tag makes (see tests/test_grpo_job_host.py).
_HOST = """
import base64, json, sys
import dill
request = json.load(sys.stdin)
assert not any(p in ("", ".") or p.startswith(request["repo"] + "/tests") for p in sys.path), sys.path
provider = dill.loads(base64.b64decode(request["provider"]))
diff = provider.diff("id", request["olds"], {"image": request["olds"]["image"]})
read = provider.read("id", request["olds"])
print(json.dumps({"module": type(provider).__module__, "changes": diff.changes, "read": read.outs}))
"""


def test_the_provider_loads_and_answers_in_the_provider_hosts_interpreter(tmp_path: Path) -> None:
    olds = pinned_image.outs(IMAGE, FIRST)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "PULUMI_PROJECT": synth.PROJECT}
    answer = subprocess.run(
        [sys.executable, "-I", "-c", _HOST], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        input=json.dumps({"provider": serialize_provider(PinnedImageProvider()), "olds": olds,
                          "repo": str(Path(__file__).resolve().parent.parent)}))
    assert answer.returncode == 0, answer.stderr
    assert json.loads(answer.stdout) == {"module": "components.pinned_image", "changes": False, "read": olds}
