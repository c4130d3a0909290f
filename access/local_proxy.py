"""A loopback HTTP proxy of one command's own, the only way the CLI, the job provider and your browser
reach a port-forwarded Ray dashboard (docs/security.md, A2: why a loopback port needs a secret).

It admits only requests that carry the session's secret as the first path segment, name this proxy
in `Host`, and come from no other site (`Origin`, `Sec-Fetch-Site`); it forwards each without the
secret on a port-forward stream of its own (access/pod_forward.py), with `Host` rewritten and, where
the Ray cluster has token authentication, the token added (so the browser and the CLI never hold it).
Open the URL with its trailing `/`: Ray's dashboard serves relative links.
"""

from __future__ import annotations

import hmac
import secrets
import socket
import threading
from collections.abc import Callable
from typing import Any

_HEAD_LIMIT = 64 * 1024
_CHUNK = 64 * 1024
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer", "upgrade",
               "transfer-encoding"}


class LocalProxy:
    """Started on enter (yields the URL with the session's secret), stopped on exit."""

    def __init__(self, upstream: int | Callable[[float], Any], token: str | None = None,
                 timeout_s: float = 30.0) -> None:
        """`upstream`: a loopback port (a head of your own), or a function opening a stream (a
        socket-like object) to the head within a deadline (access.pod_forward)."""
        if isinstance(upstream, int):
            port = upstream
            self._connect: Callable[[float], Any] = lambda t: socket.create_connection(("127.0.0.1", port), timeout=t)
            self._upstream_host = f"127.0.0.1:{port}"
        else:
            self._connect, self._upstream_host = upstream, "127.0.0.1"
        self._token = token
        self._timeout_s = timeout_s
        self._secret = secrets.token_urlsafe(32)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._hosts = {f"127.0.0.1:{self.port}", f"localhost:{self.port}"}
        self._origins = {f"http://{host}" for host in self._hosts}
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{self._secret}"

    def __enter__(self) -> str:
        threading.Thread(target=self._serve, daemon=True, name="verl-gke-proxy").start()
        return self.url

    def __exit__(self, *exc: object) -> None:
        try:  # wakes the accepting thread: a close alone leaves the socket listening until accept returns
            self._server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._server.close()
        with self._lock:
            for sock in self._open:
                _close(sock)
            self._open.clear()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed on exit
            with self._lock:
                self._open.add(conn)
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        upstream = None
        try:
            conn.settimeout(self._timeout_s)
            head, rest = _read_head(conn)
            if head is None:
                return
            method, target, headers = _parse_request(head)
            refused = self._refusal(target, headers)
            if refused:
                _answer(conn, 403, f"verl-gke's local proxy refused the request: {refused}")
                return
            path = target[len(self._secret) + 1:]
            if not path.startswith("/"):
                # A browser opening the bare URL: the dashboard's relative links need the trailing slash.
                _answer(conn, 308, "", {"Location": f"/{self._secret}/"})
                return
            if "transfer-encoding" in headers:
                _answer(conn, 411, "verl-gke's local proxy takes request bodies with a Content-Length only")
                return
            upgrade = headers.get("upgrade", "").lower() == "websocket"
            try:
                upstream = self._connect(self._timeout_s)
            except OSError as error:
                _answer(conn, 502, f"verl-gke's local proxy could not reach the Ray head: {error}")
                return
            with self._lock:
                self._open.add(upstream)
            try:
                upstream.sendall(self._request_head(method, path, headers, upgrade))
                _copy_body(conn, upstream, rest, int(headers.get("content-length", "0") or 0))
            except OSError as error:
                _answer(conn, 502, f"verl-gke's local proxy could not reach the Ray head: {_cause(upstream, error)}")
                return
            if upgrade:
                conn.settimeout(None)
                upstream.settimeout(None)
                thread = threading.Thread(target=_pipe, args=(upstream, conn), daemon=True)
                thread.start()
                _pipe(conn, upstream)
                thread.join()
            else:
                _relay_response(upstream, conn)
        except (OSError, ValueError):
            pass  # the client or the forward went away, or spoke no HTTP: drop the connection
        finally:
            for sock in (conn, upstream):
                if sock is not None:
                    with self._lock:
                        self._open.discard(sock)
                    _close(sock)

    def _refusal(self, target: str, headers: dict[str, str]) -> str | None:
        segment = target.split("?", 1)[0].split("/", 2)[1] if target.startswith("/") else ""
        if not hmac.compare_digest(segment.encode(), self._secret.encode()):
            return "no session secret in the path"
        if headers.get("host") not in self._hosts:
            return f"Host {headers.get('host')!r} is not this proxy's"
        if "origin" in headers and headers["origin"] not in self._origins:
            return f"Origin {headers['origin']!r} is another site"
        if headers.get("sec-fetch-site", "none") not in ("none", "same-origin"):
            return f"Sec-Fetch-Site {headers['sec-fetch-site']!r}: a request from another site"
        return None

    def _request_head(self, method: str, path: str, headers: dict[str, str], upgrade: bool) -> bytes:
        out = {k: v for k, v in headers.items() if k not in _HOP_BY_HOP and k not in ("host", "origin")}
        out["host"] = self._upstream_host
        if self._token:
            out["authorization"] = f"Bearer {self._token}"
        if upgrade:
            out.update(connection="Upgrade", upgrade="websocket")
        else:
            out["connection"] = "close"
        lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in out.items())]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _read_head(sock: socket.socket) -> tuple[bytes | None, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(_CHUNK)
        if not chunk:
            return None, b""
        data += chunk
        if len(data) > _HEAD_LIMIT:
            raise ValueError("request head too large")
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _parse_request(head: bytes) -> tuple[str, str, dict[str, str]]:
    request_line, *lines = head.decode("latin-1").split("\r\n")
    method, target, version = request_line.split(" ")
    if not version.startswith("HTTP/1."):
        raise ValueError(version)
    headers: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        key = name.strip().lower()
        if key in headers and key in ("host", "origin", "sec-fetch-site", "content-length"):
            raise ValueError(f"two {key} headers")  # an ambiguous request is no request
        headers[key] = value.strip()
    return method, target, headers


def _copy_body(src: socket.socket, dst: socket.socket, already: bytes, length: int) -> None:
    dst.sendall(already[:length])
    left = length - len(already[:length])
    while left > 0:
        chunk = src.recv(min(_CHUNK, left))
        if not chunk:
            raise ValueError("request body cut short")
        dst.sendall(chunk)
        left -= len(chunk)


def _relay_response(upstream: socket.socket, client: socket.socket) -> None:
    """The forward's answer with `Connection: close` (one request per connection), then its body."""
    try:
        head, rest = _read_head(upstream)
    except OSError as error:  # the forward's pod side failed (access.pod_forward), or timed out
        _answer(client, 502, f"verl-gke's local proxy got no answer from the Ray head: {error}")
        return
    if head is None:
        return
    status, *lines = head.decode("latin-1").split("\r\n")
    kept = [line for line in lines if line.partition(":")[0].strip().lower() not in ("connection", "keep-alive")]
    client.sendall(("\r\n".join([status, *kept, "Connection: close"]) + "\r\n\r\n").encode("latin-1") + rest)
    _pipe(upstream, client)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(_CHUNK):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for sock, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass


def _answer(sock: socket.socket, status: int, text: str, headers: dict[str, Any] | None = None) -> None:
    reasons = {308: "Permanent Redirect", 403: "Forbidden", 411: "Length Required", 502: "Bad Gateway"}
    body = (text + "\n").encode() if text else b""
    lines = [f"HTTP/1.1 {status} {reasons[status]}", "Content-Type: text/plain; charset=utf-8",
             f"Content-Length: {len(body)}", "Connection: close",
             *(f"{k}: {v}" for k, v in (headers or {}).items())]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)


def _cause(upstream: Any, error: OSError) -> OSError:
    """Why a stream refused a write: the pod side's own error where it sent one before closing."""
    try:
        upstream.recv(1)
    except OSError as reported:
        return reported
    return error


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
