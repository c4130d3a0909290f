"""Who decides for the runs of one RayCluster: a coordination.k8s.io/v1 Lease `<cluster>-decider`.

Standard library only: it ships into the cluster with the run supervisor. Expiry is judged the way
client-go's leader election judges it (k8s.io/client-go/tools/leaderelection), without comparing
clocks: an observer notes on its own monotonic clock when it first saw the Lease's current
resourceVersion, and the Lease is expired for it once that version has not changed for
leaseDurationSeconds. `renewTime` is written for people only. The holder acts only while
`monotonic() < last renew sent + LEASE_DURATION_S - DECIDE_MARGIN_S`, so its last action lands
before any observer may take over (docs/run-lifecycle.md justifies the constants).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from workloads.kube import REQUEST_TIMEOUT_S, Conflict, KubernetesApi

LEASE_DURATION_S = 90.0
RENEW_EVERY_S = 15.0
DECIDE_MARGIN_S = REQUEST_TIMEOUT_S + 5.0
"""One request's timeout (an action checked in time lands within it) and 5 s for clock rates."""
LEASE_WAIT_S = 300.0
"""How long `pulumi up` waits for the Lease: a live supervisor hands over within a step, a dead
holder's Lease expires within LEASE_DURATION_S of the last change seen."""
HANDOVER_ANNOTATION = "verl-gke/handover-to"
UNANSWERED_ANNOTATION = "verl-gke/unanswered-s"
"""The holder's count of "no record and a head that does not answer" (seconds), carried in the Lease so
that the next holder (a re-acquire, a `pulumi up` hand-over, a restart) counts on from it."""
PULUMI_UP, SUPERVISOR = "pulumi-up", "supervisor"


class LeaseLost(Exception):
    """The holder could not renew in time: it must not act any more."""


def identity(role: str) -> str:
    return f"{role}/{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


def _micro_time(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(now))


class Lease:
    """The cluster's decider Lease as one process sees it."""

    def __init__(self, api: KubernetesApi, namespace: str, ray_cluster: str, holder: str,
                 clock: Callable[[], float] = time.monotonic, log: Callable[[str], None] = print) -> None:
        self.api, self.namespace, self.name = api, namespace, f"{ray_cluster}-decider"
        self.holder, self.clock, self.log = holder, clock, log
        self._renewed_at: float | None = None
        """Monotonic time the last successful acquire or renew was sent."""
        self._seen: tuple[str, float] | None = None
        """(resourceVersion, when this process first saw it)."""
        self.acquired = 0
        """How many times this process took the Lease (the decider resets its timers' baseline)."""
        self.annotations: dict[str, str] = {}
        """The Lease's annotations as last read or written."""
        self.carry: dict[str, str] = {}
        """Annotations the holder sets at its next write of the Lease ('' removes one)."""

    @property
    def role(self) -> str:
        return self.holder.split("/", 1)[0]

    @property
    def _path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"

    def valid(self) -> bool:
        """Whether this process may act now."""
        return self._renewed_at is not None and self.clock() < self._renewed_at + LEASE_DURATION_S - DECIDE_MARGIN_S

    def check(self) -> None:
        """Right before an action: LeaseLost unless this process may act by its clock and the Lease, read
        back (one GET), is still its own. Fencing: a deleted (`kubectl delete lease`) or taken Lease stops
        the holder at its next action, not when its own clock runs out."""
        if self.valid():
            found = self._read()
            if found is not None and (found.get("spec") or {}).get("holderIdentity") == self.holder:
                return
            self._renewed_at = None
        raise LeaseLost(f"{self.holder} no longer holds Lease {self.name}")

    def _read(self) -> dict[str, Any] | None:
        found = self.api.request("GET", f"{self._path}/{self.name}")
        if found is not None:
            self.annotations = dict((found.get("metadata") or {}).get("annotations") or {})
            version = found["metadata"]["resourceVersion"]
            if self._seen is None or self._seen[0] != version:
                self._seen = (version, self.clock())
        return found

    def _expired(self, found: dict[str, Any]) -> bool:
        spec = found.get("spec") or {}
        if not spec.get("holderIdentity"):
            return True
        assert self._seen is not None
        return self.clock() - self._seen[1] >= float(spec.get("leaseDurationSeconds") or LEASE_DURATION_S)

    def _write(self, found: dict[str, Any] | None, holder: str, annotations: dict[str, str] | None = None,
               transition: bool = False, renew: bool = True) -> bool:
        """A compare-and-swap write of the Lease; True when it went through. The time it was sent is
        the holder's baseline."""
        sent = self.clock()
        now = time.time()
        spec = dict((found or {}).get("spec") or {})
        spec.update(holderIdentity=holder, leaseDurationSeconds=int(LEASE_DURATION_S))
        if renew:
            spec["renewTime"] = _micro_time(now)
        if transition:
            spec.update(acquireTime=_micro_time(now), leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1)
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace,
                                "labels": {"app.kubernetes.io/name": "verl-gke",
                                           "app.kubernetes.io/component": "run-decider"}}
        old_annotations = dict(((found or {}).get("metadata") or {}).get("annotations") or {})
        meta["annotations"] = old_annotations if annotations is None else annotations
        if holder == self.holder and holder:
            meta["annotations"].update(self.carry)
            meta["annotations"] = {k: v for k, v in meta["annotations"].items() if v}
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}
        try:
            if found is None:
                reply = self.api.request("POST", self._path, body)
            else:
                meta["resourceVersion"] = found["metadata"]["resourceVersion"]
                reply = self.api.request("PUT", f"{self._path}/{self.name}", body)
        except Conflict:
            return False
        if reply is None:
            return False  # deleted meanwhile: the next look creates it
        self._seen = (reply["metadata"]["resourceVersion"], self.clock())
        self.annotations = dict((reply.get("metadata") or {}).get("annotations") or {})
        if holder == self.holder:
            if transition:
                self.acquired += 1
            self._renewed_at = sent
        return True

    def hold(self) -> bool:
        """The supervisor's step: renew when held (handing over to a requester instead), take it when
        free or expired; True when this process may decide now."""
        found = self._read()
        if found is None:
            return self._write(None, self.holder, transition=True) and self.valid()
        spec = found.get("spec") or {}
        annotations = (found.get("metadata") or {}).get("annotations") or {}
        requester = annotations.get(HANDOVER_ANNOTATION, "")
        if spec.get("holderIdentity") == self.holder:
            if requester and requester != self.holder:
                rest = {k: v for k, v in annotations.items() if k != HANDOVER_ANNOTATION}
                if self._write(found, requester, annotations=rest, transition=True):
                    self.log(f"run decider: Lease {self.name} handed over to {requester}")
                self._renewed_at = None
                return False
            if self._renewed_at is not None and self.clock() < self._renewed_at + RENEW_EVERY_S and self.valid():
                return True
            return self._write(found, self.holder) and self.valid()
        self._renewed_at = None
        if requester and requester != self.holder and not self._expired(found):
            return False  # `pulumi up` is taking it: not this step's
        if self._expired(found):
            taken = self._write(found, self.holder, transition=True)
            if taken:
                self.log(f"run decider: {self.holder} took Lease {self.name} "
                         f"(from {spec.get('holderIdentity') or 'nobody'})")
            return taken and self.valid()
        return False

    def renew(self) -> bool:
        found = self._read()
        if found is None or (found.get("spec") or {}).get("holderIdentity") != self.holder:
            self._renewed_at = None
            return False
        return self._write(found, self.holder)

    def acquire(self, wait_s: float = LEASE_WAIT_S, poll_s: float = 1.0,
                sleep: Callable[[float], None] = time.sleep) -> None:
        """`pulumi up`'s: asks the holder to hand over (or waits for its expiry) until it holds the
        Lease; TimeoutError naming the holder after `wait_s`."""
        for _ in self.acquiring(wait_s):
            sleep(poll_s)

    def acquiring(self, wait_s: float = LEASE_WAIT_S) -> Iterator[str]:
        """acquire's steps: yields while it waits (the caller sleeps, or a test interleaves)."""
        give_up = self.clock() + wait_s
        said = ""
        while True:
            found = self._read()
            spec = (found or {}).get("spec") or {}
            holder = spec.get("holderIdentity") or ""
            if found is None or holder == self.holder or self._expired(found):
                if self._write(found, self.holder, annotations=self._without_request(found),
                               transition=holder != self.holder):
                    return
                yield "lost a race for the Lease"
                continue
            annotations = (found.get("metadata") or {}).get("annotations") or {}
            if annotations.get(HANDOVER_ANNOTATION) != self.holder:
                # The request only: the holder's renewTime is its own.
                self._write(found, holder, annotations={**annotations, HANDOVER_ANNOTATION: self.holder}, renew=False)
                yield "asked for the Lease"
                continue
            waiting = f"waiting for {holder} to hand over Lease {self.namespace}/{self.name} (or for it to expire)"
            if waiting != said:
                self.log(waiting)
                said = waiting
            if self.clock() >= give_up:
                raise TimeoutError(f"Lease {self.namespace}/{self.name} is still held by {holder} after {wait_s:g} s: "
                                   "its holder neither handed it over nor stopped renewing it")
            yield "waiting for the Lease"

    def _without_request(self, found: dict[str, Any] | None) -> dict[str, str]:
        annotations = dict(((found or {}).get("metadata") or {}).get("annotations") or {})
        if annotations.get(HANDOVER_ANNOTATION) == self.holder:
            del annotations[HANDOVER_ANNOTATION]
        return annotations

    def release(self) -> None:
        """Leaves the Lease free (the supervisor takes it at its next step); best effort: an unreleased
        Lease expires."""
        self._renewed_at = None
        try:
            found = self._read()
            if found is not None and (found.get("spec") or {}).get("holderIdentity") == self.holder:
                self._write(found, "", annotations=self._without_request(found))
        except Exception as error:  # noqa: BLE001 - it expires on its own
            self.log(f"run decider: Lease {self.name} not released ({error}); it expires in {LEASE_DURATION_S:g} s")

    @contextmanager
    def renewing(self, every_s: float = RENEW_EVERY_S) -> Iterator[None]:
        """Renews from a background thread while the block runs, then releases the Lease."""
        done = threading.Event()

        def renew() -> None:
            while not done.wait(every_s):
                try:
                    self.renew()
                except Exception as error:  # noqa: BLE001 - the next renew tries again; valid() bounds acting
                    self.log(f"run decider: renewing Lease {self.name} failed: {error}")

        thread = threading.Thread(target=renew, daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(timeout=REQUEST_TIMEOUT_S)
            self.release()


class HeldLease:
    """Without a Kubernetes API (the provider given only `dashboard_url`, tests): always held."""

    holder = f"{PULUMI_UP}/memory"
    role = PULUMI_UP
    acquired = 1
    annotations: dict[str, str] = {}
    carry: dict[str, str] = {}

    def valid(self) -> bool:
        return True

    def check(self) -> None:
        pass

    def hold(self) -> bool:
        return True

    def acquire(self, *_args: Any, **_kwargs: Any) -> None:
        pass

    def acquiring(self, *_args: Any) -> Iterator[str]:
        yield from ()

    def renew(self) -> bool:
        return True

    def release(self) -> None:
        pass

    @contextmanager
    def renewing(self, every_s: float = RENEW_EVERY_S) -> Iterator[None]:
        yield
