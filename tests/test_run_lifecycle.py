"""The run record's compare-and-swap and claims, against the Kubernetes API stand-in (no Ray)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.kube_api import kube_api
from tests.ray_head import free_ports
from workloads import run_lifecycle
from workloads.run_lifecycle import Attempt, ConfigMapRecords, Conflict, KubernetesApi, RunRecord


def test_a_write_with_a_stale_resource_version_is_refused_and_update_reads_again():
    with kube_api() as (url, state):
        records = ConfigMapRecords(KubernetesApi(url), "ray", "rc-run")
        records.save({"a": RunRecord("a")}, None)
        stale = records.load()[1]
        records.save({"a": RunRecord("a", generation=1)}, stale)
        with pytest.raises(Conflict):
            records.save({"a": RunRecord("a", generation=2)}, stale)
        with pytest.raises(Conflict):
            records.save({"b": RunRecord("b")}, None)  # a second creator: 409 AlreadyExists
        assert records.update("a", lambda r: r and RunRecord("a", generation=r.generation + 5)).generation == 6
        puts = [r for r in state.requests if r[0] == "PUT"]
        assert all(r[3]["metadata"]["resourceVersion"] for r in puts)


def test_of_two_parties_claiming_the_same_attempt_one_wins_and_the_other_adopts():
    with kube_api() as (url, _):
        records = ConfigMapRecords(KubernetesApi(url), "ray", "rc-run")
        run_lifecycle.begin(records, "run-1", 0, time.time())
        results: dict[str, tuple[RunRecord, bool]] = {}
        start = threading.Barrier(2)

        def claim(by: str) -> None:
            start.wait()
            attempt = Attempt(0, "verl-grpo-s-0", by, time.time(), by)
            results[by] = run_lifecycle.claim(records, "run-1", attempt, 3600)

        threads = [threading.Thread(target=claim, args=(by,)) for by in ("pulumi-up", "supervisor")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(won for _, won in results.values()) == [False, True]
        stored = records.get("run-1")
        assert len(stored.attempts) == 1
        winner = next(by for by, (_, won) in results.items() if won)
        assert stored.attempts[0].by == winner
        assert stored.deadline == pytest.approx(stored.attempts[0].at + 3600)


def test_a_run_ended_by_a_delete_or_a_failed_deploy_is_reopened_a_finished_one_is_not():
    with kube_api() as (url, _):
        records = ConfigMapRecords(KubernetesApi(url), "ray", "rc-run")
        for outcome, reopened in ((run_lifecycle.DELETED, True), (run_lifecycle.DEPLOY_FAILED, True),
                                  ("succeeded", False), ("budget of 3600 s spent", False)):
            run_id = f"run-{abs(hash(outcome))}"
            run_lifecycle.begin(records, run_id, 0, time.time())
            run_lifecycle.end(records, run_id, outcome, time.time())
            assert run_lifecycle.begin(records, run_id, 0, time.time()).outcome == ("" if reopened else outcome)
            # A new generation (jobAttempt) always starts over.
            assert run_lifecycle.begin(records, run_id, 1, time.time()).outcome == ""


def test_an_older_generation_neither_starts_over_nor_reopens_a_newer_ones_record():
    from components.grpo_job import GrpoJobProvider

    with kube_api() as (url, _):
        records = ConfigMapRecords(KubernetesApi(url), "ray", "rc-run")
        run_lifecycle.begin(records, "r", 2, time.time())
        newer = run_lifecycle.end(records, "r", run_lifecycle.DEPLOY_FAILED, time.time())
        assert run_lifecycle.begin(records, "r", 1, time.time()) == newer
        # The job provider of a lowered jobAttempt refuses before it touches the cluster.
        props = {"dashboard_url": "http://127.0.0.1:9", "kube_api_url": url, "namespace": "ray", "run_record": "rc-run",
                 "run_id": "r", "attempt": 1, "entrypoint": "e", "runtime_env": {}}
        with pytest.raises(RuntimeError, match="^GrpoJob: run r is at jobAttempt 2 in its run record, above this "
                                               "stack's jobAttempt 1. Set verl-gke:jobAttempt back to 2, or above it to start a new generation.$"):
            GrpoJobProvider().create(props)
        assert records.get("r") == newer


def test_a_lowered_job_attempt_of_the_same_run_is_refused_before_anything_is_deleted():
    from components.grpo_job import GrpoJobProvider

    def failures(old: dict, new: dict) -> list[tuple[str, str]]:
        return [(f.property, f.reason) for f in GrpoJobProvider().check(old, new).failures]

    base = {"dashboard_url": "http://127.0.0.1:9", "entrypoint": "e", "runtime_env": {}, "run_id": "r"}
    # Check runs before the replace's delete: the live run is neither stopped nor left unreleased.
    assert failures({**base, "attempt": 3.0}, {**base, "attempt": 2}) == [
        ("attempt", "attempt = 2: below jobAttempt 3 of the deployed run r; set verl-gke:jobAttempt back to 3, "
                    "or above it to start a new generation")]
    assert failures({**base, "attempt": 2}, {**base, "attempt": 3}) == []
    assert failures({**base, "attempt": 3}, {**base, "run_id": "other", "attempt": 0}) == []  # a new run starts at 0
    assert failures({}, {**base, "attempt": 0}) == []  # the first create


@pytest.mark.parametrize("reopened_by", ["this create", "an earlier create that died"])
def test_a_failed_create_of_a_reopened_run_ends_it_again(reopened_by):
    """Its earlier attempts were stopped when it ended: left open, the supervisor would resubmit. The
    record says from which attempt the reopened run counts, whoever reopened it."""
    from components.grpo_job import GrpoJobProvider

    (closed,) = free_ports(1)
    with kube_api() as (url, _):
        records = ConfigMapRecords(KubernetesApi(url), "ray", "rc-run")
        run_lifecycle.begin(records, "r", 0, time.time())
        run_lifecycle.claim(records, "r", Attempt(index=0, submission_id="s0", by="pulumi-up", at=time.time(),
                                                  cause="first", submitted=True), 0.0)
        run_lifecycle.end(records, "r", run_lifecycle.DELETED, time.time(), released=True)
        if reopened_by != "this create":
            assert run_lifecycle.begin(records, "r", 0, time.time()).reopened_at == 1
        props = {"dashboard_url": f"http://127.0.0.1:{closed}", "kube_api_url": url, "namespace": "ray",
                 "run_record": "rc-run", "run_id": "r", "entrypoint": "e", "runtime_env": {}, "ready_timeout_s": 1}
        with pytest.raises(Exception, match="did not answer"):
            GrpoJobProvider().create(props)
        record = records.get("r")
        assert record is not None and record.outcome == run_lifecycle.DEPLOY_FAILED
        # A new generation counts from its first attempt.
        assert run_lifecycle.begin(records, "r", 1, time.time()).reopened_at == 0


def test_an_end_meant_for_one_generation_leaves_a_newer_one_open():
    records = run_lifecycle.MemoryRecords()
    run_lifecycle.begin(records, "r", 0, time.time())
    run_lifecycle.begin(records, "r", 1, time.time())  # `pulumi up` began jobAttempt 1 meanwhile
    assert run_lifecycle.end(records, "r", "stopped", time.time(), generation=0).outcome == ""
    assert run_lifecycle.end(records, "r", "stopped", time.time(), generation=1).outcome == "stopped"


def test_a_record_written_by_a_later_version_is_read_without_its_new_fields():
    text = ('{"run_id": "r", "generation": 2, "outcome": "", "added_later": 1, "attempts": '
            '[{"index": 0, "submission_id": "s0", "by": "supervisor", "at": 1.0, "cause": "c", "new": "x"}]}')
    record = RunRecord.from_json(text)
    assert (record.run_id, record.generation, record.attempts) == ("r", 2, (Attempt(0, "s0", "supervisor", 1.0, "c"),))
    assert json.loads(record.to_json())["reopened_at"] == 0
