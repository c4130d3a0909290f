"""The bucket's objects through the GCS JSON API, for the decisions that must rest on what GCS itself
guarantees: every write of an object gives it a new generation, a read can name the generation it wants,
and a write with `ifGenerationMatch` lands only if the object is still at that generation (0: absent),
else HTTP 412 (https://cloud.google.com/storage/docs/request-preconditions, .../docs/generations-preconditions).

The bulk data (verl's shards, the merged model) goes through the bucket mount (GCS FUSE); markers, claims,
the export's pointer and staging's gs:// dataDir copy through here, with the pod's Workload Identity token
(GKE metadata server; the mount's identity and grants: domain/bucket.py); preview's ranged parquet reads with
the gcp provider's. Standard library only, shipped beside its users in the cluster. Every request is bounded.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from datetime import datetime
from email.utils import parsedate_to_datetime
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

STORAGE_URL = "https://storage.googleapis.com"
METADATA_TOKEN_URL = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"
REQUEST_TIMEOUT_S = 30.0
REWRITE_DEADLINE_S = 3600.0
"""How long one copy (objects.rewrite, all its calls) may take: a few calls in one location, more across."""


class PreconditionFailed(Exception):
    """The object was not at the generation the write named (HTTP 412): another writer came first."""


@dataclass(frozen=True)
class Stat:
    generation: int
    size: int


@dataclass
class Gcs:
    """Objects of `bucket`; `mount` is where the pods mount it (a path under it names an object). No
    `token_url`: no Authorization header (an emulator), or `access_token`'s (one the caller holds)."""

    bucket: str
    mount: str = "/data"
    storage_url: str = STORAGE_URL
    token_url: str | None = METADATA_TOKEN_URL
    timeout_s: float = REQUEST_TIMEOUT_S
    access_token: str | None = None
    _token: tuple[str, float] | None = None

    @classmethod
    def in_pod(cls, bucket: str, mount: str, timeout_s: float = REQUEST_TIMEOUT_S) -> Gcs:
        """The pod's client: GCS with its Workload Identity token, or the emulator STORAGE_EMULATOR_HOST names
        (the variable Google's client libraries honour), unauthenticated."""
        emulator = os.environ.get("STORAGE_EMULATOR_HOST", "")
        if emulator:
            return cls(bucket, mount=mount, storage_url=emulator.rstrip("/"), token_url=None, timeout_s=timeout_s)
        return cls(bucket, mount=mount, timeout_s=timeout_s)

    def name(self, path: object) -> str:
        """The object name of a path under the mount: `/data/verl/x` -> `verl/x`."""
        return PurePosixPath(str(path)).relative_to(self.mount).as_posix()

    def _headers(self) -> dict[str, str]:
        if self.token_url is None:
            return {"Authorization": f"Bearer {self.access_token}"} if self.access_token else {}
        if self._token is None or time.monotonic() >= self._token[1]:
            request = urllib.request.Request(self.token_url, headers={"Metadata-Flavor": "Google"})
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                answer = json.load(response)
            # Renewed a minute before it expires, by this process's clock only.
            self._token = (answer["access_token"], time.monotonic() + float(answer.get("expires_in", 300)) - 60)
        return {"Authorization": f"Bearer {self._token[0]}"}

    def _call(self, url: str, name: str, *, data: bytes | None = None, method: str = "GET",
              headers: dict[str, str] | None = None) -> bytes | None:
        """The answer's body; None on 404; PreconditionFailed on 412 (`name`: the object's); other HTTP errors
        go up (OSError)."""
        return self._answer(url, name, data=data, method=method, headers=headers)[0]

    def _answer(self, url: str, name: str, *, data: bytes | None = None, method: str = "GET",
                headers: dict[str, str] | None = None) -> tuple[bytes | None, str]:
        """_call's body and the answer's Date header (GCS's clock)."""
        request = urllib.request.Request(url, data=data, method=method, headers={**self._headers(), **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return response.read(), response.headers.get("Date", "")
        except urllib.error.HTTPError as error:
            error.close()
            if error.code == 404:
                return None, ""
            if error.code == 412:
                raise PreconditionFailed(f"gs://{self.bucket}/{name}: changed by another writer") from None
            raise

    def _object_url(self, name: str, bucket: str | None = None) -> str:
        return f"{self.storage_url}/storage/v1/b/{bucket or self.bucket}/o/{urllib.parse.quote(name, safe='')}"

    def stat(self, name: str, generation: int | None = None) -> Stat | None:
        """The object's current generation and size (that `generation`'s, when named); None when absent."""
        query = "" if generation is None else f"?generation={generation}"
        body = self._call(self._object_url(name) + query, name)
        if body is None:
            return None
        meta = json.loads(body)
        return Stat(int(meta["generation"]), int(meta["size"]))

    def age_s(self, name: str) -> float | None:
        """How long ago the object was last written, by GCS's own clock (its `updated` against the answer's
        Date: no other machine's clock); None when absent."""
        body, date = self._answer(self._object_url(name), name)
        if body is None:
            return None
        updated = datetime.fromisoformat(json.loads(body)["updated"].replace("Z", "+00:00"))
        return max((parsedate_to_datetime(date) - updated).total_seconds(), 0.0)

    def read(self, name: str, generation: int | None = None) -> tuple[bytes, int] | None:
        """The object's bytes and generation (that `generation` only, when named); None when absent."""
        stat = self.stat(name) if generation is None else Stat(generation, -1)
        if stat is None:
            return None
        body = self._call(f"{self._object_url(name)}?alt=media&generation={stat.generation}", name)
        return None if body is None else (body, stat.generation)

    def media(self, name: str, generation: int | None = None, start: int = 0, length: int | None = None
              ) -> bytes | None:
        """The object's bytes in one request (objects.get, alt=media): the current generation's or that
        `generation`'s, all of them or `length` from `start` (a Range request); None when absent."""
        query = "?alt=media" + ("" if generation is None else f"&generation={generation}")
        ranged = None if length is None else {"Range": f"bytes={start}-{start + length - 1}"}
        return self._call(self._object_url(name) + query, name, headers=ranged)

    def rewrite(self, name: str, source_bucket: str, source_name: str, source_generation: int,
                if_generation_match: int, deadline_s: float = REWRITE_DEADLINE_S) -> int | None:
        """Copy that generation of gs://source_bucket/source_name to `name` inside GCS (objects.rewrite: no byte
        passes through here), only if `name` is at `if_generation_match` (0: absent, else PreconditionFailed);
        the copy's generation, None on 404 (the source generation gone). GCS answers `done: false` and a
        rewriteToken until the copy is whole: each call is bounded by timeout_s, all of them by `deadline_s`."""
        query = urllib.parse.urlencode({"sourceGeneration": source_generation,
                                        "ifGenerationMatch": if_generation_match})
        url = (f"{self._object_url(source_name, source_bucket)}/rewriteTo/b/{self.bucket}/o/"
               f"{urllib.parse.quote(name, safe='')}?{query}")
        end = time.monotonic() + deadline_s
        token = ""
        while True:
            body = self._call(url + (f"&rewriteToken={urllib.parse.quote(token, safe='')}" if token else ""), name,
                              data=b"{}", method="POST", headers={"Content-Type": "application/json"})
            if body is None:
                return None
            answer = json.loads(body)
            if answer.get("done"):
                return int(answer["resource"]["generation"])
            token = str(answer["rewriteToken"])
            if time.monotonic() >= end:
                raise TimeoutError(f"gs://{self.bucket}/{name}: the copy of gs://{source_bucket}/{source_name} is "
                                   f"not done after {deadline_s:g} s ({answer.get('totalBytesRewritten', '?')} of "
                                   f"{answer.get('objectSize', '?')} bytes)")

    def put(self, name: str, data: bytes, content_type: str) -> None:
        """Write the object whatever it holds (objects.insert, uploadType=media: one request, no precondition)."""
        query = urllib.parse.urlencode({"uploadType": "media", "name": name})
        if self._call(f"{self.storage_url}/upload/storage/v1/b/{self.bucket}/o?{query}", name, data=data,
                      method="POST", headers={"Content-Type": content_type}) is None:
            raise FileNotFoundError(f"gs://{self.bucket}: no such bucket")

    def read_json(self, name: str, generation: int | None = None) -> tuple[dict[str, Any], int] | None:
        """A JSON object and its generation; None when absent or not an object."""
        got = self.read(name, generation)
        if got is None:
            return None
        try:
            data = json.loads(got[0])
        except ValueError:
            return None
        return (data, got[1]) if isinstance(data, dict) else None

    def write(self, name: str, data: bytes, if_generation_match: int) -> int:
        """Write the object only if it is at `if_generation_match` (0: only if absent); its new generation.
        A multipart upload: one request, so the precondition and the bytes land together or not at all."""
        boundary = uuid.uuid4().hex
        body = (f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n"
                f"{json.dumps({'name': name})}\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n"
                ).encode() + data + f"\r\n--{boundary}--\r\n".encode()
        query = urllib.parse.urlencode({"uploadType": "multipart", "ifGenerationMatch": if_generation_match})
        answer = self._call(f"{self.storage_url}/upload/storage/v1/b/{self.bucket}/o?{query}", name, data=body,
                            method="POST", headers={"Content-Type": f"multipart/related; boundary={boundary}"})
        if answer is None:
            raise FileNotFoundError(f"gs://{self.bucket}: no such bucket")
        return int(json.loads(answer)["generation"])

    def write_json(self, name: str, data: dict[str, Any], if_generation_match: int) -> int:
        return self.write(name, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode(), if_generation_match)

    def generations(self, prefix: str) -> dict[str, Stat]:
        """Every object under `prefix` (name -> generation and size), all pages."""
        out: dict[str, Stat] = {}
        token = ""
        while True:
            query = urllib.parse.urlencode({"prefix": prefix, **({"pageToken": token} if token else {})})
            body = self._call(f"{self.storage_url}/storage/v1/b/{self.bucket}/o?{query}", prefix)
            page = json.loads(body or b"{}")
            out.update({item["name"]: Stat(int(item["generation"]), int(item["size"]))
                        for item in page.get("items", [])})
            token = page.get("nextPageToken", "")
            if not token:
                return out
