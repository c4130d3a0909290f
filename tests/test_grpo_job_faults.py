"""GrpoJob against a head that misbehaves: a loopback stand-in for the Ray dashboard (a real head
cannot be made to stall on demand) that answers GET /api/version as Ray 2.60 does and then stalls
or resets on the job API; and a real head behind a link that is cut at random."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from components.grpo_job import GrpoJobProvider
from access import head_access
from access.head_access import HeadRequestError

pytestmark = pytest.mark.timeout(60)

VERSION = json.dumps({"version": "4", "ray_version": "2.60.0", "ray_commit": "x", "session_name": "s"}).encode()


def _standin(mode: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path.startswith("/api/version"):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(VERSION)))
                self.end_headers()
                self.wfile.write(VERSION)
            elif mode == "stall":
                time.sleep(20)
            elif mode == "5xx":
                self.send_error(503, "overloaded")
            else:  # reset: close the connection without a word
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                self.connection.close()

        do_POST = do_GET

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@pytest.fixture(params=["stall", "reset", "5xx"])
def bad_head(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setattr(head_access, "REQUEST_TIMEOUT_S", 1.0)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _standin(request.param))
    httpd.daemon_threads = True
    httpd.block_on_close = False
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _props(url: str) -> dict[str, object]:
    return {"dashboard_url": url, "entrypoint": "python3 -c pass", "runtime_env": {}, "stack": "faults",
            "ready_timeout_s": 5.0}


def test_create_against_a_head_that_stops_answering_fails_in_time_naming_it(bad_head: str) -> None:
    started = time.monotonic()
    with pytest.raises(RuntimeError) as raised:
        GrpoJobProvider().create(_props(bad_head))
    assert time.monotonic() - started < 5
    if isinstance(raised.value, HeadRequestError):
        assert str(raised.value).startswith(f"Ray head at {bad_head}: GET /api/jobs/ got no answer within 1 s")
    else:  # 5xx: Ray's client reports the status
        assert "503" in str(raised.value)


def test_delete_against_a_head_that_stops_answering_raises_and_stops_nothing(bad_head: str) -> None:
    started = time.monotonic()
    with pytest.raises(RuntimeError) as raised:
        GrpoJobProvider().delete("verl-grpo-faults-abc", {**_props(bad_head), "submission_id": "verl-grpo-faults-abc"})
    assert time.monotonic() - started < 5
    assert "cannot tell whether it still runs, so the delete fails" in str(raised.value)
    assert f"Ray head at {bad_head}: GET /api/jobs/ got no answer" in str(raised.value) or "503" in str(raised.value)


def _engine_up(provider: GrpoJobProvider, state: dict[str, object] | None,
               news: dict[str, object]) -> dict[str, object] | None:
    """One `pulumi up` of the job as Pulumi's engine runs it: diff, then (replace) delete the old
    run before creating the new one; the first error ends the update with the state it reached."""
    try:
        if state is not None:
            diff = provider.diff(str(state["submission_id"]), state, news)
            if not diff.replaces:
                return state
            provider.delete(str(state["submission_id"]), state)
            state = None
        created = provider.create(news)
        assert created.outs is not None
        return created.outs
    except (RuntimeError, OSError):  # what a cut link makes the provider raise; anything else is a bug
        return state


def _updates_under_faults(ray_head: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import random

    from components import job_spec

    from ray.job_submission import JobSubmissionClient

    from tests.ray_head import FlakyLink

    # How long a call keeps trying a head it cannot reach (30 s in production): each delete under a cut
    # link waits it out before it fails, three times here; the head answers at once while the link is up.
    monkeypatch.setattr(job_spec, "REACH_TIMEOUT_S", 5.0)
    client = JobSubmissionClient(ray_head)
    link = FlakyLink(int(ray_head.rsplit(":", 1)[1]))
    stack = f"invariant{uuid.uuid4().hex[:8]}"  # ids of its own on the run's shared head (both tests use this)
    rng = random.Random(7)
    provider = GrpoJobProvider()
    state: dict[str, object] | None = None
    # (link up, spec): a spec change while the head cannot be asked, then again once it can; then random;
    # last, the first spec again with the link up (a run live to replace), then a new spec, which must leave
    # the stack's new run live and named by the state (an id whose start timed out is spent).
    steps = [(True, 0), (False, 1), (True, 1), (False, 2), (False, 0), (True, 2)]
    steps += [(rng.random() < 0.6, rng.randrange(3)) for _ in range(6)]
    steps += [(True, 0), (True, 3)]
    live: list[str] = []
    try:
        for step, (up, spec) in enumerate(steps):
            link.up.set() if up else link.up.clear()
            news = {"dashboard_url": f"http://127.0.0.1:{link.port}", "stack": stack,
                    "entrypoint": f"{sys.executable} -c 'import time; time.sleep(600)' {spec}",
                    "runtime_env": {}, "ready_timeout_s": 30.0 if up else 2.0, "startup_grace_s": 0.0}
            state = _engine_up(provider, state, news)
            live = [j.submission_id for j in client.list_jobs()
                    if j.submission_id and j.submission_id.startswith(f"verl-grpo-{stack}-")
                    and str(j.status.value) in ("PENDING", "RUNNING")]
            assert len(live) <= 1, f"step {step}: {live}"
            if live and state is not None:
                assert live == [state["submission_id"]], f"step {step}: the state lost track of {live}"
        # Progress: with the head answering, the update went through: the new spec's run is the live one.
        assert state is not None and live == [state["submission_id"]], (state, live)
        assert str(state["entrypoint"]).endswith(" 3"), state
    finally:
        link.close()
        for job in client.list_jobs():
            if job.submission_id and job.submission_id.startswith(f"verl-grpo-{stack}-"):
                client.stop_job(job.submission_id)


# --- a destroy (or a replacement's delete) with a silent head, the Kubernetes API answering -----------


def _silent_head_run(api_url: str, state: object) -> tuple[dict[str, object], object]:
    """A run with a live attempt on RayCluster rc-x (its pods up), whose head no longer answers: its port
    closed (a head Pending on a CPU pool at zero nodes answers nothing either)."""
    from tests.ray_head import free_ports
    from workloads.kube import KubernetesApi
    from workloads.run_record import Attempt, RecordStore, RunRecord

    state.put_object("/apis/ray.io/v1/namespaces/ray/rayclusters/rc-x", {"metadata": {"name": "rc-x"}, "spec": {}})
    state.pods["/apis/ray.io/v1/namespaces/ray/rayclusters/rc-x"] = True
    store = RecordStore(KubernetesApi(api_url), "ray", "rc-x")
    store.write(store.get("run-x"), RunRecord("run-x", attempts=(
        Attempt(0, "verl-grpo-faults-abc", "pulumi-up", "pulumi-up", submitted=True),)))
    [port] = free_ports(1)
    props = {**_props(f"http://127.0.0.1:{port}"), "ready_timeout_s": 2.0, "kube_api_url": api_url,
             "namespace": "ray", "head_service": "rc-x-head-svc", "run_record": "rc-x-run", "run_id": "run-x",
             "submission_id": "verl-grpo-faults-abc", "status": "RUNNING"}
    return props, store


def test_destroy_with_a_silent_head_stops_the_run_through_its_raycluster_records_it_and_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 47 item 14: the job's delete used to fail here ("cannot tell whether it still runs"), so
    `pulumi destroy` (or the replacement of a pool, the RayCluster or the cluster) stopped while the
    GPU pools kept billing. Suspending the RayCluster stops every attempt: KubeRay 1.6.2 deletes every
    pod of a suspended cluster, the head's included, and clears the suspension only once none is left
    (raycluster_controller.go; the stand-in's `reconcile`)."""
    import pulumi

    from tests.kube_api import kube_api
    from workloads.run_lifecycle import DELETED

    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: warned.append(message))
    with kube_api() as (url, state):
        props, store = _silent_head_run(url, state)
        started = time.monotonic()
        GrpoJobProvider().delete("verl-grpo-faults-abc", props)
        assert time.monotonic() - started < 10
        cluster = state.get("/apis/ray.io/v1/namespaces/ray/rayclusters/rc-x")
        assert cluster["spec"]["suspend"] is True
        state.reconcile()
        state.reconcile()
        assert state.pods["/apis/ray.io/v1/namespaces/ray/rayclusters/rc-x"] is False
        record = store.get("run-x").record
    assert (record.outcome, record.released) == (DELETED, True)
    assert record.decisions[-1].endswith(
        "pulumi-up suspended RayCluster ray/rc-x: the Ray head did not answer, so every attempt stops with its pods")
    assert len(warned) == 1 and "\n" not in warned[0]
    assert warned[0].startswith("GrpoJob run run-x: the Ray head did not answer; stopped through RayCluster ray/rc-x "
                                "(spec.suspend: true)")


def test_destroy_with_a_silent_head_and_no_kubernetes_api_fails_in_one_line_naming_the_run() -> None:
    from tests.kube_api import kube_api

    with kube_api() as (url, state):
        props, _ = _silent_head_run(url, state)
    with pytest.raises(RuntimeError) as raised:  # the API's port closed now too
        GrpoJobProvider().delete("verl-grpo-faults-abc", props)
    message = str(raised.value)
    assert "\n" not in message and "Traceback" not in message
    assert message.startswith("GrpoJob verl-grpo-faults-abc (run run-x): cannot tell whether it still runs, so the "
                              "delete fails")


def test_a_targeted_up_whose_cascade_deleted_the_job_is_undone_by_the_next_up() -> None:
    """Issue 47 item 11. `pulumi up --target <gpu pool or RayCluster>` (or `--exclude <grpo>`) with a change
    that replaces the target: the target is delete-before-replace, so the engine first deletes the
    resources that must go with it (pulumi/pulumi pkg/resource/deploy/step_generator.go,
    `continueStepsFromDiff`: `calculateDependentReplacements`, and in 3.260 `findDependentCascadeReplacements`
    for `replaceWith`/`deletedWith`), emitting their delete steps without asking `isTargetedForUpdate`
    (only `GenerateDeletes`, the end-of-update deletes, filters by the targets). The job, not targeted, then
    gets a SameStep that copies its old state (`generateSteps`, "not in target group (same)"): its delete
    ran (the run recorded DELETED, desired stopped) while the state still says RUNNING, and a plain `up`
    saw no change. Now the provider's `diff` reads the run record and replaces the job whose run a delete
    ended: the next `up` submits again (the create reopens the run). Read in the stored snapshot of
    pulumi/pulumi (commit 00285a9b) and the issue's review of 3.260."""
    from tests.kube_api import kube_api
    from workloads.run_lifecycle import DELETED

    with kube_api() as (url, state):
        props, store = _silent_head_run(url, state)
        news = {k: v for k, v in props.items() if k not in ("submission_id", "status")}
        provider = GrpoJobProvider()
        assert not provider.diff("verl-grpo-faults-abc", props, news).replaces  # the run is open: nothing to do
        provider.delete("verl-grpo-faults-abc", props)  # the cascade's delete; the state keeps `props`
        assert store.get("run-x").record.outcome == DELETED
        diff = provider.diff("verl-grpo-faults-abc", props, news)
    assert diff.changes and diff.replaces == ["status"] and diff.delete_before_replace
    # The Kubernetes API gone too: no replacement decided on a guess, and no error.
    assert not GrpoJobProvider().diff("verl-grpo-faults-abc", props, news).replaces


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_no_sequence_of_updates_under_faults_leaves_two_runs_of_one_stack(ray_head: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _updates_under_faults(ray_head, monkeypatch)


def _create_raises(*_args: object) -> object:
    raise RuntimeError("broken on purpose")


@pytest.mark.ray
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("method", "broken"), [("create", _create_raises), ("delete", lambda *_args: None)],
                         ids=["create always raises", "delete does nothing"])
def test_the_fault_sequence_fails_when_the_provider_is_broken(ray_head: str, monkeypatch: pytest.MonkeyPatch,
                                                              method: str, broken: object) -> None:
    monkeypatch.setattr(GrpoJobProvider, method, broken)
    with pytest.raises(AssertionError):
        _updates_under_faults(ray_head, monkeypatch)
