"""An in-memory GCS bucket behind the real client (workloads/gcs.Gcs), with the JSON API's semantics the
markers and the export rest on (https://cloud.google.com/storage/docs/json_api/v1/objects,
.../docs/request-preconditions, .../docs/generations-preconditions): every write (objects.insert, media or
multipart) a new, larger generation; `ifGenerationMatch` on either lands only at that generation (0: absent),
else 412; objects.get of a non-live generation 404 (no versioning); objects.list by prefix strongly
consistent, in name order, paged; `updated` and the Date header by the bucket's clock. Compared call for
call with fake-gcs-server by tests/test_gcs_memory.py. Not imitated: IAM, 429/503, resumable uploads.
The pods' mount (GCS FUSE: a file's upload on close is a new generation) is a folder: `sync` makes each
file written there since the last request a new generation."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import format_datetime
from pathlib import Path

from workloads.gcs import Gcs, PreconditionFailed

PAGE = 2
"""Objects per list page (GCS: up to 1000): small, so every listing goes through the client's paging."""
EPOCH = datetime(2026, 12, 7, tzinfo=timezone.utc)


@dataclass
class Bucket:
    """The objects (name -> (generation, bytes, updated s)); `history` keeps every generation's bytes for the
    tests' own checks (never answered: a read of a non-live generation is 404, as without versioning)."""

    name: str
    clock: Callable[[], float] = lambda: 0.0
    mount: Path | None = None
    objects: dict[str, tuple[int, bytes, float]] = field(default_factory=dict)
    history: dict[tuple[str, int], bytes] = field(default_factory=dict)
    next_generation: int = 1_765_000_000_000_000
    _seen: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _store(self, name: str, data: bytes) -> int:
        self.next_generation += 1 + len(self.objects)
        self.objects[name] = (self.next_generation, data, self.clock())
        self.history[(name, self.next_generation)] = data
        return self.next_generation

    def sync(self) -> None:
        """The mount's writes since the last call, each a new generation; files gone, objects gone."""
        if self.mount is None or not self.mount.exists():
            return
        now: dict[str, tuple[int, int, int]] = {}
        for path in self.mount.rglob("*"):
            if path.is_file():
                st = path.stat()
                now[path.relative_to(self.mount).as_posix()] = (st.st_ino, st.st_mtime_ns, st.st_size)
        for name, key in now.items():
            if self._seen.get(name) != key:
                self._store(name, (self.mount / name).read_bytes())
        for name in set(self._seen) - set(now):
            self.objects.pop(name, None)
        self._seen = now

    def serve(self, method: str, url: str, data: bytes | None) -> tuple[int, bytes]:
        """One JSON API request: the HTTP status and body."""
        with self._lock:
            self.sync()
            parts = urllib.parse.urlsplit(url)
            query = dict(urllib.parse.parse_qsl(parts.query))
            path = urllib.parse.unquote(parts.path)
            if method == "POST" and path == f"/upload/storage/v1/b/{self.name}/o":
                return self._insert(query, data or b"")
            prefix = f"/storage/v1/b/{self.name}/o"
            if method == "GET" and path == prefix:
                return self._list(query)
            if method == "GET" and path.startswith(prefix + "/"):
                return self._get(path[len(prefix) + 1:], query)
            return 400, b"{}"

    def _meta(self, name: str) -> bytes:
        generation, data, updated = self.objects[name]
        stamp = datetime.fromtimestamp(EPOCH.timestamp() + updated, timezone.utc).isoformat().replace("+00:00", "Z")
        return json.dumps({"name": name, "bucket": self.name, "generation": str(generation), "size": str(len(data)),
                           "updated": stamp}).encode()

    def _get(self, name: str, query: dict[str, str]) -> tuple[int, bytes]:
        live = self.objects.get(name)
        if live is None or ("generation" in query and int(query["generation"]) != live[0]):
            return 404, b"{}"
        return 200, live[1] if query.get("alt") == "media" else self._meta(name)

    def _list(self, query: dict[str, str]) -> tuple[int, bytes]:
        names = sorted(n for n in self.objects if n.startswith(query.get("prefix", "")) and n > query.get("pageToken", ""))
        page = names[:PAGE]
        body: dict = {"kind": "storage#objects"}
        if page:
            body["items"] = [json.loads(self._meta(n)) for n in page]
        if len(names) > PAGE:
            body["nextPageToken"] = page[-1]
        return 200, json.dumps(body).encode()

    def _insert(self, query: dict[str, str], body: bytes) -> tuple[int, bytes]:
        if query.get("uploadType") == "multipart":
            boundary = body.split(b"\r\n", 1)[0]
            meta, content = body.split(boundary)[1:3]
            name = json.loads(meta.split(b"\r\n\r\n", 1)[1].strip())["name"]
            data = content.split(b"\r\n\r\n", 1)[1][:-2]
        else:
            name, data = query["name"], body
        if "ifGenerationMatch" in query:
            live = self.objects.get(name)
            if int(query["ifGenerationMatch"]) != (live[0] if live else 0):
                return 412, b"{}"
        self._store(name, data)
        return 200, self._meta(name)

    def date(self) -> str:
        return format_datetime(datetime.fromtimestamp(EPOCH.timestamp() + self.clock(), timezone.utc), usegmt=True)


@dataclass
class MemoryGcs(Gcs):
    """The real client (workloads/gcs.Gcs) with its requests answered by `store` (the HTTP answer's mapping
    is _answer's: 404 None, 412 PreconditionFailed, else an OSError); `before` runs ahead of each request (a
    schedule's pause point)."""

    store: Bucket | None = None
    before: Callable[[], None] = lambda: None

    def _answer(self, url: str, name: str, *, data: bytes | None = None, method: str = "GET",
                headers: dict[str, str] | None = None) -> tuple[bytes | None, str]:
        assert self.store is not None
        self.before()
        status, body = self.store.serve(method, url, data)
        if status == 404:
            return None, ""
        if status == 412:
            raise PreconditionFailed(f"gs://{self.bucket}/{name}: changed by another writer")
        if status != 200:
            raise OSError(f"HTTP {status} for {method} {url}")
        return body, self.store.date()


def memory_gcs(store: Bucket, mount: Path, before: Callable[[], None] = lambda: None) -> MemoryGcs:
    return MemoryGcs(store.name, mount=str(mount), storage_url="http://memory", token_url=None, store=store,
                     before=before)
