"""Bounded JSON requests to the Kubernetes API, and the RayCluster's `spec.suspend`.

Standard library only: it ships into the cluster with the run supervisor. Every answer the run
lifecycle depends on has one meaning here: 404 is None ("not there"), 409 is Conflict (a stale
resourceVersion, an object that exists, a failed precondition), 422 is Invalid (the object is too
large, or immutable); anything else raises the HTTP error.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REQUEST_TIMEOUT_S = 30.0
"""Every request to the API server or the Ray head is bounded by this (the Lease's margin covers it)."""
FIELD_MANAGER = "verl-gke-run-supervisor"
"""The one field manager of the RayCluster's `spec.suspend` (the release and the resume)."""
CAS_TRIES = 8
AUTH_TOKEN_KEY = "auth_token"
"""The key of the Secret KubeRay 1.6 makes for a RayCluster with token authentication, named after the
RayCluster (ray-operator/controllers/ray/raycluster_controller.go reconcileAuthSecret, utils.CheckName)."""


class Conflict(Exception):
    """HTTP 409: the object changed since it was read, exists already, or a precondition failed."""


class Invalid(Exception):
    """HTTP 422: the API server refused the object (over its size limit, or immutable)."""


class KubernetesApi:
    """Bounded JSON requests to the Kubernetes API. `token` is called per request (kubelet rotates
    the pod's token; the provider's comes from gke-gcloud-auth-plugin); None sends none (a
    `kubectl proxy`, or a test's stand-in)."""

    def __init__(self, url: str, token: Callable[[], str] | None = None, ca_file: str | None = None,
                 ca_data: str | None = None, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self.ca_file, self.ca_data = ca_file, ca_data

    @classmethod
    def in_cluster(cls) -> KubernetesApi:
        account = Path("/var/run/secrets/kubernetes.io/serviceaccount")
        return cls("https://kubernetes.default.svc", lambda: (account / "token").read_text().strip(),
                   ca_file=str(account / "ca.crt"))

    def send(self, method: str, path: str, data: bytes | None, headers: dict[str, str]) -> tuple[int, Any]:
        """One request: (HTTP status, the decoded JSON body)."""
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        context = (ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_data)
                   if (self.ca_file or self.ca_data) else None)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=context) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as error:
            if error.code in (404, 409, 422):
                try:
                    body = json.load(error)
                except ValueError:
                    body = {}
                error.close()
                return error.code, body
            raise

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json") -> dict[str, Any] | None:
        """The reply; None for 404; Conflict for 409; Invalid for 422; other HTTP errors raise."""
        headers = {"Accept": "application/json"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token()}"
        if body is not None:
            headers["Content-Type"] = content_type
        data = None if body is None else json.dumps(body).encode()
        code, reply = self.send(method, path, data, headers)
        if code == 404:
            return None
        message = f"{method} {path}: {code} {(reply or {}).get('message') or (reply or {}).get('reason', '')}"
        if code == 409:
            raise Conflict(message)
        if code == 422:
            raise Invalid(message)
        return reply


def secret_value(api: KubernetesApi, namespace: str, name: str, key: str) -> str | None:
    """One key of a Secret, decoded; None when the Secret or the key is not there."""
    found = api.request("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")
    value = ((found or {}).get("data") or {}).get(key)
    return None if value is None else base64.b64decode(value).decode()


class RayClusterControl:
    """The RayCluster's `spec.suspend` through a JSON merge patch sent with the resourceVersion it was
    read at (a concurrent write makes the API server answer 409, and the patch is made again from a
    fresh read), and its suspend state as KubeRay reports it.

    `spec.suspend` is the run lifecycle's field alone: the program never sets it, so a later
    `pulumi up` (server-side apply) leaves it as it is."""

    def __init__(self, api: KubernetesApi, namespace: str, ray_cluster: str) -> None:
        self.api, self.namespace, self.ray_cluster = api, namespace, ray_cluster

    @property
    def path(self) -> str:
        return f"/apis/ray.io/v1/namespaces/{self.namespace}/rayclusters/{self.ray_cluster}"

    def state(self) -> str:
        """`absent`, `suspended`, `suspending` (KubeRay deletes every pod, the head's included, and
        will not stop), `resuming` (suspend just cleared) or `running`."""
        found = self.api.request("GET", self.path)
        return cluster_state(found)

    def set_suspended(self, suspended: bool) -> bool:
        """Suspends (True) or resumes (False) the cluster; False when there is no RayCluster."""
        for _ in range(CAS_TRIES):
            found = self.api.request("GET", self.path)
            if found is None:
                return False
            if bool((found.get("spec") or {}).get("suspend")) == suspended:
                return True
            patch = {"metadata": {"resourceVersion": found["metadata"]["resourceVersion"]},
                     "spec": {"suspend": suspended}}
            try:
                self.api.request("PATCH", f"{self.path}?fieldManager={FIELD_MANAGER}", patch,
                                 content_type="application/merge-patch+json")
                return True
            except Conflict:
                continue
        raise Conflict(f"RayCluster {self.ray_cluster}: still changing after {CAS_TRIES} tries")


def cluster_state(found: dict[str, Any] | None) -> str:
    """A RayCluster's suspend state from its object (KubeRay 1.6.2's status conditions
    `RayClusterSuspending` and `RayClusterSuspended`, ray-operator/apis/ray/v1/raycluster_types.go)."""
    if found is None:
        return "absent"
    conditions = {c.get("type"): c.get("status") for c in (found.get("status") or {}).get("conditions") or []}
    if conditions.get("RayClusterSuspending") == "True":
        return "suspending"
    suspend = bool((found.get("spec") or {}).get("suspend"))
    if conditions.get("RayClusterSuspended") == "True":
        return "suspended" if suspend else "resuming"
    return "suspending" if suspend else "running"
