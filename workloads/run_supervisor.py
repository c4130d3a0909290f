"""The run supervisor: keeps a GRPO run going unattended and stops paying when it is done.

A one-pod Deployment on the CPU pool, standard library only (shipped with run_lifecycle, run_record,
run_lease, kube and export_model). While it holds its RayCluster's Lease, each step (every `poll_s`)
reads the cluster's run records, the head's job table and `spec.suspend`, and applies
`run_lifecycle.decide` (the rules: docs/run-lifecycle.md). It keeps nothing in memory a restart needs,
writes only the observed part of the records, `spec.suspend` and its Lease, and exits once its
ConfigMap is no longer the stack's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import signal
import sys
import time
import traceback
import urllib.error
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from workloads import export_model
from workloads.kube import AUTH_TOKEN_KEY, KubernetesApi, RayClusterControl, secret_value
from workloads.run_lease import SUPERVISOR, Lease, identity
from workloads.run_lifecycle import Decider, Policy, RayJobs, submit_attempt, write_record
from workloads.run_logs import GcsSink, LogCopier, Sink
from workloads.run_record import Attempt, RecordStore, RunRecord

STEP_BACKOFF_CAP_S = 60.0
"""The longest wait after a failed step (a head outage after a preemption must not delay the
resubmission, the budget stop or the release by more)."""
CAPACITY_TIMEOUT_S = 7200.0
"""The wait for a whole cluster unless the stack's readiness timeout asks for longer."""
HEAD_OUTAGE_S = 1800.0
STALL_S = 10800.0
REPLACE_WINDOW_S = 600.0
SUPERVISOR_SUFFIX = "-supervisor"


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
    run_id: str = ""
    """The run the stack wants (domain/run_identity.py)."""
    generation: int = 0
    """verl-gke:jobAttempt of these submission ids."""
    max_retries: int = 2
    max_preemptions: int = 10
    backoff_s: float = 120.0
    budget_s: float = 0.0
    """Run time from the first attempt's claim after which the run is stopped (0: none)."""
    budget_grace_s: float = 900.0
    """How long past the budget verl may take to write its last checkpoint before the stop."""
    release_workers: bool = True
    settle_s: float = 60.0
    """After a failure, how long to let the head notice lost nodes before judging the cause."""
    capacity_timeout_s: float = CAPACITY_TIMEOUT_S
    head_outage_s: float = HEAD_OUTAGE_S
    """How long the head may not answer before a run is lost and released."""
    stall_s: float = STALL_S
    """A live attempt with no new training step for this long is stopped as a failure (0: never)."""
    replace_window_s: float = REPLACE_WINDOW_S
    """After a delete stopped the run, how long the GPUs stay for the replace's create."""
    poll_s: float = 15.0
    export: dict[str, Any] | None = None
    """The model export of a run that succeeded: export_model.submission's checkpoint_dir, mount,
    memory_bytes, verl_dir and python (None: verl-gke:exportModel is off)."""
    export_timeout_s: float = export_model.MERGE_TIMEOUT_S
    """How long from its claim the export may take before it is stopped and recorded as failed."""
    log_bucket: str = ""
    """The bucket whose `logs/<run id>/` gets each attempt's driver log and the decisions ('': no copy)."""
    ray_token_secret: str = ""
    """The Secret KubeRay keeps the head's Ray token in ('': the head has no token authentication)."""

    @classmethod
    def from_file(cls, path: Path) -> SupervisorConfig:
        return cls(**json.loads(path.read_text()))

    @property
    def policy(self) -> Policy:
        """The rules' limits: the fields both have, the ids, and whether an export is due."""
        shared = {f.name for f in fields(Policy)} & {f.name for f in fields(self)} - {"submission_ids", "export"}
        return Policy(**{name: getattr(self, name) for name in shared}, submission_ids=tuple(self.submission_ids),
                      export=self.export is not None)

    def export_job(self, run_id: str, generation: int) -> dict[str, Any] | None:
        """The export's Ray job for the run's `generation` (the generation in the id: a later
        jobAttempt of the same run exports its own final model); None when none is due for it."""
        if self.export is None or run_id != self.run_id:
            return None
        name, _ = export_model.working_dir_package()
        job = export_model.submission(run_id=run_id, step=None, working_dir=f"gcs://{name}", id_suffix=f"-{generation}",
                                      **self.export)
        job["metadata"] = {**job["metadata"], "verl-gke.run_id": run_id}
        return job


class TokenRayJobs(RayJobs):
    """The head's API with the Ray token of KubeRay's Secret. A RayCluster replacement (a new pool, a
    new bucket, `pulumi up --replace`) makes KubeRay write a new token into a new Secret of the same
    name (owned by the RayCluster; KubeRay v1.6.2 reconcileAuthSecret), while this pod's env keeps
    the old one. Ray refuses a request without a token with 401 and one with another token with 403
    (ray/_private/authentication/http_token_authentication.py, 2.60): then the Secret is read again and
    the request sent once more with its token."""

    def __init__(self, url: str, token: Callable[[], str | None]) -> None:
        super().__init__(url)
        self.token = token

    def send(self, method: str, path: str, data: bytes | None, content_type: str) -> tuple[bytes, str | None]:
        try:
            return super().send(method, path, data, content_type)
        except urllib.error.HTTPError as error:
            if error.code not in (401, 403):
                raise
            current = self.token()
            if not current or self._auth.get("Authorization") == f"Bearer {current}":
                raise  # the Secret holds the token that was refused, or none: no second try
            error.close()
            self._auth = {"Authorization": f"Bearer {current}"}
            return super().send(method, path, data, content_type)


@dataclass
class SupervisorHands:
    """The supervisor's actions: its attempts under the config's entrypoint, the export, the release."""

    config: SupervisorConfig
    ray: RayJobs
    control: Any
    """RayClusterControl (set_suspended)."""
    log: Callable[[str], None] = print
    copier: LogCopier | None = None
    records: RecordStore | None = None
    lease: Any = None

    def submit(self, record: RunRecord, attempt: Attempt) -> None:
        submit_attempt(self.ray, record, attempt, self.config.entrypoint, self.config.runtime_env,
                       check=self.lease.check)

    def submit_export(self, record: RunRecord) -> str:
        # The REST API takes no local working_dir (the SDK uploads it to the GCS first): export_model.py
        # is uploaded the same way, a content-addressed package in the head's GCS.
        job = self.config.export_job(record.run_id, record.generation)
        assert job is not None
        name, package = export_model.working_dir_package()
        self.ray.upload_package(name, package)
        try:
            self.ray.submit(job.pop("submission_id"), job.pop("entrypoint"), job.pop("runtime_env"),
                            job.pop("metadata"), **job)
        except urllib.error.HTTPError as error:
            error.close()
            if record.export_id in self.ray.jobs():
                return ""  # submitted before: Ray refuses an id twice
            if error.code >= 500:
                raise  # the head is starting: the step is tried again
            return f"{error.code} {error.reason}"
        self.log(f"run supervisor: model export {record.export_id} submitted into {record.export_target}")
        return ""

    def stop(self, submission_id: str) -> None:
        self.ray.stop(submission_id)

    def set_suspended(self, suspended: bool) -> bool:
        if suspended and self.copier is not None:
            self._flush_logs()
        return self.control.set_suspended(suspended)

    def _flush_logs(self) -> None:
        """The release takes the head and its logs: what is not in the bucket yet goes first, within
        the flush deadline; past it the release goes on and each released run's record says so."""
        assert self.copier is not None
        cut = self.copier.flush()
        if not cut:
            return
        self.log(f"run supervisor: {cut}; releasing all the same")
        if self.records is None:
            return
        for run_id, stored in self.records.list().items():
            record = stored.record
            if record is not None and record.released and not any(_CUT in d for d in record.decisions[-3:]):
                write_record(self.records, run_id, lambda r: None if r is None else r.decided(cut), self.lease)


_CUT = "log copy cut"


def decider(config: SupervisorConfig, api: KubernetesApi, namespace: str, ray_cluster: str,
            log: Callable[[str], None] = print, lease: Any = None, ray: RayJobs | None = None,
            control: Any = None, clock: Callable[[], float] = time.monotonic, sink: Sink | None = None) -> Decider:
    """The supervisor's decider for `ray_cluster`; its logs copied into `sink` (default: the config's
    log_bucket, if any)."""
    if ray is None and config.ray_token_secret:
        ray = TokenRayJobs(config.head_url,
                           lambda: secret_value(api, namespace, config.ray_token_secret, AUTH_TOKEN_KEY))
    ray = ray or RayJobs(config.head_url)
    control = control or RayClusterControl(api, namespace, ray_cluster)
    lease = lease or Lease(api, namespace, ray_cluster, identity(SUPERVISOR), clock=clock, log=log)
    records = RecordStore(api, namespace, ray_cluster)
    sink = sink or (GcsSink(config.log_bucket) if config.log_bucket else None)
    copier = None if sink is None else LogCopier(
        ray, sink, lambda: {k: s.record for k, s in records.list().items() if s.record is not None}, clock=clock, log=log)

    def export_ids(record: RunRecord) -> tuple[str, str] | None:
        job = config.export_job(record.run_id, record.generation)
        return None if job is None else (job["submission_id"], job["metadata"]["verl_gke_export"])

    return Decider(records=records, lease=lease, ray=ray,
                   hands=SupervisorHands(config, ray, control, log, copier, records, lease), cluster=control.state,
                   policy=config.policy,
                   export_ids=export_ids, clock=clock, log=log)


def program_digest(data: Mapping[str, str]) -> str:
    """Of the supervisor's ConfigMap data (program files and config): a rollout changes it."""
    return hashlib.sha256(json.dumps(dict(data), sort_keys=True).encode()).hexdigest()


@dataclass
class Freshness:
    """Whether this process still runs the stack's supervisor program and config."""

    api: KubernetesApi
    namespace: str
    name: str
    digest: str

    def stale(self) -> bool:
        found = self.api.request("GET", f"/api/v1/namespaces/{self.namespace}/configmaps/{self.name}")
        return found is not None and program_digest(found.get("data") or {}) != self.digest


@dataclass
class Backoff:
    """Capped exponential backoff for a loop that must go on after any error."""

    base_s: float
    cap_s: float
    failures: int = field(default=0)

    def next(self) -> float:
        self.failures += 1
        return min(self.cap_s, self.base_s * 2 ** (self.failures - 1))

    def reset(self) -> None:
        self.failures = 0


def step(decider: Decider) -> None:
    """One supervisor step: the decider's, then, while it decides, the log copy when one is due."""
    decided = decider.step()
    copier = getattr(decider.hands, "copier", None)
    if decided and copier is not None:
        copier.tick()


def run_forever(decider: Decider, poll_s: float, sleep: Callable[[float], None] = time.sleep,
                steps: int | None = None, stale: Callable[[], bool] = lambda: False) -> None:
    """Steps until killed (or `steps` steps, or the program is no longer the stack's); an error in a
    step is logged and the step retried after a short capped backoff: no error ends the supervisor."""
    failures = Backoff(5.0, STEP_BACKOFF_CAP_S)
    count = 0
    while steps is None or count < steps:
        count += 1
        try:
            if stale():
                decider.log("run supervisor: the stack's supervisor program or config changed: stepping down")
                release = getattr(decider.lease, "release", None)
                if release is not None:
                    release()
                return
            step(decider)
            failures.reset()
            pause = poll_s
        except Exception as error:  # noqa: BLE001 - any error of one step, e.g. http.client.IncompleteRead
            pause = max(poll_s, failures.next())
            last = traceback.format_exception_only(error)[-1].strip()
            decider.log(f"run supervisor: step failed, retrying in {pause:g} s: {last}")
        sleep(pause)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--ray-cluster", required=True)
    parser.add_argument("--program-dir", type=Path, required=True,
                        help="where the supervisor ConfigMap's keys are mounted (to notice a rollout)")
    args = parser.parse_args(argv)
    config = SupervisorConfig.from_file(args.config)
    api = KubernetesApi.in_cluster()
    log = lambda line: print(line, flush=True)  # noqa: E731
    files = {path.name: path.read_text() for path in (args.program_dir / "workloads").glob("*.py")}
    files[args.config.name] = args.config.read_text()
    fresh = Freshness(api, args.namespace, f"{args.ray_cluster}{SUPERVISOR_SUFFIX}", program_digest(files))
    supervisor = decider(config, api, args.namespace, args.ray_cluster, log=log)
    # A pod deleted (a rollout, a drain) leaves the Lease free at once instead of after its expiry.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        run_forever(supervisor, config.poll_s, stale=fresh.stale)
    finally:
        supervisor.lease.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())

