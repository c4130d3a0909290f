"""Resolve a tagged image (`name:tag`) to the digest its registry serves for the tag now, anonymously.

`HEAD /v2/<name>/manifests/<tag>` with all four manifest types in `Accept`, so a multi-arch image is
pinned by its index, the digest `docker pull` resolves (OCI Distribution Spec, "Checking if content
exists in the registry", "Pulling manifests"); a `401` with `WWW-Authenticate: Bearer` is answered with
an anonymous token from its realm (distribution's token authentication spec, RFC 6750), then retried.
Docker Hub's names: `verlai/verl` is `registry-1.docker.io`, `ubuntu` is `library/ubuntu`; a first path
part with a dot or colon is its own host. Runs on the deployer's machine (the PinnedImage provider).
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from email.message import Message

from domain.image_mirror import docker_hub_path, is_docker_hub

DOCKER_HUB_REGISTRY = "registry-1.docker.io"
MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
"""Multi-arch index and list first: the registry then answers the digest of what `docker pull` pins."""
DEFAULT_TIMEOUT_S = 30.0
"""The whole resolution's deadline (challenge, token, HEAD), not each request's."""
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
"""OCI image-spec descriptor.md, "SHA-256": the encoded part MUST match [a-f0-9]{64}, never [A-F]."""
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


class RegistryError(Exception):
    """One line: the image and what failed."""


@dataclass(frozen=True)
class ImageName:
    registry: str
    """Host (and port) of the registry API."""
    repository: str
    tag: str


def parse(image: str) -> ImageName:
    """`name:tag` -> its registry, repository and tag; RegistryError for anything else."""
    if "@" in image:
        raise RegistryError(f"{image}: already pinned by digest; only a tag is resolved")
    name, _, tag = image.rpartition(":")
    if not name or not tag or "/" in tag:
        raise RegistryError(f"{image}: no tag to resolve (name:tag)")
    if is_docker_hub(name):
        return ImageName(DOCKER_HUB_REGISTRY, docker_hub_path(name), tag)
    host, _, repository = name.partition("/")
    return ImageName(host, repository, tag)


def resolve_digest(image: str, timeout_s: float = DEFAULT_TIMEOUT_S, base_url: str | None = None) -> str:
    """The `sha256:` digest the registry serves for `image`'s tag. `base_url` replaces
    `https://<registry>` (a loopback stand-in); RegistryError names the image and what failed."""
    ref = parse(image)
    deadline = time.monotonic() + timeout_s
    url = f"{base_url or f'https://{ref.registry}'}/v2/{ref.repository}/manifests/{ref.tag}"
    headers = {"Accept": ", ".join(MANIFEST_TYPES)}
    status, answer, _ = _fetch(image, "HEAD", url, headers, deadline, timeout_s)
    if status == 401:
        token = _anonymous_token(image, ref, answer.get("WWW-Authenticate") or "", deadline, timeout_s)
        status, answer, _ = _fetch(image, "HEAD", url, {**headers, "Authorization": f"Bearer {token}"},
                                   deadline, timeout_s)
        if status in (401, 403):
            # Docker Hub answers so for a repository that does not exist too (it does not say which).
            raise RegistryError(f"{image}: {ref.registry} refused an anonymous token for {ref.repository} "
                                f"(HTTP {status}): the repository is not public, or does not exist")
    if status == 404:
        raise RegistryError(f"{image}: tag {ref.tag} not found in {ref.registry}/{ref.repository} (HTTP 404)")
    if status != 200:
        raise RegistryError(f"{image}: HEAD {url} answered HTTP {status}")
    digest = answer.get("Docker-Content-Digest") or ""
    if not DIGEST.match(digest):
        raise RegistryError(f"{image}: {ref.registry} answered no sha256 digest "
                            f"(Docker-Content-Digest: {digest!r})")
    return digest


def _anonymous_token(image: str, ref: ImageName, challenge: str, deadline: float, timeout_s: float) -> str:
    scheme, _, params = challenge.partition(" ")
    fields = dict(_CHALLENGE_PARAM.findall(params))
    # No credential goes to the realm, so an http one (a loopback registry) leaks nothing.
    if scheme.lower() != "bearer" or not fields.get("realm", "").startswith(("https://", "http://")):
        raise RegistryError(f"{image}: {ref.registry} answered 401 without a Bearer challenge "
                            f"(WWW-Authenticate: {challenge!r})")
    query = {"service": fields.get("service", ref.registry),
             "scope": fields.get("scope", f"repository:{ref.repository}:pull")}
    realm = fields["realm"]
    url = f"{realm}{'&' if '?' in realm else '?'}{urllib.parse.urlencode(query)}"
    status, _headers, body = _fetch(image, "GET", url, {}, deadline, timeout_s)
    if status != 200:
        raise RegistryError(f"{image}: the token service {realm} answered HTTP {status}")
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    token = (answer.get("token") or answer.get("access_token")) if isinstance(answer, dict) else None
    if not isinstance(token, str) or not token:
        raise RegistryError(f"{image}: the token service {realm} answered no token (JSON token or access_token)")
    return token


def _fetch(image: str, method: str, url: str, headers: dict[str, str], deadline: float,
           timeout_s: float) -> tuple[int, Message, bytes]:
    """Status, headers (looked up case-insensitively) and body of one request, within what is
    left of the deadline."""
    left = deadline - time.monotonic()
    host = urllib.parse.urlsplit(url).netloc
    late = RegistryError(f"{image}: no answer from {host} within {timeout_s:g} s")
    if left <= 0:
        raise late
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=left) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers, error.read()
    except TimeoutError:
        raise late from None
    except urllib.error.URLError as error:
        if isinstance(error.reason, TimeoutError):
            raise late from None
        raise RegistryError(f"{image}: {method} {url} failed: {error.reason}") from None
    except OSError as error:
        raise RegistryError(f"{image}: {method} {url} failed: {error}") from None
