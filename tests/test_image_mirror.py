"""Images through the stack's Artifact Registry remote repository of Docker Hub (GKE image streaming)."""

from __future__ import annotations

from typing import Any

import pytest

from domain.image_mirror import MIRROR_APIS, is_docker_hub, mirrored
from domain.platforms import PLATFORMS
from tests.conftest import STACKS
from verl_gke import synth

PREFIX = "us-central1-docker.pkg.dev/my-project/verl-a4-docker-hub"
DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(("image", "expected"), [
    ("verlai/verl:vllm011.dev7", f"{PREFIX}/verlai/verl:vllm011.dev7"),
    (f"verlai/verl@{DIGEST}", f"{PREFIX}/verlai/verl@{DIGEST}"),
    (f"verlai/verl:vllm011.dev7@{DIGEST}", f"{PREFIX}/verlai/verl:vllm011.dev7@{DIGEST}"),
    ("docker.io/verlai/verl:vllm011.dev7", f"{PREFIX}/verlai/verl:vllm011.dev7"),
    ("index.docker.io/rayproject/ray:2.47.0", f"{PREFIX}/rayproject/ray:2.47.0"),
    ("ubuntu:24.04", f"{PREFIX}/library/ubuntu:24.04"),  # official images live under library/ upstream
    ("nvcr.io/nvidia/pytorch:25.01-py3", "nvcr.io/nvidia/pytorch:25.01-py3"),
    ("us-docker.pkg.dev/p/r/verl:1", "us-docker.pkg.dev/p/r/verl:1"),
    ("localhost:5000/verl:1", "localhost:5000/verl:1"),
    ("localhost/verl:1", "localhost/verl:1"),
])
def test_only_docker_hub_references_are_rewritten_tag_or_digest(image: str, expected: str) -> None:
    assert mirrored(image, PREFIX) == expected
    assert is_docker_hub(image) == (expected != image)


def _by_type(result: synth.SynthResult, kind: str) -> list[Any]:
    return [r for r in result.registrations if r.type == kind]


def _images(result: synth.SynthResult) -> set[str]:
    (ray,) = _by_type(result, "kubernetes:ray.io/v1:RayCluster")
    spec = ray.inputs["spec"]
    pods = [spec["headGroupSpec"]["template"], *(g["template"] for g in spec["workerGroupSpecs"])]
    return {c["image"] for pod in pods for c in pod["spec"]["containers"]}


@pytest.mark.parametrize("stack", STACKS)
def test_each_stack_pulls_the_verl_image_through_its_remote_repository(stack: str, synth_stack: Any) -> None:
    result = synth_stack(stack)
    (repo,) = _by_type(result, "gcp:artifactregistry/repository:Repository")
    inputs = repo.inputs
    assert (inputs["format"], inputs["mode"]) == ("DOCKER", "REMOTE_REPOSITORY")
    assert inputs["remoteRepositoryConfig"]["dockerRepository"] == {"publicRepository": "DOCKER_HUB"}
    region, project, repo_id = inputs["location"], inputs["project"], inputs["repositoryId"]
    (reader,) = _by_type(result, "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember")
    (account,) = _by_type(result, "gcp:serviceaccount/account:Account")
    assert (reader.inputs["role"], reader.inputs["repository"], reader.inputs["location"]) == (
        "roles/artifactregistry.reader", repo_id, region)
    assert reader.inputs["member"] == f"serviceAccount:{account.inputs['accountId']}@{project}.iam.gserviceaccount.com"
    image = PLATFORMS["a3u" if stack.startswith("a3u") else "a4x" if stack == "a4x" else "a4"].image
    # The platform's tag is pinned by the digest Docker Hub serves at the first `pulumi up`
    # (components.pinned_image, asked with the upstream name); synth marks where that digest goes.
    (pin,) = [r for r in _by_type(result, synth.PINNED_IMAGE_TYPE) if r.name == "ray-image"]
    assert pin.inputs["image"] == image
    assert _images(result) == {f"{region}-docker.pkg.dev/{project}/{repo_id}/{image}@{synth.UNRESOLVED_DIGEST}"}
    (ray,) = _by_type(result, "kubernetes:ray.io/v1:RayCluster")
    assert {repo.urn, reader.urn} <= set(ray.dependencies)
    services = {r.inputs["service"] for r in _by_type(result, "gcp:projects/service:Service")}
    assert set(MIRROR_APIS) <= services


def test_the_mirror_can_be_turned_off_and_a_digest_is_kept() -> None:
    off = synth.run("a4-standard", overrides={"verl-gke:imageMirror": "false"})
    assert not _by_type(off, "gcp:artifactregistry/repository:Repository")
    assert _images(off) == {f"{PLATFORMS['a4'].image}@{synth.UNRESOLVED_DIGEST}"}  # pinned at the first up
    assert not set(MIRROR_APIS) & {r.inputs["service"] for r in _by_type(off, "gcp:projects/service:Service")}
    pinned = synth.run("a4-standard", overrides={"verl-gke:verlImage": f"verlai/verl@{DIGEST}"})
    assert _images(pinned) == {f"us-central1-docker.pkg.dev/replace-me-project/verl-a4-docker-hub/verlai/verl@{DIGEST}"}
    # A digest is used as it is: only the NCCL installer's image is resolved.
    assert [r.name for r in _by_type(pinned, synth.PINNED_IMAGE_TYPE)] == ["network-nccl-installer-image"]
