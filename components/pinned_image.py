"""PinnedImage: a tagged image pinned by digest at the first `pulumi up`, kept in the stack's state.

`create` asks the registry once (access.registry); `read` returns the stored digest, and `diff`
replaces only when the tagged image changes, so the nodes run the same bytes until the user changes
the tag. Dynamic-provider rules as in components/grpo_job.py: pickled by reference, no state.
"""

from __future__ import annotations

from typing import Any, TypedDict

import pulumi
import pulumi.dynamic

from components import provider_reference
from domain.platforms import repository_pin
from access.registry import RegistryError, parse, resolve_digest


class PinnedImageArgs(TypedDict):
    image: str
    """`name:tag` as the registry knows it (a Docker Hub name, not a mirror's)."""


def outs(image: str, digest: str) -> dict[str, Any]:
    """The resource's outputs: the tagged image, its digest, and `name:tag@digest` to pull (the
    runtime pulls by the digest; the tag stays for the reader)."""
    return {"image": image, "digest": digest, "ref": f"{image}@{digest}"}


class PinnedImageProvider(pulumi.dynamic.ResourceProvider):
    """Resolves the tag in `create` only."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.CheckResult:
        image = news.get("image")
        if not isinstance(image, str):
            reason = f"image = {image!r}: must be a tagged image reference, name:tag"
            return pulumi.dynamic.CheckResult(news, [pulumi.dynamic.CheckFailure("image", reason)])
        try:
            parse(image)
        except RegistryError as error:
            return pulumi.dynamic.CheckResult(news, [pulumi.dynamic.CheckFailure("image", str(error))])
        return pulumi.dynamic.CheckResult(news, [])

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.DiffResult:
        changed = olds.get("image") != news.get("image")
        return pulumi.dynamic.DiffResult(changes=changed or provider_reference.moved(olds, news),
                                         replaces=["image"] if changed else [])

    def update(self, _id: str, olds: dict[str, Any], _news: dict[str, Any]) -> pulumi.dynamic.UpdateResult:
        # Only the provider's reference changed (diff replaces on the image): the pin stays.
        return pulumi.dynamic.UpdateResult(outs(olds["image"], olds["digest"]))

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        image = props["image"]
        pinned = outs(image, resolve_digest(image))
        return pulumi.dynamic.CreateResult(pinned["ref"], pinned)

    def read(self, id_: str, props: dict[str, Any]) -> pulumi.dynamic.ReadResult:
        # A refresh keeps the pin: asking the registry again would follow a moved tag.
        return pulumi.dynamic.ReadResult(id_, props)


class PinnedImage(pulumi.dynamic.Resource, name="PinnedImage"):
    """`image` (name:tag) and the digest its registry served at the first `pulumi up`."""

    digest: pulumi.Output[str]
    ref: pulumi.Output[str]
    """`name:tag@sha256:...`, what the pods pull."""

    def __init__(self, name: str, args: PinnedImageArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(PinnedImageProvider(), name, {**args, "digest": None, "ref": None}, opts)


def pinned_ref(resource_name: str, image: str, opts: pulumi.ResourceOptions) -> pulumi.Input[str]:
    """`image` (name:tag, or already name@digest) by digest: the repository's pin where
    domain.platforms.IMAGE_DIGESTS has one, else the stack config's (`verl-gke:imageDigests`, checked by
    domain/config.py before any resource), else a PinnedImage that asks its registry at the first
    `pulumi up` and keeps the answer in the stack's state."""
    stack_digests = pulumi.Config("verl-gke").get_object("imageDigests") or {}
    return repository_pin(image, stack_digests) or PinnedImage(resource_name, {"image": image}, opts).ref
