"""access.registry against a loopback registry and token service that answer as the OCI Distribution
Spec and Docker's token authentication say (tests/registry_api.py cites each behaviour)."""

from __future__ import annotations

import socket
import time
import urllib.parse
from collections.abc import Iterator

import pytest

from domain.platforms import PLATFORMS
from tests.registry_api import DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, SERVICE, Manifest, RegistryStandIn, serve
from access import registry
from access.registry import ImageName, RegistryError, parse, resolve_digest

INDEX = "sha256:" + "1" * 64
LIST = "sha256:" + "2" * 64
AMD64 = "sha256:" + "3" * 64
UBUNTU = "sha256:" + "4" * 64
PRIVATE = "sha256:" + "5" * 64
IMAGE = "verlai/verl:vllm011.dev7"


@pytest.fixture
def hub() -> Iterator[RegistryStandIn]:
    stand_in = RegistryStandIn(manifests={
        ("verlai/verl", "vllm011.dev7"): Manifest(OCI_INDEX, INDEX),
        ("verlai/verl", "list"): Manifest(DOCKER_LIST, LIST, platform_digest=AMD64),
        ("library/ubuntu", "24.04"): Manifest(DOCKER_MANIFEST, UBUNTU),
        ("team/private", "1"): Manifest(DOCKER_MANIFEST, PRIVATE),
    }, private={"team/private"})
    with serve(stand_in):
        yield stand_in


@pytest.mark.parametrize(("image", "expected"), [
    (IMAGE, ImageName("registry-1.docker.io", "verlai/verl", "vllm011.dev7")),
    ("ubuntu:24.04", ImageName("registry-1.docker.io", "library/ubuntu", "24.04")),
    ("docker.io/verlai/verl:x", ImageName("registry-1.docker.io", "verlai/verl", "x")),
    ("us-docker.pkg.dev/p/r/verl:1", ImageName("us-docker.pkg.dev", "p/r/verl", "1")),
    ("localhost:5000/team/verl:1", ImageName("localhost:5000", "team/verl", "1")),
])
def test_names_map_to_their_registry_and_repository(image: str, expected: ImageName) -> None:
    assert parse(image) == expected


@pytest.mark.parametrize(("image", "message"), [
    ("verlai/verl", "verlai/verl: no tag to resolve (name:tag)"),
    ("localhost:5000/verl", "localhost:5000/verl: no tag to resolve (name:tag)"),
    (f"verlai/verl@{INDEX}", f"verlai/verl@{INDEX}: already pinned by digest; only a tag is resolved"),
])
def test_only_a_tag_is_resolved(image: str, message: str) -> None:
    with pytest.raises(RegistryError) as error:
        parse(image)
    assert str(error.value) == message


def test_a_public_image_is_resolved_with_an_anonymous_token(hub: RegistryStandIn) -> None:
    assert resolve_digest(IMAGE, base_url=hub.url) == INDEX
    calls = [(method, path, headers.get("Authorization")) for method, path, headers in hub.requests]
    scope = urllib.parse.quote("repository:verlai/verl:pull", safe="")
    assert calls == [
        ("HEAD", "/v2/verlai/verl/manifests/vllm011.dev7", None),  # 401 with the Bearer challenge
        ("GET", f"/token?service={SERVICE}&scope={scope}", None),  # anonymous: no credential sent
        ("HEAD", "/v2/verlai/verl/manifests/vllm011.dev7", "Bearer anonymous-0"),
    ]


def test_an_official_image_is_asked_for_under_library(hub: RegistryStandIn) -> None:
    assert resolve_digest("ubuntu:24.04", base_url=hub.url) == UBUNTU
    assert hub.manifest_heads()[-1][0] == "/v2/library/ubuntu/manifests/24.04"


def test_the_token_may_come_as_access_token(hub: RegistryStandIn) -> None:
    hub.token_field = "access_token"
    assert resolve_digest(IMAGE, base_url=hub.url) == INDEX


def test_every_manifest_type_is_accepted_so_a_multi_arch_image_pins_its_index(hub: RegistryStandIn) -> None:
    assert resolve_digest("verlai/verl:list", base_url=hub.url) == LIST  # the list, not one platform's manifest
    accept = [headers["Accept"] for _path, headers in hub.manifest_heads()]
    assert accept == [", ".join([OCI_INDEX, DOCKER_LIST, "application/vnd.oci.image.manifest.v1+json",
                                 DOCKER_MANIFEST])] * 2


def test_without_the_index_types_the_registry_answers_otherwise(hub: RegistryStandIn, monkeypatch) -> None:
    """Why all four types are sent: a registry rewrites a list to one platform's manifest and
    refuses an OCI index to a client that does not name it."""
    monkeypatch.setattr(registry, "MANIFEST_TYPES", (DOCKER_MANIFEST,))
    assert resolve_digest("verlai/verl:list", base_url=hub.url) == AMD64
    with pytest.raises(RegistryError) as error:
        resolve_digest(IMAGE, base_url=hub.url)
    assert str(error.value) == f"{IMAGE}: tag vllm011.dev7 not found in registry-1.docker.io/verlai/verl (HTTP 404)"


def test_an_unknown_tag_is_named(hub: RegistryStandIn) -> None:
    with pytest.raises(RegistryError) as error:
        resolve_digest("verlai/verl:vllm011.dev8", base_url=hub.url)
    assert str(error.value) == ("verlai/verl:vllm011.dev8: tag vllm011.dev8 not found in "
                                "registry-1.docker.io/verlai/verl (HTTP 404)")


def test_a_private_image_is_refused_after_the_anonymous_token(hub: RegistryStandIn) -> None:
    with pytest.raises(RegistryError) as error:
        resolve_digest("team/private:1", base_url=hub.url)
    assert str(error.value) == ("team/private:1: registry-1.docker.io refused an anonymous token for "
                                "team/private (HTTP 401): the repository is not public, or does not exist")
    assert len(hub.manifest_heads()) == 2  # asked once more with the token, not in a loop


def test_a_slow_registry_fails_at_the_deadline(hub: RegistryStandIn) -> None:
    hub.delay_s = 3.0
    started = time.monotonic()
    with pytest.raises(RegistryError) as error:
        resolve_digest(IMAGE, timeout_s=0.5, base_url=hub.url)
    assert str(error.value) == f"{IMAGE}: no answer from {hub.url.removeprefix('http://')} within 0.5 s"
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize(("header", "shown"), [
    ("sha256:" + "A" * 64, "'sha256:" + "A" * 64 + "'"),  # OCI image-spec: [A-F] MUST NOT be used
    ("sha512:" + "1" * 128, "'sha512:" + "1" * 128 + "'"),
    ("", "''"),
])
def test_only_a_sha256_digest_is_taken(hub: RegistryStandIn, header: str, shown: str) -> None:
    hub.digest_header = header
    with pytest.raises(RegistryError) as error:
        resolve_digest(IMAGE, base_url=hub.url)
    assert str(error.value) == f"{IMAGE}: registry-1.docker.io answered no sha256 digest (Docker-Content-Digest: {shown})"


def test_a_challenge_that_is_not_bearer_is_named(hub: RegistryStandIn) -> None:
    hub.challenge = 'Basic realm="registry"'
    with pytest.raises(RegistryError) as error:
        resolve_digest(IMAGE, base_url=hub.url)
    assert str(error.value) == (f"{IMAGE}: registry-1.docker.io answered 401 without a Bearer challenge "
                                "(WWW-Authenticate: 'Basic realm=\"registry\"')")


def test_a_token_service_that_refuses_is_named(hub: RegistryStandIn) -> None:
    hub.challenge = f'Bearer realm="{hub.url}/token",service="elsewhere",scope="repository:verlai/verl:pull"'
    with pytest.raises(RegistryError) as error:
        resolve_digest(IMAGE, base_url=hub.url)
    assert str(error.value) == f"{IMAGE}: the token service {hub.url}/token answered HTTP 400"


def test_an_unreachable_registry_is_named() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before the request: nothing listens
    with pytest.raises(RegistryError) as error:
        resolve_digest(IMAGE, base_url=f"http://127.0.0.1:{port}")
    assert str(error.value).startswith(
        f"{IMAGE}: HEAD http://127.0.0.1:{port}/v2/verlai/verl/manifests/vllm011.dev7 failed: ")


@pytest.mark.parametrize("platform", ["a4", "a4x"])
def test_the_nccl_installer_image_is_asked_for_under_its_artifact_registry_path(platform: str) -> None:
    image = PLATFORMS[platform].nccl_installer_image
    ref = parse(image)
    assert (ref.registry, ref.repository.split("/")[:2]) == ("us-docker.pkg.dev", ["gce-ai-infra", "gpudirect-gib"])
    with serve(RegistryStandIn(manifests={(ref.repository, ref.tag): Manifest(OCI_INDEX, INDEX)})) as stand_in:
        assert resolve_digest(image, base_url=stand_in.url) == INDEX
    assert stand_in.manifest_heads()[-1][0] == f"/v2/{ref.repository}/manifests/{ref.tag}"
