"""A loopback stand-in for the Kubernetes API server (no API server can run here), as strict as the
real one where the run lifecycle depends on it:

- every write bumps the object's `metadata.resourceVersion`; a PUT, or a PATCH that carries a
  resourceVersion, with a stale one gets 409 Conflict (Kubernetes API concepts, "Resource versions"
  and "Concurrency control and consistency": optimistic concurrency on metadata.resourceVersion);
- POST of an object that exists gets 409 AlreadyExists; GET, PUT, PATCH of a missing one 404;
- a strategic merge patch of a custom resource gets 415 Unsupported Media Type (Kubernetes docs,
  "Update API Objects in Place Using kubectl patch": strategic merge patch is not supported for
  custom resources; apiextensions-apiserver serves only json-patch, merge-patch and apply-patch);
- a JSON merge patch (RFC 7386) replaces lists whole, and its writer becomes the owner of every
  field it changes (Kubernetes docs, "Server-Side Apply", "Field management": an update that is not
  an apply takes the fields it changes from their owners);
- server-side apply (`apply-patch+yaml`, sent as JSON) owns what it sends. Another manager's apply of
  a field with a different value gets 409 Conflict unless `force=true`, which takes the field over;
  a field the applier owned and no longer sends is removed; a field it never sends stays as its owner
  left it ("Conflicts", "Merge strategy"). Ownership is kept per field of `spec`, the granularity
  this lifecycle writes at: `spec.workerGroupSpecs`, which the KubeRay 1.6.2 CRD leaves without
  `x-kubernetes-list-type`, is atomic (one field, owned whole), and `spec.suspend` is a scalar.
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
        self.owners: dict[str, dict[str, str]] = {}
        """Path of an object -> its `spec` fields -> the field manager owning each."""
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
                owners = self.owners.setdefault(path, {})
                sent = (body.get("spec") or {}) if isinstance(body, dict) else {}
                spec = current.get("spec") or {}
                if kind == "application/apply-patch+yaml":
                    force = (query.get("force") or ["false"])[0] == "true"
                    taken = [f for f, v in sent.items() if owners.get(f, manager) != manager and spec.get(f) != v]
                    if taken and not force:
                        return _status(409, "Conflict")
                    dropped = [f for f, owner in owners.items() if owner == manager and f not in sent]
                    merged = merge_patch(current, body)
                    for f in dropped:
                        merged.get("spec", {}).pop(f, None)
                        del owners[f]
                    owners.update(dict.fromkeys(sent, manager))
                    return 200, self._store(path, merged)
                if kind != "application/merge-patch+json":
                    return _status(415, "UnsupportedMediaType")
                owners.update({f: manager for f, v in sent.items() if spec.get(f) != v})
                return 200, self._store(path, merge_patch(current, body))
        return _status(405, "MethodNotAllowed")

    def _store(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj = copy.deepcopy(obj)
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        self.objects[path] = obj
        return copy.deepcopy(obj)


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
