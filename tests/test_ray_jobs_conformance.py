"""The in-process Ray job table (tests/ray_jobs.py) answers the lifecycle's calls as a real Ray head
does: one script of exactly those calls (workloads/run_lifecycle.RayJobs: list, submit and Ray's refusal
of a used id, stop, the status transitions, the driver log, the nodes), run against a real head on
127.0.0.1 and against the stand-in, and the answers compared."""

from __future__ import annotations

import shlex
import sys
import time
import urllib.error
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests.ray_jobs import RayHeadStandIn
from workloads.run_lifecycle import LIVE, TERMINAL, RayJobs, log_state

PY = shlex.quote(sys.executable)
SLEEP = f"{PY} -c 'import time; time.sleep(300)'"
EXIT_3 = f"{PY} -c 'import sys; sys.exit(3)'"
STEPS = f"{PY} -c 'print(\"step:1 - a:1\"); print(\"local_global_step_folder: /ck/global_step_2\", flush=True); " \
        "import time; time.sleep(300)'"
QUICK = f"{PY} -c pass"


def _code(call: Callable[[], Any]) -> Any:
    """The call's answer, or the HTTP status it raised."""
    try:
        return call()
    except urllib.error.HTTPError as error:
        error.close()
        return f"HTTP {error.code}"


def _until(ray: RayJobs, sid: str, done: Callable[[str], bool], tick: Callable[[], None]) -> str:
    deadline = time.monotonic() + 60
    while True:
        status = ray.jobs()[sid]["status"]
        if done(status) or time.monotonic() > deadline:
            return status
        tick()


def script(ray: RayJobs, tick: Callable[[], None], run: str) -> list[Any]:
    """The lifecycle's calls in order; each answer normalized to what the lifecycle reads of it."""
    sleep, fail, quick, steps = (f"c-{run}-{name}" for name in ("sleep", "fail", "quick", "steps"))
    seen: list[Any] = []
    before = set(ray.jobs())
    seen.append(("unknown ids", [sid for sid in (sleep, fail) if sid in before]))
    metadata = {"verl-gke.run_id": run, "verl-gke.attempt": "0"}
    seen.append(("submit", _code(lambda: ray.submit(sleep, SLEEP, {}, metadata))))
    seen.append(("submit a used id", _code(lambda: ray.submit(sleep, QUICK, {}, {}))))
    job = ray.jobs()[sleep]
    seen.append(("listed", job["status"] in LIVE, job["metadata"], job["entrypoint"] == SLEEP,
                 {"submission_id", "status", "message", "end_time", "metadata", "driver_node_id"} <= set(job)))
    seen.append(("running", _until(ray, sleep, lambda s: s == "RUNNING", tick)))
    seen.append(("stop", _code(lambda: ray.stop(sleep))))
    seen.append(("stopped", _until(ray, sleep, lambda s: s in TERMINAL, tick)))
    ended = ray.jobs()[sleep]
    seen.append(("ended", bool(ended["end_time"]), ended["end_time"] >= (ended.get("start_time") or 0)))
    seen.append(("stop an ended job", _code(lambda: ray.stop(sleep))))
    seen.append(("stop an unknown id", _code(lambda: ray.stop(f"c-{run}-none"))))
    ray.submit(fail, EXIT_3, {}, {})
    seen.append(("failed", _until(ray, fail, lambda s: s in TERMINAL, tick)))
    seen.append(("its message", ray.jobs()[fail]["message"].splitlines()[0]))
    ray.submit(quick, QUICK, {}, {})
    seen.append(("succeeded", _until(ray, quick, lambda s: s in TERMINAL, tick)))
    ray.submit(steps, STEPS, {}, {})
    _until(ray, steps, lambda s: s == "RUNNING", tick)
    deadline = time.monotonic() + 30
    while (state := log_state(ray.log_tail(ray.jobs()[steps]))).step is None and time.monotonic() < deadline:
        tick()
    seen.append(("driver log", state))
    ray.stop(steps)
    _until(ray, steps, lambda s: s in TERMINAL, tick)
    capacity = ray.capacity()
    seen.append(("capacity", capacity.workers, capacity.gpus, capacity.dead))
    seen.append(("head clock", ray.head_time is not None and abs(ray.head_time - time.time()) < 60))
    return seen


@pytest.mark.ray
@pytest.mark.timeout(240)
def test_the_stand_in_answers_the_lifecycles_calls_as_a_real_head(ray_head: str) -> None:
    run = uuid.uuid4().hex[:8]
    real = script(RayJobs(ray_head), lambda: time.sleep(0.3), run)
    head = RayHeadStandIn(entrypoints_end=True)
    stand_in = script(head.client(), head.tick, run)
    assert stand_in == real
