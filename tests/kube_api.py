"""A loopback stand-in for the Kubernetes API server (no API server can run here), as strict as the
real one where the run lifecycle depends on it:

- every write bumps the object's `metadata.resourceVersion`; a PUT, or a PATCH that carries a
  resourceVersion, with a stale one gets 409 Conflict (Kubernetes API concepts, "Resource versions"
  and "Concurrency control and consistency": optimistic concurrency on metadata.resourceVersion);
- POST of an object that exists gets 409 AlreadyExists; GET, PUT, PATCH of a missing one 404;
- a strategic merge patch of a custom resource gets 415 Unsupported Media Type (Kubernetes docs,
  "Update API Objects in Place Using kubectl patch": strategic merge patch is not supported for
  custom resources; apiextensions-apiserver serves only json-patch, merge-patch and apply-patch);
- a JSON merge patch (RFC 7386) replaces lists whole; server-side apply (`apply-patch+yaml`, sent as
  JSON) of `spec.workerGroupSpecs`, which the KubeRay 1.6.2 CRD leaves without
  `x-kubernetes-list-type` and so atomic, makes the applier the owner of the whole list: another
  manager's apply of it without `force=true` gets 409 Conflict (Kubernetes docs, "Server-Side Apply",
  "Conflicts" and "Merge strategy": atomic lists are replaced and owned as one field).
"""

from __future__ import annotations

import copy
import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CUSTOM_PREFIX = "/apis/ray.io/"
ATOMIC = ("spec", "workerGroupSpecs")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null deletes, anything else (lists too) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class KubeApiStandIn:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.owners: dict[str, str] = {}
        """Path of an object -> field manager owning its atomic worker group list."""
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []
        self.version = 0
        self.lock = threading.Lock()

    def put_object(self, path: str, obj: dict[str, Any]) -> None:
        with self.lock:
            self.version += 1
            obj = copy.deepcopy(obj)
            obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)
            self.objects[path] = obj

    def get(self, path: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get(path))

    def handle(self, method: str, raw_path: str, headers: dict[str, str], body: Any) -> tuple[int, Any]:
        url = urllib.parse.urlsplit(raw_path)
        query = urllib.parse.parse_qs(url.query)
        path = url.path
        self.requests.append((method, raw_path, headers, body))
        with self.lock:
            current = self.objects.get(path)
            if method == "GET":
                return (200, current) if current is not None else _status(404, "NotFound")
            if method == "POST":
                name = body["metadata"]["name"]
                target = f"{path}/{name}"
                if target in self.objects:
                    return _status(409, "AlreadyExists")
                return 201, self._store(target, body)
            if current is None:
                return _status(404, "NotFound")
            sent_version = (body.get("metadata") or {}).get("resourceVersion") if isinstance(body, dict) else None
            if sent_version is not None and sent_version != current["metadata"]["resourceVersion"]:
                return _status(409, "Conflict")
            if method == "PUT":
                return 200, self._store(path, body)
            if method == "PATCH":
                kind = headers.get("Content-Type", "")
                if path.startswith(CUSTOM_PREFIX) and kind == "application/strategic-merge-patch+json":
                    return _status(415, "UnsupportedMediaType")
                manager = (query.get("fieldManager") or [""])[0]
                if kind == "application/apply-patch+yaml":
                    owner = self.owners.get(path)
                    force = (query.get("force") or ["false"])[0] == "true"
                    if owner and owner != manager and _touches_atomic(body) and not force:
                        return _status(409, "Conflict")
                elif kind != "application/merge-patch+json":
                    return _status(415, "UnsupportedMediaType")
                if _touches_atomic(body):
                    self.owners[path] = manager
                return 200, self._store(path, merge_patch(current, body))
        return _status(405, "MethodNotAllowed")

    def _store(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj = copy.deepcopy(obj)
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        self.objects[path] = obj
        return copy.deepcopy(obj)


def _touches_atomic(body: Any) -> bool:
    return isinstance(body, dict) and ATOMIC[1] in (body.get(ATOMIC[0]) or {})


def _status(code: int, reason: str) -> tuple[int, dict[str, Any]]:
    return code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code}


@contextmanager
def kube_api() -> Iterator[tuple[str, KubeApiStandIn]]:
    """The stand-in on a free loopback port: (its URL, its state)."""
    state = KubeApiStandIn()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            code, reply = state.handle(self.command, self.path, dict(self.headers), body)
            data = json.dumps(reply).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = _answer

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", state
    finally:
        server.shutdown()
        server.server_close()
