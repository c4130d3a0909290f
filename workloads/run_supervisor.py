"""The run supervisor: keeps a GRPO run going unattended and stops paying when it is done.

Runs in the cluster beside the Ray head (a Deployment on the CPU pool), reads its config from
a JSON file, and talks to the Ray job API of the head service and, through `ClusterControl`, to
the Kubernetes API. Standard library only, like the staging program. Its loop:

- the run failed because a GPU worker or its node went away (preemption, maintenance, hardware):
  wait until the Ray cluster is whole again, then submit the next attempt's submission id; verl
  resumes from the latest checkpoint (`trainer.resume_mode=auto`);
- the run failed by itself (config, OOM, code): retry at most `max_retries` times, waiting
  `backoff_s` and twice that each time after;
- the run's budget (`budget_s` since its first attempt) is spent: stop it. verl writes a last
  checkpoint first: every attempt carries the deadline in MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP,
  which verl's trainer reads to save before it is reached;
- the run ended (succeeded, stopped, out of retries, budget): scale the GPU workers to zero, so
  the GPU nodes scale down, unless `release_workers` is off.

Every decision is kept in the Ray job metadata of the attempt it submits (attempt, cause, reason,
budget deadline), where `verl-gke status` reads it, and in the state ConfigMap.
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

DEADLINE_ENV = "MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
"""verl's trainer saves a checkpoint when this epoch time is within one step (+60 s) of now."""
META_PREFIX = "verl-gke."
REQUEST_TIMEOUT_S = 30.0
LIVE = ("PENDING", "RUNNING")
"""Ray job states of a run that holds, or is about to hold, the GPUs."""
RELEASE_EVERY_S = 600.0
"""After the run, the release is applied again this often: an update of the RayCluster by Pulumi
(which owns it) may bring the workers back."""


@dataclass(frozen=True)
class Capacity:
    """What the head sees: GPU workers alive, GPUs among them, and nodes it lost. The one count
    the job provider's readiness gate, `verl-gke status` and the supervisor share."""

    workers: int
    gpus: float
    dead: int

    def short_of(self, workers: int, gpus: float) -> str:
        """'' when whole, else what is missing, e.g. '1 of 2 GPU workers, 8 of 16 GPUs'."""
        if self.workers >= workers and self.gpus >= gpus:
            return ""
        return f"{self.workers} of {workers} GPU workers, {self.gpus:g} of {gpus:g} GPUs"


@dataclass(frozen=True)
class SupervisorConfig:
    """What the program gives the supervisor (the JSON file in its ConfigMap)."""

    head_url: str
    submission_ids: list[str]
    """Attempt 0 (submitted by `pulumi up`), then one id per later attempt, as the program computes them."""
    entrypoint: str
    runtime_env: dict[str, Any]
    expected_workers: int
    expected_gpus: int
    max_retries: int = 2
    max_preemptions: int = 10
    backoff_s: float = 120.0
    budget_s: float = 0.0
    """Run time from the first attempt's start after which the run is stopped (0: none)."""
    budget_grace_s: float = 900.0
    """How long past the deadline verl may take to write its last checkpoint before the stop."""
    release_workers: bool = True
    settle_s: float = 60.0
    """After a failure, how long to let the head notice lost nodes before judging the cause."""
    capacity_timeout_s: float = 7200.0
    """How long to wait for a whole cluster after a lost node before giving up on the run."""
    poll_s: float = 15.0

    @classmethod
    def from_file(cls, path: Path) -> SupervisorConfig:
        return cls(**json.loads(path.read_text()))


class ClusterControl(Protocol):
    """The supervisor's only way into Kubernetes."""

    def set_workers(self, replicas: int) -> None:
        """The RayCluster's GPU worker group to `replicas` (0 releases the GPU nodes)."""

    def record(self, state: Mapping[str, Any]) -> None:
        """Keep the supervisor's state where operators read it."""


class KubernetesControl:
    """ClusterControl through the Kubernetes API with the pod's service account: JSON merge
    patches of one RayCluster's worker group and of one ConfigMap, nothing else (its Role allows
    no more)."""

    def __init__(self, api_url: str, token: str | Path, namespace: str, ray_cluster: str, worker_group: str,
                 state_config_map: str, ca_file: str | None = None) -> None:
        self.api_url, self.token, self.namespace = api_url.rstrip("/"), token, namespace
        self.ray_cluster, self.worker_group, self.state_config_map = ray_cluster, worker_group, state_config_map
        self.context = ssl.create_default_context(cafile=ca_file) if ca_file else None

    @classmethod
    def in_cluster(cls, namespace: str, ray_cluster: str, worker_group: str, state_config_map: str) -> KubernetesControl:
        account = Path("/var/run/secrets/kubernetes.io/serviceaccount")
        # The token file, read at every request: kubelet rotates the token.
        return cls("https://kubernetes.default.svc", account / "token", namespace,
                   ray_cluster, worker_group, state_config_map, str(account / "ca.crt"))

    def set_workers(self, replicas: int) -> None:
        # A merge patch replaces the whole list: read the group list and change only our group.
        path = f"/apis/ray.io/v1/namespaces/{self.namespace}/rayclusters/{self.ray_cluster}"
        groups = self._request("GET", path)["spec"]["workerGroupSpecs"]
        for group in groups:
            if group.get("groupName") == self.worker_group:
                group.update(replicas=replicas, minReplicas=replicas)
        self._request("PATCH", path, {"spec": {"workerGroupSpecs": groups}})

    def record(self, state: Mapping[str, Any]) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/configmaps/{self.state_config_map}"
        self._request("PATCH", path, {"data": {"state.json": json.dumps(state, sort_keys=True)}})

    def _request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        token = self.token.read_text().strip() if isinstance(self.token, Path) else self.token
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/merge-patch+json"
            path += "?fieldManager=verl-gke-run-supervisor"
        request = urllib.request.Request(self.api_url + path, data=data, method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S, context=self.context) as response:
            return json.load(response)


class RayJobs:
    """The head's job and state REST API (what ray.job_submission wraps), each call bounded."""

    def __init__(self, url: str, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            return json.load(response)

    def jobs(self) -> dict[str, dict[str, Any]]:
        return {job["submission_id"]: job for job in self._call("GET", "/api/jobs/") if job.get("submission_id")}

    def submit(self, submission_id: str, entrypoint: str, runtime_env: dict[str, Any], metadata: dict[str, str]) -> None:
        self._call("POST", "/api/jobs/", {"submission_id": submission_id, "entrypoint": entrypoint,
                                          "runtime_env": runtime_env, "metadata": metadata})

    def stop(self, submission_id: str) -> None:
        self._call("POST", f"/api/jobs/{urllib.parse.quote(submission_id)}/stop")

    def capacity(self) -> Capacity:
        """The head's nodes: GPU workers are alive non-head nodes with GPUs (the head's own resources
        are not a worker's)."""
        reply = self._call("GET", f"/api/v0/nodes?limit=10000&timeout={max(1, int(self.timeout_s))}")
        nodes = reply["data"]["result"]["result"]
        alive = [n for n in nodes if n.get("state") == "ALIVE"]
        gpus = [float((n.get("resources_total") or {}).get("GPU", 0)) for n in alive if not n.get("is_head_node")]
        return Capacity(workers=sum(1 for g in gpus if g > 0), gpus=float(sum(gpus)), dead=len(nodes) - len(alive))


@dataclass
class Supervisor:
    config: SupervisorConfig
    ray: RayJobs
    control: ClusterControl
    log: Callable[[str], None] = print
    clock: Callable[[], float] = time.time
    done: str = ""
    """Why the run ended, once it has; the supervisor then only keeps the workers released."""
    decisions: list[str] = field(default_factory=list)
    workers_restored: bool = False
    released_at: float = 0.0
    known_deadline: float | None = None
    last_index: int | None = None
    """The newest attempt seen: a head that comes back without it lost its job table (a restart)."""

    def step(self) -> None:
        """One look at the run, and what it calls for."""
        jobs = self.ray.jobs()
        attempts = [(i, jobs[sid]) for i, sid in enumerate(self.config.submission_ids) if sid in jobs]
        if not attempts and self.last_index is not None and not self.done:
            # The head restarted and forgot its jobs (no GCS fault tolerance): the run is gone.
            self._decide(f"the head no longer knows attempt {self.last_index}: it restarted; resubmitting")
            if self.last_index + 1 >= len(self.config.submission_ids):
                return self._finish("no submission id left after a head restart", [])
            if self._await_whole():
                self._submit(self.last_index + 1, "node-lost", "the Ray head restarted and lost the run",
                             self.known_deadline)
            return
        if not attempts:
            # A new run is coming (`pulumi up` submits attempt 0 once the workers joined): bring
            # back workers an earlier run's end released.
            if not self.workers_restored:
                self.control.set_workers(self.config.expected_workers)
                self.workers_restored = True
            return
        index, job = attempts[-1]
        self.last_index = index
        status = job["status"]
        deadline = self.known_deadline = self._deadline(attempts[0][1])
        if status in LIVE:
            self.done = ""
            if deadline and self.clock() >= deadline + self.config.budget_grace_s:
                self._decide(f"budget of {self.config.budget_s:g} s spent: stopping {job['submission_id']}")
                self.ray.stop(job["submission_id"])
                self._finish("budget spent", attempts)
            return
        if self.done:
            if self.config.release_workers and self.clock() - self.released_at >= RELEASE_EVERY_S:
                self.control.set_workers(0)
                self.released_at = self.clock()
            return
        if status == "SUCCEEDED":
            return self._finish("succeeded", attempts)
        if status == "STOPPED":
            return self._finish("stopped", attempts)
        self._after_failure(index, job, attempts, deadline)

    def _after_failure(self, index: int, job: dict[str, Any], attempts: list[tuple[int, dict[str, Any]]],
                       deadline: float | None) -> None:
        time.sleep(self.config.settle_s)
        capacity = self.ray.capacity()
        whole = not self._short_of(capacity)
        message = (job.get("message") or "").splitlines()[0] if job.get("message") else ""
        # A node went away: the cluster is short of workers, or the head lost a node since the
        # attempt started (an error text alone also fits a worker whose own code raised).
        dead_before = meta(job, "dead_nodes")
        lost = not whole or (dead_before != "" and capacity.dead > int(dead_before))
        causes = [meta(j, "cause") for _, j in attempts[1:]]
        if index + 1 >= len(self.config.submission_ids):
            return self._finish(f"no submission id left after {index + 1} attempts", attempts)
        if deadline and self.clock() >= deadline:
            return self._finish("budget spent", attempts)
        if lost:
            if causes.count("node-lost") >= self.config.max_preemptions:
                return self._finish(f"lost nodes {self.config.max_preemptions} times", attempts)
            self._decide(f"{job['submission_id']} failed with a GPU worker gone ({capacity.workers} of "
                         f"{self.config.expected_workers} workers alive): waiting for the cluster to be whole")
            if not self._await_whole():
                return self._finish("the cluster did not become whole again", attempts)
            cause = "node-lost"
        else:
            retries = causes.count("run-failed")
            if retries >= self.config.max_retries:
                return self._finish(f"failed by itself {retries + 1} times: {message}", attempts)
            wait = self.config.backoff_s * 2 ** retries
            self._decide(f"{job['submission_id']} failed by itself ({message}); retry {retries + 1} of "
                         f"{self.config.max_retries} in {wait:g} s")
            time.sleep(wait)
            cause = "run-failed"
        self._submit(index + 1, cause, f"after {job['submission_id']}: {message}"[:500], deadline)

    def _submit(self, index: int, cause: str, reason: str, deadline: float | None) -> None:
        submission_id = self.config.submission_ids[index]
        runtime_env, metadata = attempt_submission(
            self.config.runtime_env, {"attempt": str(index), "cause": cause, "reason": reason,
                                      "dead_nodes": str(self.ray.capacity().dead)}, deadline)
        self.ray.submit(submission_id, self.config.entrypoint, runtime_env, metadata)
        self.last_index = index
        self._decide(f"submitted {submission_id} (attempt {index}, {cause})")

    def _await_whole(self) -> bool:
        give_up = self.clock() + self.config.capacity_timeout_s
        while self.clock() < give_up:
            try:
                if not self._short_of(self.ray.capacity()):
                    return True
            except (OSError, urllib.error.URLError, KeyError, ValueError):
                pass  # a head that is itself restarting
            time.sleep(self.config.poll_s)
        return False

    def _short_of(self, capacity: Capacity) -> str:
        return capacity.short_of(self.config.expected_workers, self.config.expected_gpus)

    def _deadline(self, first: dict[str, Any]) -> float | None:
        """The budget's end: from the first attempt's metadata, else its start plus the budget."""
        recorded = meta(first, "budget_deadline")
        if recorded:
            return float(recorded)
        if not self.config.budget_s or not first.get("start_time"):
            return None
        return first["start_time"] / 1000 + self.config.budget_s

    def _finish(self, why: str, attempts: list[tuple[int, dict[str, Any]]]) -> None:
        # `done` only once the release went through: a failed patch is tried again next step.
        if self.config.release_workers:
            self.control.set_workers(0)
            self.released_at = self.clock()
            self._decide(f"run ended ({why}): GPU workers released")
        else:
            self._decide(f"run ended ({why}): GPU workers kept (releaseWorkers off)")
        self.done = why
        self.control.record({"done": why, "attempts": [j["submission_id"] for _, j in attempts],
                             "decisions": self.decisions[-20:]})

    def _decide(self, decision: str) -> None:
        self.decisions.append(decision)
        self.log(f"run supervisor: {decision}")


def attempt_submission(runtime_env: Mapping[str, Any], record: Mapping[str, str],
                       deadline: float | None) -> tuple[dict[str, Any], dict[str, str]]:
    """The runtime env and Ray job metadata an attempt is submitted with (by `pulumi up` or by the
    supervisor): `record` under META_PREFIX, and the budget's deadline in both (verl checkpoints
    before it; the supervisor stops the run at it)."""
    env = json.loads(json.dumps(dict(runtime_env)))
    metadata = {f"{META_PREFIX}{key}": value for key, value in record.items()}
    if deadline:
        env.setdefault("env_vars", {})[DEADLINE_ENV] = str(int(deadline))
        metadata[f"{META_PREFIX}budget_deadline"] = str(int(deadline))
    return env, metadata


def meta(job: Mapping[str, Any], key: str) -> str:
    return str((job.get("metadata") or {}).get(META_PREFIX + key, ""))


def run_forever(supervisor: Supervisor) -> None:
    """Steps until killed; a head that does not answer is waited for, never a reason to act."""
    while True:
        try:
            supervisor.step()
        except (OSError, urllib.error.URLError, KeyError, ValueError) as error:
            supervisor.log(f"run supervisor: head or API unreachable, retrying: {error}")
        time.sleep(supervisor.config.poll_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--ray-cluster", required=True)
    parser.add_argument("--worker-group", required=True)
    parser.add_argument("--state-config-map", required=True)
    args = parser.parse_args(argv)
    config = SupervisorConfig.from_file(args.config)
    control = KubernetesControl.in_cluster(args.namespace, args.ray_cluster, args.worker_group, args.state_config_map)
    run_forever(Supervisor(config, RayJobs(config.head_url), control, log=lambda line: print(line, flush=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
