"""A port-forward to the Ray head inside this process: one WebSocket stream of the API server's
`pods/portforward` per connection, and no local listener (unlike `kubectl port-forward`'s open port).

Protocol (kubelet's WebSocket port-forward, `v4.channel.k8s.io`, through the API server): `GET
.../pods/<pod>/portforward?ports=<port>` upgraded to a WebSocket (RFC 6455); every binary message
starts with its channel (0 data, 1 error); the server first sends the port (2 bytes, little endian)
on each; an error channel's text is the pod side's failure; the stream closes with the pod side.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import ssl
import struct
import threading
import urllib.error
import urllib.parse
from typing import Any

from workloads.kube import KubernetesApi

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455, 1.3
_PROTOCOL = "v4.channel.k8s.io"
_HEAD_LIMIT = 64 * 1024


class ForwardError(OSError):
    """The stream to the pod could not open, or the pod side reported an error."""


class ForwardGone(ForwardError):
    """The API server has no such service, namespace or pod."""


class PodForward:
    """Streams to `port` of the pod behind `service` in `namespace`, through `api`."""

    def __init__(self, api: KubernetesApi, namespace: str, service: str, port: int) -> None:
        self.api = api
        self.namespace = namespace
        self.service = service
        self.port = port
        self._pod: str | None = None
        self._target_port = port
        self._lock = threading.Lock()

    def _get(self, path: str) -> dict[str, Any] | None:
        try:
            return self.api.request("GET", path)
        except urllib.error.HTTPError as error:
            raise ForwardError(f"GET {path}: HTTP {error.code}") from None
        except (OSError, ValueError) as error:
            raise ForwardError(f"GET {path}: {getattr(error, 'reason', error)}") from None

    def resolve(self) -> str:
        """The running pod behind the service (as `kubectl port-forward svc/...` picks one)."""
        base = f"/api/v1/namespaces/{self.namespace}"
        service = self._get(f"{base}/services/{self.service}")
        if service is None:
            raise ForwardGone(f'services "{self.service}" not found')
        spec = service.get("spec") or {}
        for entry in spec.get("ports") or []:
            if entry.get("port") == self.port and isinstance(entry.get("targetPort"), int):
                self._target_port = entry["targetPort"]
        selector = ",".join(f"{k}={v}" for k, v in sorted((spec.get("selector") or {}).items()))
        pods = self._get(f"{base}/pods?labelSelector={urllib.parse.quote(selector)}") or {}
        running = sorted(p["metadata"]["name"] for p in pods.get("items") or []
                         if (p.get("status") or {}).get("phase") == "Running"
                         and not p["metadata"].get("deletionTimestamp"))
        if not selector or not running:
            raise ForwardError(f"no running pod behind svc/{self.service} (the head is not up yet)")
        with self._lock:
            self._pod = running[0]
        return running[0]

    def connect(self, timeout_s: float) -> ForwardStream:
        """A new stream to the pod's port; the pod is looked up again if the last one is gone."""
        with self._lock:
            pod = self._pod
        try:
            return self._open(pod or self.resolve(), timeout_s)
        except ForwardGone:
            return self._open(self.resolve(), timeout_s)

    def _open(self, pod: str, timeout_s: float) -> ForwardStream:
        url = urllib.parse.urlsplit(self.api.url)
        host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
        sock: socket.socket = socket.create_connection((host, port), timeout=timeout_s)
        try:
            if url.scheme == "https":
                context = ssl.create_default_context(cafile=self.api.ca_file, cadata=self.api.ca_data)
                sock = context.wrap_socket(sock, server_hostname=host)
            key = base64.b64encode(os.urandom(16)).decode()
            path = (f"{url.path.rstrip('/')}/api/v1/namespaces/{self.namespace}/pods/{pod}/portforward"
                    f"?ports={self._target_port}")
            lines = [f"GET {path} HTTP/1.1", f"Host: {url.netloc}", "Upgrade: websocket", "Connection: Upgrade",
                     f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13", f"Sec-WebSocket-Protocol: {_PROTOCOL}"]
            if self.api.token is not None:
                lines.append(f"Authorization: Bearer {self.api.token()}")
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            head, rest = _read_head(sock)
            status = head.split(b"\r\n", 1)[0].decode("latin-1")
            headers = {k.strip().lower(): v.strip() for k, _, v in
                       (line.decode("latin-1").partition(":") for line in head.split(b"\r\n")[1:])}
            code = status.split(" ")[1] if status.count(" ") else ""
            if code == "404":
                with self._lock:
                    self._pod = None
                raise ForwardGone(f"pod {pod} in namespace {self.namespace} not found")
            if code != "101":
                raise ForwardError(f"the API server refused the port-forward to pod {pod}: {status}")
            accept = base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()
            if headers.get("sec-websocket-accept") != accept or headers.get("sec-websocket-protocol") != _PROTOCOL:
                raise ForwardError(f"the API server's answer to the port-forward to pod {pod} is no {_PROTOCOL} stream")
            return ForwardStream(sock, rest)
        except BaseException:
            sock.close()
            raise


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk or len(data) > _HEAD_LIMIT:
            raise ForwardError("the API server closed the connection before answering the port-forward")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


class ForwardStream:
    """One port-forward stream with the socket methods LocalProxy uses (recv, sendall, settimeout,
    shutdown, close); one thread may read while another writes."""

    def __init__(self, sock: socket.socket, buffered: bytes) -> None:
        self._sock = sock
        self._raw = buffered
        self._data = b""
        self._prefix = {0: 2, 1: 2}  # the port number the server sends first on each channel
        self._send_lock = threading.Lock()
        self._closed = False

    def settimeout(self, timeout: float | None) -> None:
        self._sock.settimeout(timeout)

    def _take(self, n: int) -> bytes:
        while len(self._raw) < n:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ForwardError("the port-forward stream was cut")
            self._raw += chunk
        out, self._raw = self._raw[:n], self._raw[n:]
        return out

    def _message(self) -> tuple[int, bytes]:
        """(opcode, payload) of the next whole message (continuation frames joined)."""
        payload, first = b"", None
        while True:
            b0, b1 = self._take(2)
            size = b1 & 0x7F
            if size == 126:
                size = struct.unpack(">H", self._take(2))[0]
            elif size == 127:
                size = struct.unpack(">Q", self._take(8))[0]
            mask = self._take(4) if b1 & 0x80 else b""
            data = _masked(self._take(size), mask) if mask else self._take(size)
            opcode = b0 & 0x0F
            if opcode >= 0x8:  # control frames come between fragments
                return opcode, data
            first = opcode if first is None else first
            payload += data
            if b0 & 0x80:
                return first, payload

    def recv(self, n: int) -> bytes:
        while not self._data:
            try:
                opcode, payload = self._message()
            except ForwardError:
                return b""
            if opcode == 0x8:
                return b""
            if opcode == 0x9:
                self._send(0xA, payload)
                continue
            if opcode != 0x2 or not payload:
                continue
            channel, body = payload[0], payload[1:]
            skip = min(self._prefix.get(channel, 0), len(body))
            self._prefix[channel] = self._prefix.get(channel, 0) - skip
            body = body[skip:]
            if channel == 1 and body:
                raise ForwardError(f"the pod side of the port-forward: {body.decode(errors='replace')[:300]}")
            if channel == 0:
                self._data = body
        out, self._data = self._data[:n], self._data[n:]
        return out

    def sendall(self, data: bytes) -> None:
        self._send(0x2, b"\x00" + data)

    def _send(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)  # a client masks every frame (RFC 6455, 5.3)
        size = len(payload)
        if size < 126:
            head = struct.pack(">BB", 0x80 | opcode, 0x80 | size)
        elif size < 1 << 16:
            head = struct.pack(">BBH", 0x80 | opcode, 0x80 | 126, size)
        else:
            head = struct.pack(">BBQ", 0x80 | opcode, 0x80 | 127, size)
        with self._send_lock:
            self._sock.sendall(head + mask + _masked(payload, mask))

    def shutdown(self, how: int) -> None:
        """The stream has no half-close: closing the writing side ends it (a close frame)."""
        if how in (socket.SHUT_WR, socket.SHUT_RDWR) and not self._closed:
            self._closed = True
            try:
                self._send(0x8, struct.pack(">H", 1000))
            except OSError:
                pass

    def close(self) -> None:
        self.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def _masked(data: bytes, mask: bytes) -> bytes:
    n = len(data)
    if not n:
        return data
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")
