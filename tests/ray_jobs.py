"""An in-process stand-in for a Ray head's job table, fast enough for thousands of interleavings a
second: exactly the REST calls workloads/run_lifecycle.RayJobs makes, answered as Ray 2.60 answers them
(tests/test_ray_jobs_conformance.py compares it with a real head), raising what urllib raises.
Transitions happen when the test says (`tick`, `finish`, `restart`, `lose_worker`), not on a clock."""

# What the lifecycle depends on, and its source:
# - a submission id is used once: a second submission under it is refused with 500 (ray 2.60
#   dashboard/modules/job/job_manager.py `submit_job` raises "Job with submission_id ... already exists",
#   which job_head.py answers as an internal error; a real head answers 500 in the conformance test);
# - a job goes PENDING -> RUNNING -> SUCCEEDED, FAILED or STOPPED (ray/dashboard/modules/job/common.py,
#   JobStatus); a stop of a job that has ended answers {"stopped": false};
# - a head restarted without GCS fault tolerance knows no jobs, and their drivers died with it
#   (FIELD facts; a KubeRay head pod restart);
# - a lost node fails the attempt running on it, and the head reports the node DEAD.

from __future__ import annotations

import email.utils
import io
import json
import re
import time
import urllib.error
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from workloads.run_lifecycle import LIVE, RayJobs

FAILED_MESSAGE = "Job entrypoint command failed with exit code {code}, last available logs (truncated to 20,000 chars):"
STOPPED_MESSAGE = "Job was intentionally stopped."
SUCCEEDED_MESSAGE = "Job finished successfully."


@dataclass
class RayHeadStandIn:
    workers: int = 0
    gpus_per_worker: float = 0.0
    up: bool = True
    """False: the head does not answer (a network cut, a port-forward down, a pod restarting)."""
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    logs: dict[str, list[str]] = field(default_factory=dict)
    dead: int = 0
    now: float = field(default_factory=time.time)
    """The head's own clock (its `Date`, and the jobs' times): another machine's."""
    restarts: int = 0
    entrypoints_end: bool = False
    """True: an entrypoint ends as its command would (the conformance script's `sys.exit(N)`, a sleep,
    anything else at once); False: a job runs until the test ends it (`finish`, `lose_worker`)."""

    # --- what the test does to the head --------------------------------------------------------

    def tick(self) -> None:
        """One turn of the head: a pending driver starts; an entrypoint that ends does."""
        self.now += 1
        for sid, job in self.jobs.items():
            if job["status"] == "PENDING":
                job.update(status="RUNNING", start_time=int(self.now * 1000), driver_node_id="head-node",
                           message="Job is currently running.")
            elif job["status"] == "RUNNING" and self.entrypoints_end \
                    and (end := _entrypoint_end(job["entrypoint"])) is not None:
                self.finish(sid, *end)

    def finish(self, sid: str, status: str, code: int = 0) -> None:
        message = {"SUCCEEDED": SUCCEEDED_MESSAGE, "STOPPED": STOPPED_MESSAGE}.get(
            status, FAILED_MESSAGE.format(code=code))
        self.jobs[sid].update(status=status, end_time=int(self.now * 1000), message=message)

    def restart(self) -> None:
        """A head pod restart without GCS fault tolerance: it knows no jobs (their drivers died)."""
        self.jobs.clear()
        self.logs.clear()
        self.restarts += 1

    def lose_worker(self) -> None:
        """A GPU node preempted: the attempt on it fails, and the head counts a dead node."""
        if self.workers:
            self.workers -= 1
            self.dead += 1
        for sid, job in self.jobs.items():
            if job["status"] in LIVE:
                self.finish(sid, "FAILED", 1)

    def live(self) -> list[str]:
        return [sid for sid, job in self.jobs.items() if job["status"] in LIVE]

    # --- the REST API ----------------------------------------------------------------------------

    def handle(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        url = urllib.parse.urlsplit(path)
        query = urllib.parse.parse_qs(url.query)
        route = url.path
        if method == "GET" and route == "/api/jobs/":
            return 200, json.dumps(list(self.jobs.values())).encode()
        if method == "POST" and route == "/api/jobs/":
            request = json.loads(body or b"{}")
            sid = request["submission_id"]
            if sid in self.jobs:
                return 500, f"Job with submission_id {sid} already exists. Please use a different submission_id.".encode()
            self.jobs[sid] = {
                "type": "SUBMISSION", "job_id": None, "submission_id": sid, "status": "PENDING",
                "entrypoint": request["entrypoint"], "message": "Job has not started yet. It may be waiting for "
                "resources (CPUs, GPUs, memory, custom resources) to become available.", "error_type": None,
                "start_time": int(self.now * 1000), "end_time": None, "metadata": dict(request.get("metadata") or {}),
                "runtime_env": request.get("runtime_env") or {}, "driver_node_id": None,
            }
            self.logs[sid] = _printed(request["entrypoint"])
            return 200, json.dumps({"job_id": sid, "submission_id": sid}).encode()
        stop = re.fullmatch(r"/api/jobs/(.+)/stop", route)
        if method == "POST" and stop:
            sid = urllib.parse.unquote(stop.group(1))
            job = self.jobs.get(sid)
            if job is None:
                return 404, f"Job {sid} does not exist".encode()
            if job["status"] not in LIVE:
                return 200, json.dumps({"stopped": False}).encode()
            self.finish(sid, "STOPPED")
            return 200, json.dumps({"stopped": True}).encode()
        if method == "GET" and route == "/api/v0/nodes":
            nodes = [{"node_id": "head-node", "state": "ALIVE", "is_head_node": True, "resources_total": {"CPU": 1.0}}]
            nodes += [{"node_id": f"w{i}", "state": "ALIVE", "is_head_node": False,
                       "resources_total": {"CPU": 2.0, "GPU": self.gpus_per_worker}} for i in range(self.workers)]
            nodes += [{"node_id": f"d{i}", "state": "DEAD", "is_head_node": False, "resources_total": {}}
                      for i in range(self.dead)]
            return 200, json.dumps({"result": True, "msg": "", "data": {"result": {"total": len(nodes),
                                                                                    "result": nodes}}}).encode()
        if method == "GET" and route == "/api/v0/logs/file":
            sid = query["submission_id"][0]
            lines = int(query.get("lines", ["1000"])[0])
            return 200, "".join(f"{line}\n" for line in self.logs.get(sid, [])[-lines:]).encode()
        if method == "PUT" and route.startswith("/api/packages/gcs/"):
            return 200, json.dumps({"result": True, "msg": "Successfully uploaded.", "data": {}}).encode()
        return 404, b"Not Found"

    def client(self, url: str = "http://127.0.0.1:8265") -> RayJobs:
        """The lifecycle's real client, its transport answered here."""
        head = self

        class StandInJobs(RayJobs):
            def send(self, method: str, path: str, data: bytes | None, content_type: str) -> tuple[bytes, str | None]:
                if not head.up:
                    raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
                code, payload = head.handle(method, path, data)
                if code >= 400:
                    raise urllib.error.HTTPError(self.url + path, code, "error", None,  # type: ignore[arg-type]
                                                 io.BytesIO(payload))
                return payload, email.utils.formatdate(head.now, usegmt=True)

        return StandInJobs(url)


def _entrypoint_end(entrypoint: str) -> tuple[str, int] | None:
    """How a conformance entrypoint ends: `sys.exit(N)` fails with N, a sleep runs on, anything else succeeds."""
    if (found := re.search(r"sys\.exit\((\d+)\)", entrypoint)) is not None:
        return "FAILED", int(found.group(1))
    if "time.sleep" in entrypoint:
        return None
    return "SUCCEEDED", 0


def _printed(entrypoint: str) -> list[str]:
    return [m.replace('\\"', '"') for m in re.findall(r'print\(\\?"(.*?)\\?"', entrypoint)]
