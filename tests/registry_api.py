"""A loopback stand-in for a container registry and its token service (no registry is reachable here),
behaving as the specifications say where access.registry depends on it (read 2026-12-04); each
behaviour and its source are listed below."""

# - `HEAD /v2/<name>/manifests/<tag>` answers `200 OK` with `Docker-Content-Digest` and
#   `Content-Length`, and `404 Not Found` for a tag the repository lacks (OCI Distribution Spec,
#   https://github.com/opencontainers/distribution-spec/blob/main/spec.md, "Checking if content exists
#   in the registry"), with a JSON `errors` body of code MANIFEST_UNKNOWN ("Error Codes");
# - a manifest is served only to a client whose `Accept` names its type: an OCI index or manifest
#   otherwise gets 404 MANIFEST_UNKNOWN ("OCI index found, but accept header does not support OCI
#   indexes"), and a Docker manifest list asked by tag is rewritten into its default platform's
#   manifest (distribution/distribution, registry/handlers/manifests.go);
# - a request without a valid token gets `401` with `WWW-Authenticate: Bearer realm=...,service=...,
#   scope="repository:<name>:pull"`; `GET /token?service=..&scope=..` gives anyone a token, whose
#   access is the requested scope's intersection with what anonymous users may do: pull on a public
#   repository, nothing on a private one, which the registry then answers with 401 again
#   (https://distribution.github.io/distribution/spec/auth/token/, "Requesting a Token": a smaller
#   grant "must not be considered an error" by the token server).

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
SERVICE = "registry.stand-in"


@dataclass
class Manifest:
    media_type: str
    digest: str
    platform_digest: str = ""
    """A Docker list's default platform manifest, what a client that takes no lists gets."""


@dataclass
class RegistryStandIn:
    manifests: dict[tuple[str, str], Manifest] = field(default_factory=dict)
    """(repository, tag) -> what the tag points at now."""
    private: set[str] = field(default_factory=set)
    token_field: str = "token"
    """`token`, or OAuth 2.0's `access_token` (the token spec accepts either)."""
    delay_s: float = 0.0
    """How long a manifest HEAD waits before it answers."""
    digest_header: str | None = None
    """Sent instead of the real digest when set (a registry that answers a malformed one)."""
    challenge: str | None = None
    """Sent instead of the Bearer challenge when set (a registry asking for something else)."""
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    url: str = ""
    _tokens: dict[str, set[str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, method: str, raw_path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        with self._lock:
            self.requests.append((method, raw_path, headers))
        url = urllib.parse.urlsplit(raw_path)
        if method == "GET" and url.path == "/token":
            return self._token(urllib.parse.parse_qs(url.query))
        parts = url.path.split("/manifests/")
        if method != "HEAD" or len(parts) != 2 or not parts[0].startswith("/v2/"):
            return 404, {}, b""
        repository, tag = parts[0].removeprefix("/v2/"), parts[1]
        token = headers.get("Authorization", "").removeprefix("Bearer ")
        if repository not in self._tokens.get(token, set()):
            challenge = self.challenge if self.challenge is not None else (
                f'Bearer realm="{self.url}/token",service="{SERVICE}",scope="repository:{repository}:pull"')
            return 401, {"WWW-Authenticate": challenge}, _errors("UNAUTHORIZED", "authentication required")
        time.sleep(self.delay_s)
        manifest = self.manifests.get((repository, tag))
        if manifest is None:
            return 404, {}, _errors("MANIFEST_UNKNOWN", "manifest unknown")
        accepted = {t.split(";")[0].strip() for t in headers.get("Accept", "").split(",")}
        media_type, digest = manifest.media_type, manifest.digest
        if media_type in (OCI_INDEX, OCI_MANIFEST) and media_type not in accepted:
            what, plural = ("index", "indexes") if media_type == OCI_INDEX else ("manifest", "manifests")
            return 404, {}, _errors("MANIFEST_UNKNOWN", f"OCI {what} found, but accept header does not support "
                                    f"OCI {plural}")
        if media_type == DOCKER_LIST and DOCKER_LIST not in accepted:
            media_type, digest = DOCKER_MANIFEST, manifest.platform_digest
        sent = self.digest_header if self.digest_header is not None else digest
        return 200, {"Content-Type": media_type, "Docker-Content-Digest": sent, "Content-Length": "1234"}, b""

    def _token(self, query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        if query.get("service") != [SERVICE]:
            return 400, {}, _errors("DENIED", "unknown service")
        granted = set()
        for scope in query.get("scope", []):
            kind, _, rest = scope.partition(":")
            repository, _, actions = rest.rpartition(":")
            if kind == "repository" and "pull" in actions.split(",") and repository not in self.private:
                granted.add(repository)
        with self._lock:
            token = f"anonymous-{len(self._tokens)}"
            self._tokens[token] = granted
        body = json.dumps({self.token_field: token, "expires_in": 300}).encode()
        return 200, {"Content-Type": "application/json"}, body

    def manifest_heads(self) -> list[tuple[str, dict[str, str]]]:
        return [(path, headers) for method, path, headers in self.requests if method == "HEAD"]


def _errors(code: str, message: str) -> bytes:
    return json.dumps({"errors": [{"code": code, "message": message}]}).encode()


@contextmanager
def serve(stand_in: RegistryStandIn) -> Iterator[RegistryStandIn]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            status, headers, body = stand_in.handle(self.command, self.path, dict(self.headers))
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            if "Content-Length" not in headers:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_HEAD = _answer

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    stand_in.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield stand_in
    finally:
        server.shutdown()
        server.server_close()
