"""The run supervisor: keeps a GRPO run going unattended and stops paying when it is done.

Runs in the cluster beside the Ray head (a Deployment on the CPU pool), reads its config from a JSON
file, and talks to the Ray job API of the head service and to the Kubernetes API. Standard library
only; it ships with workloads/run_lifecycle.py, whose run record (a ConfigMap written by
compare-and-swap) is its only memory: each step reads the record, so a restarted supervisor goes
on where the last one stopped. Each step:

- the run ended (its outcome is in the record): make sure the GPU workers are released, nothing else,
  whatever the head says (a head restarted after the end knows no jobs: that is no new run). The
  release suspends the RayCluster (`spec.suspend`, a field only the supervisor writes): KubeRay
  deletes its pods, the head's too, and a later `pulumi up` does not bring them back;
- the budget (`budget_s` from the first attempt's claim) is spent: stop the live attempt and end the
  run. verl's legacy trainer writes a last checkpoint before: every attempt carries the deadline in
  MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP;
- the newest attempt failed because a GPU worker or its node went away (preemption, maintenance,
  hardware), or the head restarted and lost it: once the cluster is whole again (within
  `capacity_timeout_s`, else the run ends), claim and submit the next attempt; verl resumes from the
  run's latest checkpoint (`trainer.resume_mode=auto`);
- it failed by itself (config, OOM, code): retry at most `max_retries` times after a capped
  backoff, never after the deadline;
- it succeeded or was stopped: end the run and release the workers (unless `release_workers` is off).
  A run that succeeded is first merged into a Hugging Face model (`export`, workloads/export_model.py)
  while the GPU workers are still up: a 32B model's merge needs some 260 GB of memory, which only a GPU
  worker node has. The export is claimed in the record (one owner, a deterministic submission id that
  Ray refuses twice), bounded by `export_timeout_s`, and its outcome recorded; a failed one is recorded
  and the workers are released all the same;
- the record holds an older jobAttempt of the run (a bump's `pulumi up` failed after deploying this
  supervisor, before its job's replace began the new generation): watch it without resubmitting or
  resuming anything, then end it and release the workers.

An error in a step (the head or the API unreachable, a truncated reply) is logged and the step is
tried again after a capped backoff.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from workloads import export_model
from workloads.run_lifecycle import (  # noqa: F401 - DEADLINE_ENV, Capacity, attempt_submission, meta: re-exported
    CLAIM_GRACE_S,
    DEADLINE_ENV,
    DEPLOY_FAILED,
    LIVE,
    SUCCEEDED,
    Attempt,
    Backoff,
    Capacity,
    ConfigMapRecords,
    KubernetesApi,
    RayJobs,
    RecordStore,
    RunRecord,
    attempt_submission,
    claim,
    claim_export,
    end,
    end_export,
    meta,
    submit_claimed,
)

MAX_BACKOFF_S = 1800.0
"""The longest wait between two retries of a run that failed by itself, and after a failed step."""
FIELD_MANAGER = "verl-gke-run-supervisor"
CAPACITY_TIMEOUT_S = 7200.0
"""The supervisor's wait for a whole cluster unless the stack's readiness timeout asks for longer."""


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
    """The run (domain/run_identity.py): its record in the run record ConfigMap."""
    generation: int = 0
    """verl-gke:jobAttempt of these submission ids."""
    max_retries: int = 2
    max_preemptions: int = 10
    backoff_s: float = 120.0
    budget_s: float = 0.0
    """Run time from the first attempt's claim after which the run is stopped (0: none)."""
    budget_grace_s: float = 900.0
    """How long past the deadline verl may take to write its last checkpoint before the stop."""
    release_workers: bool = True
    settle_s: float = 60.0
    """After a failure, how long to let the head notice lost nodes before judging the cause."""
    capacity_timeout_s: float = CAPACITY_TIMEOUT_S
    """How long to wait for a whole cluster before the next attempt, or for `pulumi up` to claim a
    begun run's attempt 0; past it the run ends."""
    poll_s: float = 15.0
    export: dict[str, Any] | None = None
    """The model export of a run that succeeded: export_model.submission's checkpoint_dir, mount,
    memory_bytes, verl_dir and python (None: verl-gke:exportModel is off)."""
    export_timeout_s: float = export_model.MERGE_TIMEOUT_S
    """How long from its claim the export may take before it is stopped and recorded as failed."""

    @classmethod
    def from_file(cls, path: Path) -> SupervisorConfig:
        return cls(**json.loads(path.read_text()))


class ClusterControl(Protocol):
    """The supervisor's only write outside its record."""

    def set_released(self, released: bool) -> None:
        """Suspend the RayCluster (True: KubeRay deletes its pods, head and GPU workers, and GKE's
        autoscaler removes the idle GPU nodes) or resume it (False)."""


class KubernetesControl:
    """ClusterControl through the Kubernetes API: a JSON merge patch of one RayCluster's
    `spec.suspend`, sent with the resourceVersion it was read at (a concurrent write makes the API
    server answer 409 and the patch is made again from a fresh read).

    `spec.suspend` is the supervisor's field alone: the program never sets it, so a later
    `pulumi up` (server-side apply) leaves it as it is, while the worker group list, which the
    KubeRay CRD makes one atomic field, stays Pulumi's."""

    def __init__(self, api: KubernetesApi, namespace: str, ray_cluster: str) -> None:
        self.api, self.namespace, self.ray_cluster = api, namespace, ray_cluster

    def set_released(self, released: bool) -> None:
        from workloads.run_lifecycle import CAS_TRIES, Conflict

        path = f"/apis/ray.io/v1/namespaces/{self.namespace}/rayclusters/{self.ray_cluster}"
        for _ in range(CAS_TRIES):
            found = self.api.request("GET", path)
            if found is None:
                return  # no RayCluster: nothing to release or resume
            if bool(found.get("spec", {}).get("suspend")) == released:
                return  # already so: no write
            patch = {"metadata": {"resourceVersion": found["metadata"]["resourceVersion"]},
                     "spec": {"suspend": released}}
            try:
                self.api.request("PATCH", f"{path}?fieldManager={FIELD_MANAGER}", patch,
                                 content_type="application/merge-patch+json")
                return
            except Conflict:
                continue
        raise Conflict(f"RayCluster {self.ray_cluster}: still changing after {CAS_TRIES} tries")


@dataclass
class Supervisor:
    config: SupervisorConfig
    ray: RayJobs
    control: ClusterControl
    records: RecordStore
    log: Callable[[str], None] = print
    clock: Callable[[], float] = time.time
    workers_restored: bool = False
    failures: Backoff = field(default_factory=lambda: Backoff(5.0, MAX_BACKOFF_S))

    @property
    def done(self) -> str:
        """Why the run ended, '' while it has not (read from the record)."""
        record = self.records.get(self.config.run_id)
        return record.outcome if record and record.generation == self.config.generation else ""

    def step(self) -> None:
        """One look at the run, and what it calls for."""
        now = self.clock()
        record = self.records.get(self.config.run_id)
        if record is None:
            # This run has not begun: `pulumi up` begins it, resumes a released cluster and claims
            # attempt 0 once the workers joined. Nothing to do: resuming now would hold GPUs for a
            # deploy that may never get that far.
            return
        if record.generation < self.config.generation:
            return self._superseded(record, now)
        if record.generation > self.config.generation:
            return  # a supervisor of an older spec, about to be replaced
        if record.outcome:
            return self._keep_released(record, now)
        self._restore_workers()
        attempt = record.newest
        if attempt is None:
            return self._unclaimed(record, now)
        if record.deadline and now >= record.deadline:
            return self._budget(record, attempt, now)
        job = self.ray.jobs().get(attempt.submission_id)
        if job is None:
            return self._absent(record, attempt, now)
        status = job["status"]
        if status in LIVE:
            return
        if status == "SUCCEEDED":
            return self._finish(record, SUCCEEDED)
        if status == "STOPPED":
            return self._finish(record, f"{attempt.submission_id} was stopped")
        self._after_failure(record, attempt, job, now)

    def _superseded(self, record: RunRecord, now: float) -> None:
        """An older jobAttempt's run, this generation not begun: `pulumi up` deploys this supervisor,
        then its job's replace ends the older run (delete) and begins this one (create). An up that
        failed in between, or before the replace, leaves the older run here, with no supervisor of its
        own: it is never resubmitted (its ids are not this config's) nor resumed, only watched until
        it ends, then its workers are released."""
        if record.outcome:
            return self._keep_released(record, now)
        attempt = record.newest
        if attempt is None:
            return self._finish(record, DEPLOY_FAILED)  # begun, never claimed: that up is over
        if record.deadline and now >= record.deadline:
            return self._budget(record, attempt, now)
        job = self.ray.jobs().get(attempt.submission_id)
        status = job["status"] if job else "lost"
        if status in LIVE or (job is None and not attempt.submitted and now - attempt.at < CLAIM_GRACE_S):
            return
        if status == "SUCCEEDED":
            return self._finish(record, SUCCEEDED)
        self._finish(record, f"jobAttempt {record.generation} ended under the supervisor of jobAttempt "
                             f"{self.config.generation}, which resubmits none of its attempts: "
                             f"{attempt.submission_id} {'was stopped' if status == 'STOPPED' else status}")

    def _unclaimed(self, record: RunRecord, now: float) -> None:
        """Begun by `pulumi up`, which claims attempt 0 after its gates (readiness, fabric check): a
        deploy that died before its claim must not hold the GPUs past capacity_timeout_s."""
        if record.waiting_since is None:
            self._decide(record, "run begun, waiting for `pulumi up` to claim attempt 0", waiting_since=now)
        elif now - record.waiting_since >= self.config.capacity_timeout_s:
            self._finish(record, DEPLOY_FAILED)

    def _absent(self, record: RunRecord, attempt: Attempt, now: float) -> None:
        """The head does not know the newest attempt: not submitted yet, or the head restarted."""
        if not attempt.submitted:
            if now - attempt.at < CLAIM_GRACE_S:
                return  # its claimer is submitting it
            # Its claimer died between the claim and the submission: submit it for the claimer.
            self._decide(record, f"attempt {attempt.index} was claimed but never submitted: submitting it")
            submit_claimed(self.ray, self.records, record, attempt, self.config.entrypoint, self.config.runtime_env)
            return
        self._next(record, attempt, now, "node-lost",
                   f"the Ray head no longer knows {attempt.submission_id}: it restarted")

    def _after_failure(self, record: RunRecord, attempt: Attempt, job: dict[str, Any], now: float) -> None:
        ended = (job.get("end_time") or 0) / 1000
        if now - ended < self.config.settle_s:
            return  # let the head notice lost nodes first
        message = (job.get("message") or "").splitlines()[0] if job.get("message") else ""
        capacity = self.ray.capacity()
        # A node went away: the cluster is short of workers, or the head lost a node since the
        # attempt was claimed (an error text alone also fits a worker whose own code raised).
        lost = bool(self._short_of(capacity)) or (attempt.dead_nodes is not None and capacity.dead > attempt.dead_nodes)
        reason = f"after {attempt.submission_id}: {message}"[:500]
        if lost:
            return self._next(record, attempt, now, "node-lost", reason)
        retries = sum(1 for a in record.attempts if a.cause == "run-failed")
        if retries >= self.config.max_retries:
            return self._finish(record, f"failed by itself {retries + 1} times: {message}")
        wait = min(MAX_BACKOFF_S, self.config.backoff_s * 2 ** retries)
        if now < ended + wait:
            return  # the backoff: the record and the job's end time carry it across restarts
        self._next(record, attempt, now, "run-failed", reason)

    def _next(self, record: RunRecord, after: Attempt, now: float, cause: str, reason: str) -> None:
        """The next attempt, once the cluster is whole (within capacity_timeout_s)."""
        index = after.index + 1
        if index >= len(self.config.submission_ids):
            return self._finish(record, f"no submission id left after {index} attempts")
        if cause == "node-lost":
            losses = sum(1 for a in record.attempts if a.cause == "node-lost")
            if losses >= self.config.max_preemptions:
                return self._finish(record, f"lost nodes {self.config.max_preemptions} times")
        capacity = self.ray.capacity()
        if short := self._short_of(capacity):
            since = record.waiting_since
            if since is None:
                self._decide(record, f"{reason}; waiting up to {self.config.capacity_timeout_s:g} s for a whole "
                                     f"cluster ({short})", waiting_since=now)
            elif now - since >= self.config.capacity_timeout_s:
                self._finish(record, f"the cluster was not whole within {self.config.capacity_timeout_s:g} s ({short})")
            return
        attempt = Attempt(index=index, submission_id=self.config.submission_ids[index], by="supervisor", at=now,
                          cause=cause, reason=reason, dead_nodes=capacity.dead)
        record, won = claim(self.records, self.config.run_id, attempt, self.config.budget_s)
        if not won:
            return  # `pulumi up` claimed it first: adopted, as the next step will see
        submit_claimed(self.ray, self.records, record, attempt, self.config.entrypoint, self.config.runtime_env)
        self.log(f"run supervisor: submitted {attempt.submission_id} (attempt {index}, {cause})")

    def _budget(self, record: RunRecord, attempt: Attempt, now: float) -> None:
        """Past the deadline: no new attempt; the live one is stopped after verl's grace to checkpoint."""
        job = self.ray.jobs().get(attempt.submission_id)
        if job is not None and job["status"] in LIVE:
            if now < (record.deadline or now) + self.config.budget_grace_s:
                return
            self.ray.stop(attempt.submission_id)
        self._finish(record, f"budget of {self.config.budget_s:g} s spent")

    def _short_of(self, capacity: Capacity) -> str:
        return capacity.short_of(self.config.expected_workers, self.config.expected_gpus)

    def _restore_workers(self) -> None:
        if not self.workers_restored and self.config.release_workers:
            self.control.set_released(False)
            self.workers_restored = True

    def _finish(self, record: RunRecord, why: str) -> None:
        # The outcome first (no one submits after it), then the release, then that it went through.
        record = end(self.records, self.config.run_id, why, self.clock(), generation=record.generation) or record
        self.log(f"run supervisor: run ended ({why})")
        self._keep_released(record, self.clock())

    def _keep_released(self, record: RunRecord, now: float) -> None:
        # Until the release is recorded. After it the RayCluster stays suspended (the program never
        # sets the field): no head to ask, and no write that could race a newer run's supervisor.
        if record.released or not self._exported(record, now) or not self.config.release_workers:
            return
        record = self.records.get(self.config.run_id) or record
        if not record.outcome:
            return  # `pulumi up` reopened the run since this step began
        # An export given up on is not waited for: Ray cannot stop a job whose driver never got a node
        # (it stays PENDING until its start timeout), and its merge publishes nothing half-written.
        if self._live_jobs(ignore={record.export_id} if record.export_outcome else set()):
            return
        self.control.set_released(True)
        self.workers_restored = False  # a reopened run gets them back
        released = self.records.update(self.config.run_id, lambda r: replace(r, released=True).decided(
            "GPU workers released", now) if r and r.outcome and not r.released else r)
        if released is not None and not released.outcome:
            # Reopened between the read and the suspend: the reopened run needs the cluster back.
            self._restore_workers()
            return
        self.log(f"run supervisor: GPU workers released ({record.outcome})")

    def _exported(self, record: RunRecord, now: float) -> bool:
        """Whether the model export is over (or none is due): a run that succeeded is merged before
        its workers go. Each step goes on from the record, so a restarted supervisor neither submits
        the export twice nor loses its time bound."""
        if self.config.export is None or record.outcome != SUCCEEDED or record.export_outcome:
            return True
        # The REST API takes no local working_dir (the SDK uploads it to the GCS first): export_model.py
        # is uploaded here the same way, a content-addressed package in the head's GCS, so nothing
        # besides this program (its ConfigMap) has to carry the merge program to the node.
        name, package = export_model.working_dir_package()
        job = export_model.submission(run_id=self.config.run_id, step=None, working_dir=f"gcs://{name}",
                                      **self.config.export)
        # The generation in the id: a later jobAttempt of the same run exports its own final model.
        submission_id = f"{job.pop('submission_id')}-{record.generation}"
        target = job["metadata"]["verl_gke_export"]
        if not record.export_id:
            record = claim_export(self.records, self.config.run_id, submission_id, target, now)
        started = record.export_at or now
        found = self.ray.jobs().get(record.export_id)
        status = found["status"] if found else ""
        if now - started >= self.config.export_timeout_s:
            if status in LIVE:
                self.ray.stop(record.export_id)
            return self._end_export(f"FAILED: not done within {self.config.export_timeout_s:g} s")
        if found is None:
            # Not submitted yet, or a restarted head forgot it (its driver died with it): submit.
            self.ray.upload_package(name, package)
            job["metadata"] = {**job["metadata"], "verl-gke.run_id": self.config.run_id}
            try:
                self.ray.submit(record.export_id, job.pop("entrypoint"), job.pop("runtime_env"), job.pop("metadata"),
                                **job)
            except urllib.error.HTTPError as error:
                error.close()
                if record.export_id in self.ray.jobs():
                    return False  # submitted meanwhile: Ray refuses an id twice
                if error.code >= 500:
                    raise  # the head is starting: the step is tried again
                return self._end_export(f"FAILED: the head refused the export ({error.code} {error.reason})")
            self.log(f"run supervisor: model export {record.export_id} submitted into {target}")
            return False
        if status in LIVE:
            return False
        if status == "SUCCEEDED":
            return self._end_export("SUCCEEDED")
        # Ray's message ends with the driver's last log line: export_model's one-line reason.
        message = (found.get("message") or "").strip().splitlines()
        return self._end_export(f"FAILED: {message[-1] if message else status}"[:500])

    def _end_export(self, outcome: str) -> bool:
        end_export(self.records, self.config.run_id, outcome, self.clock())
        self.log(f"run supervisor: model export {outcome}")
        return True

    def _live_jobs(self, ignore: set[str]) -> list[str]:
        """Jobs that hold the workers now, of any run (one an interrupted update left behind, whose
        second run was refused, say), but `ignore`: the release waits for them. A head that does not
        answer runs nothing that a release could break."""
        try:
            return [sid for sid, job in self.ray.jobs().items() if job.get("status") in LIVE and sid not in ignore]
        except Exception:  # noqa: BLE001 - unreachable or gone
            return []

    def _decide(self, record: RunRecord, decision: str, **changes: Any) -> None:
        now = self.clock()

        def change(current: RunRecord | None) -> RunRecord | None:
            if current is None or current.generation != record.generation:
                return None  # gone, or a newer generation began meanwhile: not this decision's
            return replace(current, **changes).decided(decision, now)

        self.records.update(self.config.run_id, change)
        self.log(f"run supervisor: {decision}")


def run_forever(supervisor: Supervisor, sleep: Callable[[float], None] = time.sleep, steps: int | None = None) -> None:
    """Steps until killed (or `steps` steps); an error in a step is logged and the step retried
    after a capped backoff: no error ends the supervisor."""
    count = 0
    while steps is None or count < steps:
        count += 1
        try:
            supervisor.step()
            supervisor.failures.reset()
            pause = supervisor.config.poll_s
        except Exception as error:  # noqa: BLE001 - any error of one step, e.g. http.client.IncompleteRead
            pause = max(supervisor.config.poll_s, supervisor.failures.next())
            last = traceback.format_exception_only(error)[-1].strip()
            supervisor.log(f"run supervisor: step failed, retrying in {pause:g} s: {last}")
        sleep(pause)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--ray-cluster", required=True)
    parser.add_argument("--run-record", required=True)
    args = parser.parse_args(argv)
    config = SupervisorConfig.from_file(args.config)
    api = KubernetesApi.in_cluster()
    control = KubernetesControl(api, args.namespace, args.ray_cluster)
    records = ConfigMapRecords(api, args.namespace, args.run_record)
    run_forever(Supervisor(config, RayJobs(config.head_url), control, records,
                           log=lambda line: print(line, flush=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
