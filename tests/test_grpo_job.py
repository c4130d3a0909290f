"""The GrpoJob dynamic provider, driven directly against a real local Ray head.

Entrypoints are tiny python commands; each test uses its own stack name, so submission ids never
collide on the shared head.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shlex
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import dill
import pulumi
import pulumi.dynamic
import pytest
from pulumi.output import Unknown
from pulumi.runtime import rpc
from ray.job_submission import JobDetails, JobStatus, JobSubmissionClient, JobType

from components import job_lease
from components.grpo_job import GrpoJob, GrpoJobProvider, planned_outs
from components.job_head import log_tail
from components.job_spec import JobSpec
from workloads.run_lifecycle import DELETED, RayJobs
from workloads.run_record import RecordStore, RunRecord
from tests.kube_api import kube_api
from tests.ray_head import FlakyLink, free_ports

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]

PY = shlex.quote(sys.executable)


def _py(code: str) -> str:
    return f"{PY} -c {shlex.quote(code)}"


@pytest.fixture
def props(ray_head: str) -> Callable[..., dict[str, Any]]:
    """Props for the local head: a fresh stack name per test, the given entrypoint and extras."""
    stack = f"t{uuid.uuid4().hex[:8]}"

    def make(entrypoint: str, **extra: Any) -> dict[str, Any]:
        return {"dashboard_url": ray_head, "entrypoint": entrypoint, "runtime_env": {}, "stack": stack, **extra}

    return make


def _outs_of(result: pulumi.dynamic.CreateResult | pulumi.dynamic.ReadResult | pulumi.dynamic.UpdateResult
             ) -> dict[str, Any]:
    assert result.outs is not None
    return result.outs


def _wait_status(client: JobSubmissionClient, submission_id: str, wanted: set[str], timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while (status := str(client.get_job_status(submission_id).value)) not in wanted:
        assert time.monotonic() < deadline, f"{submission_id} still {status}"
        time.sleep(0.2)
    return status


def test_create_submits_under_the_deterministic_id(ray_head: str, props: Callable[..., dict[str, Any]]) -> None:
    entrypoint = _py("print('hello from grpo')")
    runtime_env = {"env_vars": {"HF_HOME": "/data/huggingface"}}
    job_props = props(entrypoint, runtime_env=runtime_env)
    result = GrpoJobProvider().create(job_props)

    canonical = json.dumps({"entrypoint": entrypoint, "runtime_env": runtime_env},
                           sort_keys=True, separators=(",", ":"))
    expected = f"verl-grpo-{job_props['stack']}-{hashlib.sha256(canonical.encode()).hexdigest()[:12]}"
    assert result.id == expected
    assert _outs_of(result)["submission_id"] == expected
    assert _outs_of(result)["status"] in {"PENDING", "RUNNING", "SUCCEEDED"}
    client = JobSubmissionClient(ray_head)
    info = client.get_job_info(expected)
    assert info.entrypoint == entrypoint
    assert (info.runtime_env or {}).get("env_vars") == {"HF_HOME": "/data/huggingface"}
    assert _wait_status(client, expected, {"SUCCEEDED", "FAILED"}) == "SUCCEEDED"
    assert "hello from grpo" in client.get_job_logs(expected)


def test_only_entrypoint_runtime_env_and_dashboard_url_are_needed(ray_head: str) -> None:
    entrypoint = _py(f"print({uuid.uuid4().hex!r})")
    result = GrpoJobProvider().create({"dashboard_url": ray_head, "entrypoint": entrypoint, "runtime_env": {}})
    assert result.id.startswith("verl-grpo-dev-")
    assert _outs_of(result)["namespace"] == "default" and _outs_of(result)["ready_timeout_s"] == 1800
    assert _outs_of(result)["dashboard_command"] is None


def test_second_create_adopts_the_job_instead_of_running_it_twice(
        ray_head: str, props: Callable[..., dict[str, Any]], tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    job_props = props(_py(f"open({str(runs)!r}, 'a').write('run\\n')"))
    provider = GrpoJobProvider()
    first = provider.create(job_props)
    second = provider.create(job_props)
    assert second.id == first.id
    client = JobSubmissionClient(ray_head)
    assert [job.submission_id for job in client.list_jobs()].count(first.id) == 1
    _wait_status(client, first.id, {"SUCCEEDED", "FAILED"})
    assert runs.read_text() == "run\n"
    # Adopting a finished job reports its real status.
    assert _outs_of(provider.create(job_props))["status"] == "SUCCEEDED"


def test_ints_sent_as_floats_give_the_same_job(props: Callable[..., dict[str, Any]]) -> None:
    entrypoint = _py("print('floats')")
    as_ints = props(entrypoint, runtime_env={"config": {"setup_timeout_seconds": 600}}, ready_timeout_s=60)
    as_floats = {**as_ints, "runtime_env": {"config": {"setup_timeout_seconds": 600.0}}, "ready_timeout_s": 60.0}
    provider = GrpoJobProvider()
    created = provider.create(as_floats)
    assert provider.create(as_ints).id == created.id
    assert _outs_of(created)["runtime_env"] == {"config": {"setup_timeout_seconds": 600}}


def test_read_refreshes_the_status(ray_head: str, props: Callable[..., dict[str, Any]]) -> None:
    provider = GrpoJobProvider()
    created = provider.create(props(_py("import time; time.sleep(3)"), startup_grace_s=0.0))
    assert _outs_of(created)["status"] == "RUNNING"
    _wait_status(JobSubmissionClient(ray_head), created.id, {"SUCCEEDED", "FAILED"})
    read = provider.read(created.id, _outs_of(created))
    assert read.id == created.id
    assert _outs_of(read)["status"] == "SUCCEEDED"
    assert _outs_of(read)["submission_id"] == created.id
    assert _outs_of(read)["entrypoint"] == _outs_of(created)["entrypoint"]


def test_read_of_a_job_the_head_does_not_know_keeps_it_and_reports_it_lost(props: Callable[..., dict[str, Any]]) -> None:
    # Forgetting it (id "") would make the next `up` submit beside the supervisor's next attempt.
    outs = {**props(_py("pass")), "submission_id": "verl-grpo-dev-000000000000", "status": "RUNNING"}
    read = GrpoJobProvider().read("verl-grpo-dev-000000000000", outs)
    assert read.id == "verl-grpo-dev-000000000000"
    assert (_outs_of(read)["submission_id"], _outs_of(read)["status"]) == ("verl-grpo-dev-000000000000", "LOST")


CLUSTER = {"cluster_endpoint": "34.1.2.3", "cluster_ca_certificate": "Y2E=", "cluster_name": "verl",
           "namespace": "ray", "head_service": "verl-head-svc"}


# Session-scoped (one per worker, used by this file alone): the file's tests then go to any worker.
@pytest.fixture(scope="session")
def cluster_api_stand_in() -> Iterator[tuple[str, Any]]:
    with kube_api() as (url, state):
        yield url, state


@pytest.fixture(scope="session")
def cluster(cluster_api_stand_in: tuple[str, Any]) -> dict[str, Any]:
    """CLUSTER, with the run record kept and the head reached through the Kubernetes API stand-in
    (34.1.2.3 is no API)."""
    return {**CLUSTER, "kube_api_url": cluster_api_stand_in[0]}


@pytest.fixture
def head_pod(cluster_api_stand_in: tuple[str, Any]) -> Iterator[Callable[[int], None]]:
    """Gives svc/verl-head-svc in namespace ray a running head pod served on a loopback port, for the test."""
    state = cluster_api_stand_in[1]
    yield lambda port: state.add_head("ray", "verl-head-svc", "verl-head-0", port)
    for path in ("/api/v1/namespaces/ray/services/verl-head-svc", "/api/v1/namespaces/ray/pods/verl-head-0"):
        state.objects.pop(path, None)


def test_create_reaches_the_head_through_a_port_forward(
        ray_head: str, props: Callable[..., dict[str, Any]], cluster: dict[str, Any], head_pod: Any) -> None:
    # The API stand-in's head pod is the real head: the provider's requests go through its local
    # proxy and a port-forward stream per connection.
    head_pod(int(ray_head.rsplit(":", 1)[1]))
    job_props = {**props(_py("print('tunnelled')")), **cluster}
    del job_props["dashboard_url"]
    created = GrpoJobProvider().create(job_props)
    assert JobSubmissionClient(ray_head).get_job_info(created.id).entrypoint == _py("print('tunnelled')")
    assert _outs_of(created)["dashboard_command"] == f"verl-gke dashboard --stack {job_props['stack']}"
    # Endpoint and CA are kept to reach the API at refresh and destroy; never a kubeconfig.
    assert _outs_of(created)["cluster_endpoint"] == "34.1.2.3" and "kubeconfig" not in _outs_of(created)


def test_a_missing_head_service_is_retried_until_ready_timeout_and_named(
        props: Callable[..., dict[str, Any]], cluster: dict[str, Any]) -> None:
    job_props = {**props(_py("pass")), **cluster, "ready_timeout_s": 3.0}
    del job_props["dashboard_url"]
    started = time.monotonic()
    with pytest.raises(RuntimeError) as raised:
        GrpoJobProvider().create(job_props)
    assert 3 <= time.monotonic() - started < 15
    assert str(raised.value) == ("Ray head at svc/verl-head-svc in namespace ray of GKE cluster verl (port-forward "
                                 "through its API) not reachable within 3 s: port-forward to svc/verl-head-svc in "
                                 'namespace ray: services "verl-head-svc" not found')


def test_a_missing_auth_plugin_fails_create_at_once(
        props: Callable[..., dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    job_props = {**props(_py("pass")), **CLUSTER}
    del job_props["dashboard_url"]
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="^gke-gcloud-auth-plugin not found on PATH"):
        GrpoJobProvider().create(job_props)
    assert time.monotonic() - started < 5


def _stored(**overrides: Any) -> dict[str, Any]:
    base = {"dashboard_url": "http://127.0.0.1:8265", "entrypoint": "python3 -m verl.trainer.main_ppo a=1",
            "runtime_env": {"env_vars": {"NCCL_CROSS_NIC": "0"}}, "stack": "a4"}
    return {**base, **overrides}


def test_diff_replaces_on_the_run_changing_not_on_timeouts() -> None:
    provider = GrpoJobProvider()
    olds = {**_stored(), "namespace": "default", "ready_timeout_s": 1800.0,
            "submission_id": "verl-grpo-a4-x", "status": "RUNNING", "__provider": "p"}
    # The engine's news: outputs seeded as None, defaults left out, numbers as floats.
    news = {**_stored(), "submission_id": None, "status": None, "dashboard_command": None, "__provider": "p"}
    same = provider.diff("verl-grpo-a4-x", olds, news)
    assert same.changes is False and same.replaces == []

    entry = provider.diff("id", olds, {**news, "entrypoint": "python3 -m verl.trainer.main_ppo a=2"})
    assert entry.changes is True and entry.replaces == ["entrypoint"] and entry.delete_before_replace is True

    env = provider.diff("id", olds, {**news, "runtime_env": {"env_vars": {"NCCL_CROSS_NIC": "1"}}})
    assert env.changes is True and env.replaces == ["runtime_env"]

    timeout = provider.diff("id", olds, {**news, "ready_timeout_s": 600.0})
    assert timeout.changes is True and timeout.replaces == []

    again = provider.diff("id", olds, {**news, "attempt": 1.0})
    assert again.changes is True and again.replaces == ["attempt"] and again.delete_before_replace is True


# How the head is reached (dashboard_url, cluster_endpoint) updates in place: tests/test_pulumi_lifecycle.py.
@pytest.mark.parametrize("key", ["cluster_name", "namespace", "head_service"])
def test_diff_replaces_when_where_the_job_runs_changes(key: str) -> None:
    olds = {**_stored(), **CLUSTER, "submission_id": "verl-grpo-a4-x", "status": "RUNNING"}
    moved = GrpoJobProvider().diff("id", olds, {**olds, key: "other"})
    assert moved.replaces == [key] and moved.delete_before_replace is True


def test_a_new_attempt_of_the_same_spec_is_a_new_submission(ray_head: str, props: Callable[..., dict[str, Any]]) -> None:
    job_props = props(_py("print('attempt')"))
    first = GrpoJobProvider().create(job_props)
    second = GrpoJobProvider().create({**job_props, "attempt": 1.0})
    assert second.id != first.id and second.id.startswith(f"verl-grpo-{job_props['stack']}-")
    assert GrpoJobProvider().create({**job_props, "attempt": 0.0}).id == first.id
    with pytest.raises(ValueError, match=r"attempt: -1 must be a whole number >= 0"):
        GrpoJobProvider().create({**job_props, "attempt": -1})


def test_diff_in_preview_treats_unknown_spec_as_a_replace() -> None:
    provider = GrpoJobProvider()
    olds = {**_stored(), "submission_id": "verl-grpo-a4-x", "status": "RUNNING"}
    for unknown in (Unknown(), rpc.UNKNOWN):
        nested = provider.diff("id", olds, {**_stored(), "runtime_env": {"env_vars": {"HF_HOME": unknown}}})
        assert nested.replaces == ["runtime_env"]
        # Where the job runs is not known yet (a new RayCluster): the run moves with it.
        head = provider.diff("id", olds, {**_stored(), "head_service": unknown})
        assert head.changes is True and head.replaces == ["head_service"]
        # How it is reached is not known yet: an update, the run goes on.
        url = provider.diff("id", olds, {**_stored(), "dashboard_url": unknown})
        assert url.changes is True and url.replaces == []


def test_check_names_each_bad_prop_and_lets_unknowns_pass() -> None:
    provider = GrpoJobProvider()
    result = provider.check({}, {"entrypoint": "", "runtime_env": [], "ready_timeout_s": -1.0,
                                 "stack": "my stack", "wait_for_completion": "yes", "retries": 3.0})
    failures = {(f.property, f.reason) for f in result.failures}
    assert {f.property for f in result.failures} == {
        "entrypoint", "runtime_env", "ready_timeout_s", "stack", "wait_for_completion", "retries", "dashboard_url"}
    assert ("ready_timeout_s", "-1.0 must be a positive number of seconds") in failures
    assert ("dashboard_url", "unset, so the head is reached by a port-forward through the cluster's API, which needs "
                             "cluster_endpoint, cluster_ca_certificate, cluster_name, head_service") in failures

    preview = provider.check({}, {"entrypoint": rpc.UNKNOWN, "runtime_env": {"env_vars": {"A": Unknown()}},
                                  "cluster_endpoint": Unknown(), "cluster_ca_certificate": "Y2E=",
                                  "cluster_name": "verl", "head_service": "h", "__provider": Unknown()})
    assert preview.failures == []

    port_forward = provider.check({}, {"entrypoint": "x", "runtime_env": {}, "cluster_endpoint": "34.1.2.3",
                                       "cluster_ca_certificate": "Y2E=", "cluster_name": "verl",
                                       "head_service": "h", "namespace": "ray"})
    assert port_forward.failures == []


def test_the_planned_outputs_of_a_preview_echo_its_unknown_props() -> None:
    """synth --preview and a first `pulumi preview`: what is not known yet is neither judged nor replaced."""
    endpoint = Unknown()
    outs = planned_outs({"entrypoint": "x", "runtime_env": {}, "cluster_endpoint": endpoint,
                         "cluster_ca_certificate": rpc.UNKNOWN, "cluster_name": "verl", "head_service": "h"}, "?")
    assert (outs["cluster_endpoint"], outs["cluster_ca_certificate"], outs["status"]) == (endpoint, rpc.UNKNOWN, "?")
    known = JobSpec.from_props({"entrypoint": "x", "runtime_env": {}, "dashboard_url": "http://head:8265"})
    assert outs["submission_id"] == known.submission_id


def test_check_refuses_fabric_props_of_the_wrong_shape() -> None:
    """A string is not a transport list (it became one transport per letter), nor a number a python."""
    props = {"entrypoint": "x", "runtime_env": {}, "dashboard_url": "http://head:8265"}
    failures = GrpoJobProvider().check({}, {**props, "fabric_transports": "NET/IB", "fabric_python": 3.0}).failures
    assert sorted((f.property, f.reason) for f in failures) == [
        ("fabric_python", "must be a non-empty string or unset, got float"),
        ("fabric_transports", "'NET/IB' must be a list of NCCL transport names such as ['NET/IB']")]
    spec = JobSpec.from_props({**props, "fabric_transports": ["NET/IB"], "attempt": 2.0, "ready_timeout_s": 60})
    assert (spec.fabric_transports, spec.attempt, spec.ready_timeout_s) == (("NET/IB",), 2, 60.0)


DNS_ENDPOINT = "gke-1a2b3c4d5e6f4a5b8c9d0e1f2a3b4c5d6e7f-123456789012.us-central1.gke.goog"


def test_the_dns_endpoint_needs_no_ca_an_ip_endpoint_does() -> None:
    provider = GrpoJobProvider()
    access = {"entrypoint": "x", "runtime_env": {}, "cluster_name": "verl", "head_service": "h", "namespace": "ray"}
    assert provider.check({}, {**access, "cluster_endpoint": DNS_ENDPOINT}).failures == []
    [failure] = provider.check({}, {**access, "cluster_endpoint": "34.1.2.3"}).failures
    assert (failure.property, failure.reason) == (
        "dashboard_url", "unset, so the head is reached by a port-forward through the cluster's API, which needs cluster_ca_certificate")


@pytest.mark.parametrize(("endpoint", "ca", "ca_data"), [
    (DNS_ENDPOINT, None, None),  # system roots: the DNS endpoint's certificate is publicly trusted
    (DNS_ENDPOINT, "Y2E=", None),  # the cluster CA does not sign the DNS endpoint's certificate
    ("34.1.2.3", "Y2E=", "ca"),  # base64 of "ca": the IP endpoint is pinned to the cluster CA
])
def test_the_run_record_is_read_on_the_clusters_endpoint(endpoint: str, ca: str | None, ca_data: str | None) -> None:
    spec = JobSpec.from_props({"entrypoint": "x", "runtime_env": {}, "stack": "a4", "namespace": "ray",
                                "cluster_name": "verl", "head_service": "h", "cluster_endpoint": endpoint,
                                "cluster_ca_certificate": ca})
    records = job_lease.records(spec)
    assert isinstance(records, RecordStore)
    assert (records.api.url, records.api.ca_data) == (f"https://{endpoint}", ca_data)


def test_create_with_bad_props_raises_one_message_naming_them() -> None:
    with pytest.raises(ValueError, match=r"^GrpoJob: entrypoint: a non-empty shell command is required; "
                                         r"dashboard_url: 'localhost:8265' must start with http:// or https://$"):
        GrpoJobProvider().create({"dashboard_url": "localhost:8265", "entrypoint": " ", "runtime_env": {}})


def test_update_keeps_the_job_and_its_outputs() -> None:
    olds = {**_stored(), "submission_id": "verl-grpo-a4-abc", "status": "RUNNING", "dashboard_command": None}
    news = {**_stored(), "ready_timeout_s": 600.0, "namespace": "ray", "head_service": "h",
            "submission_id": None, "status": None, "dashboard_command": None}
    outs = _outs_of(GrpoJobProvider().update("verl-grpo-a4-abc", olds, news))
    assert outs["submission_id"] == "verl-grpo-a4-abc" and outs["status"] == "RUNNING"
    assert outs["ready_timeout_s"] == 600.0 and outs["namespace"] == "ray"
    assert outs["dashboard_command"] == f"verl-gke dashboard --stack {news['stack']}"


def test_delete_stops_a_running_job(ray_head: str, props: Callable[..., dict[str, Any]]) -> None:
    provider = GrpoJobProvider()
    created = provider.create(props(_py("import time; print('training', flush=True); time.sleep(600)"),
                                    startup_grace_s=0.0))
    client = JobSubmissionClient(ray_head)
    _wait_status(client, created.id, {"RUNNING"})
    started = time.monotonic()
    provider.delete(created.id, _outs_of(created))
    assert time.monotonic() - started < 30
    assert str(client.get_job_status(created.id).value) == "STOPPED"


def _tunnelled(props: Callable[..., dict[str, Any]], cluster: dict[str, Any], **extra: Any) -> dict[str, Any]:
    outs = {**props(_py("pass")), **cluster, "submission_id": "verl-grpo-dev-abc", "status": "RUNNING", **extra}
    del outs["dashboard_url"]
    return outs


def test_delete_succeeds_without_stopping_only_when_the_api_says_the_head_is_gone(
        props: Callable[..., dict[str, Any]], monkeypatch: pytest.MonkeyPatch, cluster: dict[str, Any]) -> None:
    _delete_with_the_head_gone(props, monkeypatch, cluster)


def test_the_head_gone_delete_check_fails_when_the_delete_does_nothing(
        props: Callable[..., dict[str, Any]], monkeypatch: pytest.MonkeyPatch, cluster: dict[str, Any]) -> None:
    monkeypatch.setattr(GrpoJobProvider, "delete", lambda *_args: None)
    with pytest.raises(AssertionError):
        _delete_with_the_head_gone(props, monkeypatch, cluster)


def _delete_with_the_head_gone(props: Callable[..., dict[str, Any]], monkeypatch: pytest.MonkeyPatch,
                               cluster: dict[str, Any]) -> None:
    # The stand-in has no svc/verl-head-svc: the API says it is gone.
    outs = _tunnelled(props, cluster, ready_timeout_s=1.0)
    spec = JobSpec.from_props(outs)
    records = job_lease.records(spec)
    records.write(records.get(spec.run.run_id), RunRecord(run_id=spec.run.run_id, generation=spec.run.generation))
    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *_args, **_kwargs: warned.append(message))
    started = time.monotonic()
    GrpoJobProvider().delete("verl-grpo-dev-abc", outs)
    assert time.monotonic() - started < 10
    # It went through the lifecycle's delete: the run recorded stopped by the stack (its supervisor submits
    # nothing more), then nothing left to stop, said once.
    record = records.get(spec.run.run_id).record
    assert record is not None and (record.desired, record.outcome) == ("stopped", DELETED)
    assert len(warned) == 1 and warned[0].startswith("GrpoJob verl-grpo-dev-abc: nothing to stop; "), warned
    assert "not found" in warned[0]


def test_delete_raises_when_credentials_fail_instead_of_letting_a_second_run_start(
        props: Callable[..., dict[str, Any]]) -> None:
    class Unauthorized(BaseHTTPRequestHandler):
        """An API server refusing expired credentials: 401 and a Status (every request)."""
        def do_GET(self) -> None:  # noqa: N802
            body = b'{"kind":"Status","apiVersion":"v1","status":"Failure","message":"Unauthorized","code":401}'
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_PUT = do_POST = do_PATCH = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Unauthorized)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        outs = _tunnelled(props, {**CLUSTER, "kube_api_url": f"http://127.0.0.1:{server.server_port}"},
                          ready_timeout_s=1.0)
        with pytest.raises(RuntimeError) as raised:
            GrpoJobProvider().delete("verl-grpo-dev-abc", outs)
    finally:
        server.shutdown()
        server.server_close()
    message = str(raised.value)
    assert message.startswith("GrpoJob verl-grpo-dev-abc (run verl-grpo-")
    assert ": cannot tell whether it still runs, so the delete fails" in message
    assert "HTTP Error 401: Unauthorized" in message
    assert "`pulumi state delete`" in message


def test_delete_raises_when_a_dashboard_url_does_not_answer(props: Callable[..., dict[str, Any]]) -> None:
    [port] = free_ports(1)
    outs = {**props(_py("pass")), "dashboard_url": f"http://127.0.0.1:{port}", "ready_timeout_s": 1.0,
            "submission_id": "verl-grpo-dev-abc", "status": "RUNNING"}
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="cannot tell whether it still runs"):
        GrpoJobProvider().delete("verl-grpo-dev-abc", outs)
    assert time.monotonic() - started < 10


def test_a_head_that_does_not_answer_fails_create_naming_its_address(props: Callable[..., dict[str, Any]]) -> None:
    [port] = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    with pytest.raises(RuntimeError) as raised:
        GrpoJobProvider().create(props(_py("pass"), dashboard_url=url, ready_timeout_s=2.0))
    assert 2 <= time.monotonic() - started < 10
    assert str(raised.value).startswith(f"Ray head at {url} not reachable within 2 s")


def test_wait_for_completion_fails_with_the_runs_log_tail(props: Callable[..., dict[str, Any]]) -> None:
    code = "import sys\nfor i in range(30): print(f'step {i}', flush=True)\nsys.exit(3)"
    with pytest.raises(RuntimeError) as raised:
        GrpoJobProvider().create(props(_py(code), wait_for_completion=True, poll_interval_s=0.2))
    message = str(raised.value)
    first_line, *rest = message.splitlines()
    assert first_line.startswith("GRPO job verl-grpo-t")
    assert first_line.endswith(" FAILED while starting: Job entrypoint command failed with exit code 3, "
                               "last available logs (truncated to 20,000 chars):")
    assert rest[0] == "last 20 log lines:"
    assert rest[1:] == [f"step {i}" for i in range(10, 30)]


def test_wait_for_completion_returns_succeeded(props: Callable[..., dict[str, Any]]) -> None:
    created = GrpoJobProvider().create(props(_py("print('done')"), wait_for_completion=True, poll_interval_s=0.2))
    assert _outs_of(created)["status"] == "SUCCEEDED"


def test_provider_survives_the_engines_dill_round_trip(ray_head: str, props: Callable[..., dict[str, Any]]) -> None:
    provider = GrpoJobProvider()
    assert dill.loads(dill.dumps(provider, recurse=True)).__class__ is GrpoJobProvider
    # Exactly what `pulumi up` stores and the provider process loads.
    serialized = base64.b64decode(pulumi.dynamic.dynamic.serialize_provider(provider))
    # By reference to this importable module, not by value: no code or state travels in the state file.
    assert b"components.grpo_job" in serialized and len(serialized) < 100
    loaded = dill.loads(serialized)
    assert isinstance(loaded, GrpoJobProvider)
    created = loaded.create(props(_py("print('pickled')")))
    assert JobSubmissionClient(ray_head).get_job_info(created.id).entrypoint == _py("print('pickled')")


class _Mocks(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.registered: list[pulumi.runtime.MockResourceArgs] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.registered.append(args)
        return "verl-grpo-a4-0123456789ab", {**args.inputs, "submission_id": "verl-grpo-a4-0123456789ab",
                                            "status": "PENDING", "dashboard_command": "kubectl port-forward"}

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        return {}, None


@pytest.fixture
def mocks() -> _Mocks:
    mocks = _Mocks()
    pulumi.runtime.set_mocks(mocks, preview=False)
    return mocks


@pulumi.runtime.test
def test_grpo_job_resource_registers_the_provider_and_exposes_outputs(mocks: _Mocks) -> pulumi.Output[Any]:
    job = GrpoJob("grpo", {"entrypoint": "python3 -m verl.trainer.main_ppo", "runtime_env": {}, "stack": "a4",
                           "namespace": "ray", "head_service": "h", "cluster_endpoint": "34.1.2.3",
                           "cluster_ca_certificate": "Y2E=", "cluster_name": "verl"})

    def check(values: list[Any]) -> None:
        submission_id, status = values
        assert submission_id == "verl-grpo-a4-0123456789ab" and status == "PENDING"
        [registered] = mocks.registered
        assert registered.typ == "pulumi-python:dynamic:GrpoJob"
        # Outputs seeded as None are not sent as inputs, yet resolve (they exist only because seeded).
        assert not {"submission_id", "status", "dashboard_command"} & set(registered.inputs)
        assert registered.inputs["stack"] == "a4" and registered.inputs["head_service"] == "h"
        # The pickled provider is stored as a secret.
        assert rpc.is_rpc_secret(registered.inputs["__provider"])

    return pulumi.Output.all(job.submission_id, job.status).apply(check)


def test_a_run_that_fails_within_its_start_up_grace_fails_create_with_its_log_tail(
        props: Callable[..., dict[str, Any]]) -> None:
    code = "import sys, time\nfor i in range(5000): print(f'line {i}')\ntime.sleep(2)\nsys.exit(4)"
    with pytest.raises(RuntimeError) as raised:
        GrpoJobProvider().create(props(_py(code), startup_grace_s=30.0))
    first_line, *rest = str(raised.value).splitlines()
    assert " FAILED while starting: Job entrypoint command failed with exit code 4" in first_line
    assert rest[0] == "last 20 log lines:"
    assert rest[1:] == [f"line {i}" for i in range(4980, 5000)]


class _LogCutByTheHead:
    """A stand-in for the head's `GET /api/v0/logs/file?lines=N`: the last N lines of a driver log, as Ray
    2.60's log agent cuts them (dashboard/modules/log/log_agent.py: a last line without a newline counts)."""

    def __init__(self, log: str) -> None:
        self.log = log

    def _do_request(self, method: str, endpoint: str) -> Any:
        lines = int(urllib.parse.parse_qs(urllib.parse.urlsplit(endpoint).query)["lines"][0])
        return SimpleNamespace(status_code=200, text="".join(self.log.splitlines(keepends=True)[-lines:]))


@pytest.mark.parametrize("where", ["after its last line", "inside its last line"])
def test_the_log_tail_is_the_drivers_own_end_wherever_rays_echo_of_the_entrypoint_lands(where: str) -> None:
    """Ray's supervisor echoes the entrypoint into the driver log through a file buffer it flushes only once
    the driver runs (ray 2.60 dashboard/modules/job/job_supervisor.py, _exec_entrypoint), so the echo of a
    driver that writes at once can land after its lines (seen: a 4-line `python -c` among the last 20), or
    between a line and its newline (an unbuffered print writes them apart)."""
    entrypoint = _py("import sys\nfor i in range(30): print(f'step {i}')\nsys.exit(3)")
    echo = f"Running entrypoint for job sid: {entrypoint}\n"
    steps = "".join(f"step {i}\n" for i in range(30))
    log = "INFO job_manager.py:581 -- Runtime env is setting up.\n" + (
        steps + echo if where == "after its last line" else steps[:-1] + echo + "\n")
    job = JobDetails(type=JobType.SUBMISSION, submission_id="sid", entrypoint=entrypoint, driver_node_id="n",
                     status=JobStatus.FAILED)
    head = _LogCutByTheHead(log)
    assert log_tail(cast(JobSubmissionClient, head), job, 20) == [f"step {i}" for i in range(10, 30)]
    # The run supervisor's own client (the tail it records for a failed attempt) reads it alike.
    in_cluster = RayJobs("http://head")
    in_cluster.send = lambda method, path, data, content_type: (head._do_request(method, path).text.encode(), None)
    assert in_cluster.log_tail(job.dict(), lines=20) == [f"step {i}" for i in range(10, 30)]


def test_create_returns_once_the_run_survived_its_start_up_grace(props: Callable[..., dict[str, Any]]) -> None:
    started = time.monotonic()
    created = GrpoJobProvider().create(props(_py("import time; time.sleep(60)"), startup_grace_s=3.0))
    assert _outs_of(created)["status"] == "RUNNING"
    assert 3 <= time.monotonic() - started < 20
    GrpoJobProvider().delete(created.id, _outs_of(created))


def test_a_job_under_our_id_that_runs_something_else_is_not_adopted(
        ray_head: str, props: Callable[..., dict[str, Any]]) -> None:
    job_props = props(_py("print('ours')"), startup_grace_s=0.0)
    submission_id = GrpoJobProvider().create(job_props).id
    # Someone else's job under the id this spec would take (Ray ids say nothing about the job).
    other = {**job_props, "entrypoint": _py("print('theirs')")}
    squatter = JobSpec.from_props(other)
    JobSubmissionClient(ray_head).submit_job(entrypoint=_py("print('ours')") + " # edited",
                                             submission_id=squatter.submission_id, runtime_env={})
    with pytest.raises(RuntimeError) as raised:
        GrpoJobProvider().create(other)
    message = str(raised.value)
    assert message.startswith(f"GrpoJob {squatter.submission_id}: the head already has a job under this id "
                              "that runs something else, so it is not adopted.")
    assert "# edited" in message and "theirs" in message
    assert submission_id != squatter.submission_id


def test_ray_filling_in_runtime_env_config_defaults_does_not_block_adoption(
        props: Callable[..., dict[str, Any]]) -> None:
    job_props = props(_py("print('cfg')"), runtime_env={"config": {"setup_timeout_seconds": 600}},
                      startup_grace_s=0.0)
    assert GrpoJobProvider().create(job_props).id == GrpoJobProvider().create(job_props).id


def _cut_once_waiting(link: FlakyLink, monkeypatch: pytest.MonkeyPatch, for_s: float) -> list[float]:
    """Cuts the link for `for_s` seconds as soon as create waits for the run to complete (its start-up
    has no outage window, so a cut there is a different test); returns where the cut's time goes."""
    from components import job_polling

    waiting = threading.Event()
    await_completion = job_polling.await_completion

    def entered(spec: JobSpec, records: Any, submission_id: str) -> tuple[str, str]:
        waiting.set()
        return await_completion(spec, records, submission_id)

    monkeypatch.setattr(job_polling, "await_completion", entered)

    cut_at: list[float] = []

    def cut() -> None:
        if waiting.wait(300):
            link.up.clear()
            cut_at.append(time.monotonic())
            time.sleep(for_s)
            link.up.set()

    threading.Thread(target=cut, daemon=True).start()
    return cut_at


def test_wait_for_completion_rides_out_a_head_outage_within_its_window(
        ray_head: str, props: Callable[..., dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    link = FlakyLink(int(ray_head.rsplit(":", 1)[1]))
    link.up.set()
    job_props = props(_py("import time; time.sleep(12)"), dashboard_url=f"http://127.0.0.1:{link.port}",
                      startup_grace_s=0.0, wait_for_completion=True, poll_interval_s=0.5, outage_window_s=60.0)
    _cut_once_waiting(link, monkeypatch, 5.0)
    try:
        created = GrpoJobProvider().create(job_props)
    finally:
        link.close()
    assert _outs_of(created)["status"] == "SUCCEEDED"


def test_wait_for_completion_fails_once_the_head_is_lost_for_longer_than_its_window(
        ray_head: str, props: Callable[..., dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    link = FlakyLink(int(ray_head.rsplit(":", 1)[1]))
    link.up.set()
    job_props = props(_py("import time; time.sleep(60)"), dashboard_url=f"http://127.0.0.1:{link.port}",
                      startup_grace_s=0.0, wait_for_completion=True, poll_interval_s=0.5, outage_window_s=3.0,
                      ready_timeout_s=10.0)
    cut_at = _cut_once_waiting(link, monkeypatch, 600.0)
    try:
        with pytest.raises(RuntimeError, match=r"lost the Ray head for \d+ s \(outage_window_s=3\)"):
            GrpoJobProvider().create(job_props)
    finally:
        link.close()
    # A poll tries to reach the head for reach_timeout_s (min(REACH_TIMEOUT_S, ready_timeout_s)): the
    # first failed poll starts the outage clock, the next one past the window ends the wait.
    reach_s = JobSpec.from_props(job_props).reach_timeout_s
    assert time.monotonic() - cut_at[0] < 2 * reach_s + 3.0 + 5.0
    JobSubmissionClient(ray_head).stop_job(JobSpec.from_props(job_props).submission_id)


def test_create_refuses_to_start_a_second_live_run_of_the_same_stack(
        ray_head: str, props: Callable[..., dict[str, Any]]) -> None:
    first = GrpoJobProvider().create(props(_py("import time; time.sleep(600)"), startup_grace_s=0.0))
    second_props = props(_py("import time; time.sleep(601)"), startup_grace_s=0.0)
    try:
        with pytest.raises(RuntimeError) as raised:
            GrpoJobProvider().create(second_props)
        assert f"another run or a model export of stack {second_props['stack']} is live on {ray_head}: {first.id}." in str(raised.value)
        assert JobSpec.from_props(second_props).submission_id not in {
            j.submission_id for j in JobSubmissionClient(ray_head).list_jobs()}
    finally:
        GrpoJobProvider().delete(first.id, _outs_of(first))


def test_create_refuses_a_run_while_a_model_export_holds_a_gpu_node(
        ray_head: str, props: Callable[..., dict[str, Any]]) -> None:
    """An export (the supervisor's of the last run, or `verl-gke export`) merges on a GPU worker."""
    from workloads.export_model import SUBMISSION_PREFIX

    export_id = f"{SUBMISSION_PREFIX}run-0123-final-0"
    JobSubmissionClient(ray_head).submit_job(entrypoint=_py("import time; time.sleep(600)"), submission_id=export_id)
    run_props = props(_py("pass"), startup_grace_s=0.0)
    try:
        with pytest.raises(RuntimeError) as raised:
            GrpoJobProvider().create(run_props)
        assert f"another run or a model export of stack {run_props['stack']} is live on {ray_head}: {export_id}." \
            in str(raised.value)
    finally:
        client = JobSubmissionClient(ray_head)
        client.stop_job(export_id)
        deadline = time.monotonic() + 30  # the next test shares the head: the export must be over
        while not client.get_job_status(export_id).is_terminal():
            assert time.monotonic() < deadline, f"{export_id} still live 30 s after its stop"
            time.sleep(0.2)


def test_a_create_that_gives_up_on_a_pending_run_stops_it(ray_head: str, props: Callable[..., dict[str, Any]]) -> None:
    job_props = props(_py("import time; time.sleep(600)"), ready_timeout_s=0.3)
    with pytest.raises(TimeoutError, match=r"still PENDING after ready_timeout_s=0.3 s on .*; it was stopped"):
        GrpoJobProvider().create(job_props)
    status = JobSubmissionClient(ray_head).get_job_status(JobSpec.from_props(job_props).submission_id)
    assert str(status.value) == "STOPPED"
