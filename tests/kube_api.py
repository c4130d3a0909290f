"""A loopback stand-in for the Kubernetes API server (no API server can run here), as strict as the
real one where the run lifecycle depends on it: resourceVersion conflicts, field ownership of merge
patch and server-side apply, ConfigMap size and immutability, delete preconditions, label selectors,
Leases, KubeRay 1.6.2's atomic suspend (`reconcile()`), and the pod port-forward WebSocket.
Each behaviour and its source are listed below."""

# - every write bumps the object's `metadata.resourceVersion`; a PUT, or a PATCH that carries a
#   resourceVersion, with a stale one gets 409 Conflict (Kubernetes API concepts, "Resource versions"
#   and "Concurrency control and consistency": optimistic concurrency on metadata.resourceVersion);
# - POST of an object that exists gets 409 AlreadyExists; GET, PUT, PATCH of a missing one 404, except a
#   server-side apply, which creates it ("Server-Side Apply": apply creates the object if it does not exist);
# - a strategic merge patch of a custom resource gets 415 Unsupported Media Type (Kubernetes docs,
#   "Update API Objects in Place Using kubectl patch": strategic merge patch is not supported for
#   custom resources; apiextensions-apiserver serves only json-patch, merge-patch and apply-patch);
# - a JSON merge patch (RFC 7386) replaces lists whole, and its writer becomes the owner of every
#   field it changes (Kubernetes docs, "Server-Side Apply", "Field management": an update that is not
#   an apply takes the fields it changes from their owners);
# - server-side apply (`apply-patch+yaml`, sent as JSON) owns what it sends. Another manager's apply of
#   a field with a different value gets 409 Conflict unless `force=true`, which takes the field over;
#   a field the applier owned and no longer sends is removed; a field it never sends stays as its owner
#   left it ("Conflicts", "Merge strategy"). Ownership is kept per field of `spec`, the granularity
#   this lifecycle writes at: `spec.workerGroupSpecs`, which the KubeRay 1.6.2 CRD leaves without
#   `x-kubernetes-list-type`, is atomic (one field, owned whole), and `spec.suspend` is a scalar;
# - a ConfigMap whose data and binaryData exceed 1 MiB is refused with 422 Invalid, and so is any
#   change of the data of an `immutable: true` ConfigMap, or unsetting `immutable` (kubernetes
#   pkg/apis/core/validation/validation.go at v1.34: `ValidateConfigMap`, totalSize >
#   core.MaxSecretSize (1 MiB); `ValidateConfigMapUpdate`, "field is immutable when `immutable` is set");
# - POST sets `metadata.uid` and `metadata.creationTimestamp` (whole seconds, never earlier than
#   the previous one);
# - DELETE honours DeleteOptions.preconditions (uid, resourceVersion): a mismatch is 409 Conflict
#   (apimachinery pkg/apis/meta/v1 `Preconditions`, checked by the generic registry store's Delete);
# - GET of a collection lists its objects as `<Kind>List`, filtered by an equality `labelSelector`
#   (`a=b,c=d`; Kubernetes docs, "Labels and Selectors", equality-based requirements);
# - Leases (coordination.k8s.io/v1) are plain objects with the same optimistic concurrency;
# - KubeRay 1.6.2's suspend is atomic (ray-operator/controllers/ray/raycluster_controller.go at v1.6.2,
#   `reconcilePods` and the status calculation; the `RayClusterStatusConditions` gate is on by default,
#   ray-operator/pkg/features/features.go): `reconcile()` is one turn of the operator: a cluster with
#   `spec.suspend` becomes `RayClusterSuspending`; a Suspending one has every pod deleted, the head's
#   included, whatever `spec.suspend` says now, and becomes `RayClusterSuspended` once none is left;
#   only a Suspended one whose `spec.suspend` is false is cleared, and its pods (a new head) come back.
#   `on_head(alive)` links the Ray side: a suspended (or deleted) cluster has no head.
# - `pods/<name>/portforward` upgrades to a WebSocket of subprotocol `v4.channel.k8s.io` as kubelet's
#   does (kubernetes pkg/kubelet/cri/streaming/portforward/websocket.go at v1.34: one port per
#   `ports=`; channels 0 data and 1 error; the port, 2 bytes little endian, first on each channel; a
#   connection the pod refuses is reported on the error channel; the stream closes when the pod side
#   does; RFC 6455: client frames must be masked, else the connection fails). A pod's port is served
#   by a real loopback port (`forward_to`); an unknown pod is 404, a request without a WebSocket
#   upgrade 400.

from __future__ import annotations

import base64
import hashlib
import json
import socket
import struct
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CUSTOM_PREFIX = "/apis/ray.io/"
MAX_CONFIGMAP_BYTES = 1024 * 1024
KINDS = {"configmaps": "ConfigMap", "leases": "Lease", "rayclusters": "RayCluster", "pods": "Pod",
         "services": "Service", "secrets": "Secret"}


def _copied(value: Any) -> Any:
    """A deep copy of JSON data (what the API keeps and answers): copy.deepcopy's memo and dispatch cost
    several times more, and the run lifecycle's exploration copies on every request."""
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copied(item) for item in value]
    return value  # str, int, float, bool, None


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null deletes, anything else (lists too) replaces."""
    if not isinstance(patch, dict):
        return _copied(patch)
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
        self.lock = threading.RLock()
        self.created = time.time()
        self.pods: dict[str, bool] = {}
        """RayCluster path -> whether its pods (the head's among them) exist."""
        self.on_head: Callable[[str, bool], None] = lambda _path, _alive: None
        """Called with a RayCluster's path when its head goes (False) or comes back (True)."""
        self.forward_to: dict[tuple[str, int], int] = {}
        """(pod path, pod port) -> the 127.0.0.1 port that serves it."""
        self.forwards: list[str] = []
        """The pod path of each port-forward stream opened."""

    def add_head(self, namespace: str, service: str, pod: str, local_port: int, port: int = 8265) -> None:
        """A Service selecting one Running pod whose `port` is served on 127.0.0.1:`local_port`."""
        labels = {"ray.io/node-type": "head", "ray.io/cluster": service.removesuffix("-head-svc")}
        base = f"/api/v1/namespaces/{namespace}"
        self.put_object(f"{base}/services/{service}", {"apiVersion": "v1", "kind": "Service", "metadata": {
            "name": service, "namespace": namespace}, "spec": {"selector": labels, "ports": [
                {"name": "dashboard", "port": port, "targetPort": port}]}})
        self.put_object(f"{base}/pods/{pod}", {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": pod, "namespace": namespace, "labels": labels}, "status": {"phase": "Running"}})
        self.forward_to[(f"{base}/pods/{pod}", port)] = local_port

    def put_object(self, path: str, obj: dict[str, Any]) -> None:
        with self.lock:
            self.version += 1
            obj = _copied(obj)
            obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)
            self.objects[path] = obj

    def get(self, path: str) -> dict[str, Any] | None:
        return _copied(self.objects.get(path))

    def handle(self, method: str, raw_path: str, headers: dict[str, str], body: Any) -> tuple[int, Any]:
        url = urllib.parse.urlsplit(raw_path)
        query = urllib.parse.parse_qs(url.query)
        path = url.path
        self.requests.append((method, raw_path, headers, body))
        with self.lock:
            current = self.objects.get(path)
            if method == "GET" and current is None and path.rsplit("/", 1)[-1] in KINDS:
                return 200, self._list(path, (query.get("labelSelector") or [""])[0])
            if method == "GET":
                return (200, _copied(current)) if current is not None else _status(404, "NotFound")
            applies = method == "PATCH" and headers.get("Content-Type") == "application/apply-patch+yaml"
            if method == "POST" or (applies and current is None):
                name = body["metadata"]["name"]
                target = f"{path}/{name}" if method == "POST" else path
                if target in self.objects:
                    return _status(409, "AlreadyExists")
                if (invalid := _invalid(None, body)) is not None:
                    return invalid
                created = self.created = max(self.created + 1, time.time())
                body = _copied(body)
                body["metadata"].update(uid=str(uuid.uuid4()),
                                        creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created)))
                stored = self._store(target, body)
                if target.startswith(CUSTOM_PREFIX):
                    self._set_pods(target, not (body.get("spec") or {}).get("suspend"))
                return 201, stored
            if current is None:
                return _status(404, "NotFound")
            if method == "DELETE":
                wanted = (body or {}).get("preconditions") or {} if isinstance(body, dict) else {}
                meta = current["metadata"]
                if any(wanted.get(key) not in (None, meta.get(key)) for key in ("uid", "resourceVersion")):
                    return _status(409, "Conflict")
                del self.objects[path]
                self.owners.pop(path, None)
                if path.startswith(CUSTOM_PREFIX):
                    self._set_pods(path, False)
                return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
            sent_version = (body.get("metadata") or {}).get("resourceVersion") if isinstance(body, dict) else None
            if sent_version is not None and sent_version != current["metadata"]["resourceVersion"]:
                return _status(409, "Conflict")
            if method == "PUT":
                if (invalid := _invalid(current, body)) is not None:
                    return invalid
                body = _copied(body)
                body["metadata"].update({k: current["metadata"][k] for k in ("uid", "creationTimestamp")
                                         if k in current["metadata"]})
                if "status" in current and "status" not in body:
                    body["status"] = current["status"]  # the main resource's PUT leaves status as it is
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

    def _list(self, path: str, selector: str) -> dict[str, Any]:
        wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
        items = [_copied(obj) for key, obj in sorted(self.objects.items())
                 if key.rsplit("/", 1)[0] == path
                 and all((obj["metadata"].get("labels") or {}).get(k) == v for k, v in wanted.items())]
        kind = KINDS[path.rsplit("/", 1)[-1]]
        return {"kind": f"{kind}List", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.version)},
                "items": items}

    def _set_pods(self, path: str, alive: bool) -> None:
        if self.pods.get(path) != alive:
            self.pods[path] = alive
            self.on_head(path, alive)

    def reconcile(self) -> None:
        """One turn of KubeRay 1.6.2's RayCluster controller over every RayCluster (see the module doc)."""
        with self.lock:
            for path, cluster in list(self.objects.items()):
                if not path.startswith(CUSTOM_PREFIX) or "/rayclusters/" not in path:
                    continue
                conditions = {c["type"]: c["status"] for c in (cluster.get("status") or {}).get("conditions") or []}
                suspend = bool((cluster.get("spec") or {}).get("suspend"))
                if conditions.get("RayClusterSuspending") == "True":
                    self._set_pods(path, False)  # every pod, the head's too, whatever spec.suspend says now
                    conditions.update(RayClusterSuspending="False", RayClusterSuspended="True")
                elif conditions.get("RayClusterSuspended") == "True":
                    if not suspend:
                        conditions["RayClusterSuspended"] = "False"
                        self._set_pods(path, True)
                elif suspend:
                    conditions["RayClusterSuspending"] = "True"
                else:
                    self._set_pods(path, True)
                status = {"conditions": [{"type": k, "status": v} for k, v in sorted(conditions.items())]}
                if status != cluster.get("status"):
                    self._store(path, {**cluster, "status": status})

    def _store(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj = _copied(obj)
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        self.objects[path] = obj
        return _copied(obj)


def _status(code: int, reason: str, message: str = "") -> tuple[int, dict[str, Any]]:
    return code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code,
                  "message": message or reason}


def _invalid(old: dict[str, Any] | None, new: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """The API server's ConfigMap validation (see the module doc); None when valid."""
    if new.get("kind") != "ConfigMap":
        return None
    size = sum(len(k) + len(str(v).encode()) for part in ("data", "binaryData") for k, v in (new.get(part) or {}).items())
    if size > MAX_CONFIGMAP_BYTES:
        return _status(422, "Invalid", f"ConfigMap \"{new['metadata']['name']}\" is invalid: []: Too long: must have "
                                       f"at most {MAX_CONFIGMAP_BYTES} bytes")
    if old is not None and old.get("immutable") and (
            not new.get("immutable") or (old.get("data"), old.get("binaryData")) != (new.get("data"), new.get("binaryData"))):
        return _status(422, "Invalid", "field is immutable when `immutable` is set")
    return None


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

        def do_GET(self) -> None:  # noqa: N802
            path, _, query = self.path.partition("?")
            if path.endswith("/portforward"):
                self._portforward(path.removesuffix("/portforward"), urllib.parse.parse_qs(query))
            else:
                self._answer()

        def _portforward(self, pod: str, query: dict[str, list[str]]) -> None:
            if pod not in state.objects:
                self.send_error(404)
                return
            key = self.headers.get("Sec-WebSocket-Key", "")
            if self.headers.get("Upgrade", "").lower() != "websocket" or "v4.channel.k8s.io" not in [
                    p.strip() for p in self.headers.get("Sec-WebSocket-Protocol", "").split(",")]:
                self.send_error(400)
                return
            [port] = [int(p) for p in query["ports"][0].split(",")]
            state.forwards.append(pod)
            accept = base64.b64encode(hashlib.sha1(key.encode() + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
            self.close_connection = True
            self.wfile.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                             b"Sec-WebSocket-Accept: " + accept + b"\r\nSec-WebSocket-Protocol: v4.channel.k8s.io\r\n\r\n")
            self.wfile.flush()
            out = self.connection
            lock = threading.Lock()

            def frame(opcode: int, payload: bytes) -> None:
                size = len(payload)
                head = (struct.pack(">BB", 0x80 | opcode, size) if size < 126 else
                        struct.pack(">BBH", 0x80 | opcode, 126, size) if size < 65536 else
                        struct.pack(">BBQ", 0x80 | opcode, 127, size))
                with lock:
                    out.sendall(head + payload)

            prefix = struct.pack("<H", port)
            frame(0x2, b"\x00" + prefix)
            frame(0x2, b"\x01" + prefix)
            local = state.forward_to.get((pod, port))
            try:
                upstream = socket.create_connection(("127.0.0.1", local), timeout=5) if local else None
            except OSError:
                upstream = None
            if upstream is None:
                frame(0x2, b"\x01" + f"error forwarding port {port} to pod: connection refused".encode())
                frame(0x8, struct.pack(">H", 1000))
                return
            upstream.settimeout(None)

            def pod_to_client() -> None:
                try:
                    while chunk := upstream.recv(65536):
                        frame(0x2, b"\x00" + chunk)
                    frame(0x8, struct.pack(">H", 1000))
                except OSError:
                    pass

            threading.Thread(target=pod_to_client, daemon=True).start()
            try:
                while True:
                    b0, b1 = self.rfile.read(2)
                    size = b1 & 0x7F
                    if size == 126:
                        size = struct.unpack(">H", self.rfile.read(2))[0]
                    elif size == 127:
                        size = struct.unpack(">Q", self.rfile.read(8))[0]
                    if not b1 & 0x80:
                        return  # an unmasked client frame fails the connection
                    mask = self.rfile.read(4)
                    data = bytes(c ^ mask[i % 4] for i, c in enumerate(self.rfile.read(size)))
                    if b0 & 0x0F == 0x8:
                        return
                    if b0 & 0x0F == 0x2 and data[:1] == b"\x00":
                        upstream.sendall(data[1:])
            except (OSError, ValueError):
                pass
            finally:
                upstream.close()

        do_POST = do_PUT = do_PATCH = do_DELETE = _answer

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


class InProcessApi:
    """workloads.kube.KubernetesApi with its transport answered by a stand-in in this process (no
    socket: thousands of requests a second), and faults on demand: `down` (the API server does not
    answer: URLError, as urllib raises it) and `fail_next` (the next requests answer these codes)."""

    def __new__(cls, state: KubeApiStandIn) -> Any:
        import urllib.error

        from workloads.kube import KubernetesApi

        class Api(KubernetesApi):
            down = False
            fail_next: list[int] = []

            def send(self, method: str, path: str, data: bytes | None, headers: dict[str, str]) -> tuple[int, Any]:
                if self.down:
                    raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
                if self.fail_next:
                    code = self.fail_next.pop(0)
                    if code >= 500:
                        raise urllib.error.HTTPError(self.url + path, code, "injected", None, None)  # type: ignore[arg-type]
                    return _status(code, "Injected")
                return state.handle(method, path, headers, None if data is None else json.loads(data))

        api = Api("http://in-process")
        api.fail_next = []
        return api
