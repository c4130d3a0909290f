"""The run lifecycle's rules, one test per rule and one per fault of the design's "Why" list (named
`test_item<N>_...`), against the real supervisor and provider steps in one process
(tests/run_world.py: the API server and KubeRay stand-in, the Ray job-table stand-in). Each item's
scenario failed on 0.5.1 (CHANGELOG.md, 0.6.0)."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from tests.kube_api import InProcessApi, KubeApiStandIn
from tests.run_world import NS, OUTPUTS, RC, RC_PATH, World, run_spec
from verl_gke.runs import BucketCopy, Run, RunEnded, follow, stop
from workloads import run_lifecycle
from workloads.kube import Invalid, cluster_state
from workloads.run_lease import DECIDE_MARGIN_S, HANDOVER_ANNOTATION, LEASE_DURATION_S, Lease, LeaseLost
from workloads.run_lifecycle import (
    DELETED,
    DEPLOY_FAILED,
    SUCCEEDED,
    UNANSWERED,
    UNTRACED,
    USER_STOPPED,
    Capacity,
    Effect,
    Policy,
    View,
    decide,
    log_state,
)
from workloads.run_record import (
    ENDED_KEPT,
    MAX_RECORD_BYTES,
    RECORD_KEY,
    Attempt,
    Ended,
    Gone,
    Outcome,
    RecordStore,
    RunRecord,
    record_name,
    to_prune,
)
from workloads.run_supervisor import STEP_BACKOFF_CAP_S, run_forever

LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{RC}-decider"


def steps(world: World, rounds: int = 1, seconds: float = 15.0) -> None:
    """Every supervisor takes a step, then time passes."""
    for _ in range(rounds):
        for decider in list(world.supervisors.values()):
            decider.step()
        world.passes(seconds)


def pulumi_up(world: World, kind: str = "create", between: object = None, skew: int = 1) -> str:
    """A whole create or delete; `between(label)` runs after each of its steps (another process's turn)."""
    world.start_provider(kind, skew)
    while True:
        label = world.provider_step()
        if label in ("done", "failed"):
            return label
        if callable(between):
            between(label)
        world.passes(1.0)


def record(world: World, run_id: str = "run-a") -> RunRecord:
    found = world.records()[run_id]
    assert found is not None
    return found


def deployed(**budget: float) -> World:
    """A stack whose first `pulumi up` went through: attempt 0 RUNNING, the supervisor holding the Lease."""
    world = World()
    world.budget_s = budget.get("budget_s", 0.0)
    world.desired = run_spec("run-a", 0, world.budget_s)
    world.runs = {"run-a/0": world.desired}
    world.start_supervisor(0, 0)
    assert pulumi_up(world) == "done"
    steps(world)
    assert world.head.live() == [world.desired.submission_ids[0]]
    return world


# --- the Lease ---------------------------------------------------------------------------------------


def test_expiry_is_judged_on_the_observers_clock_not_the_renew_time():
    kube = KubeApiStandIn()
    now = {"a": 0.0, "b": 5_000.0}
    a = Lease(InProcessApi(kube), NS, RC, "supervisor/a", clock=lambda: now["a"], log=lambda _: None)
    b = Lease(InProcessApi(kube), NS, RC, "supervisor/b", clock=lambda: now["b"], log=lambda _: None)
    assert a.hold() and not b.hold()
    # A renewTime from a clock far in the past (another machine's) changes nothing: only versions count.
    kube.objects[LEASE]["spec"]["renewTime"] = "1970-01-01T00:00:00.000000Z"
    now["b"] += LEASE_DURATION_S - 1
    assert not b.hold()
    now["b"] += 1
    assert b.hold() and kube.objects[LEASE]["spec"]["holderIdentity"] == "supervisor/b"


def test_a_holder_that_cannot_renew_stops_acting_before_anyone_may_take_over():
    """Clocks 1% apart, the worst NTP allows: the holder's last action lands before the observer's
    expiry (DECIDE_MARGIN_S covers a request's timeout and the rate)."""
    kube = KubeApiStandIn()
    t = [0.0]
    holder_api = InProcessApi(kube)
    holder = Lease(holder_api, NS, RC, "supervisor/slow", clock=lambda: 0.99 * t[0], log=lambda _: None)
    observer = Lease(InProcessApi(kube), NS, RC, "supervisor/fast", clock=lambda: 1.01 * t[0], log=lambda _: None)
    assert holder.hold() and not observer.hold()
    holder_api.down = True  # a partition: the holder cannot renew
    while holder.valid():
        t[0] += 0.5
        assert not observer.hold()
    last_action_lands = t[0] + 30.0  # an action checked at the last valid instant, in flight up to its timeout
    while not observer.hold():
        t[0] += 0.5
    assert t[0] > last_action_lands
    assert DECIDE_MARGIN_S == 35.0


def test_item6_a_deleted_lease_stops_its_holder_at_its_next_action_not_when_its_clock_runs_out():
    """Issue 47 item 6: `kubectl delete lease` (a namespace clean-up) while `pulumi up` holds it. A supervisor
    creates it anew and decides; the former holder, valid for up to 55 s more by its own clock, reads the
    Lease back before its next action (one GET) and stops there."""
    kube = KubeApiStandIn()
    t = [0.0]
    apis = [InProcessApi(kube), InProcessApi(kube)]
    up = Lease(apis[0], NS, RC, "pulumi-up/laptop", clock=lambda: t[0], log=lambda _: None)
    supervisor = Lease(apis[1], NS, RC, "supervisor/pod", clock=lambda: t[0], log=lambda _: None)
    up.acquire(wait_s=0.0)
    up.check()
    kube.handle("DELETE", LEASE, {}, None)
    t[0] += 1.0
    assert supervisor.hold() and up.valid()  # the former holder's clock alone would let it act on
    with pytest.raises(LeaseLost):
        up.check()
    assert not up.valid()
    # Gone with no new holder yet: it stops too (a step's hold() may take it anew, as any process may).
    kube.handle("DELETE", LEASE, {}, None)
    with pytest.raises(LeaseLost):
        supervisor.check()


def test_pulumi_up_asks_the_supervisor_which_hands_the_lease_over_at_its_next_step():
    world = World()
    world.start_supervisor(0, 0)
    steps(world)
    world.start_provider("create", 1)
    assert world.provider_step() == "asked for the Lease"
    assert world.kube.objects[LEASE]["metadata"]["annotations"][HANDOVER_ANNOTATION].startswith("pulumi-up/")
    assert world.provider_step() == "waiting for the Lease"
    assert world.supervisors[0].step() is False  # starts nothing new: hands over
    assert world.provider_step() == "acquired"
    assert world.deciders() == ["pulumi up"]
    while world.provider_step() not in ("done", "failed"):
        pass
    assert world.kube.objects[LEASE]["spec"]["holderIdentity"] == ""  # left free: the supervisor takes it at once
    assert world.supervisors[0].step() is True


def test_pulumi_up_takes_a_dead_holders_lease_after_expiry_and_says_what_it_waits_for():
    world = World()
    world.start_supervisor(0, 0)
    steps(world)
    del world.supervisors[0]  # dies holding the Lease
    world.start_provider("create", 1)
    labels = [world.provider_step()]
    while labels[-1] != "acquired":
        world.passes(15.0)
        labels.append(world.provider_step())
    assert labels[:2] == ["asked for the Lease", "waiting for the Lease"]
    assert any(line.startswith("waiting for supervisor/pod-0/") for line in world.log)
    assert 90 <= world.t <= 120


# --- the records ------------------------------------------------------------------------------------


def test_one_record_per_run_found_by_its_labels():
    world = deployed()
    assert pulumi_up(world, "delete", skew=2) == "done"
    world.desired = run_spec("run-b", 0)
    world.runs["run-b/0"] = world.desired
    assert pulumi_up(world) == "done"
    names = sorted(p.rsplit("/", 1)[1] for p in world.kube.objects if "/configmaps/" in p)
    assert names == sorted([record_name(RC, "run-a"), record_name(RC, "run-b")])
    assert sorted(world.records()) == ["run-a", "run-b"]


def test_a_record_is_bounded_before_it_is_written():
    big = RunRecord("r", decisions=tuple("x" * 290 for _ in range(20)), attempts=tuple(
        Attempt(i, f"s{i}", "supervisor", "run-failed", "y" * 500) for i in range(13)))
    assert len(big.to_json()) < MAX_RECORD_BYTES
    assert len(big.decided("z" * 1000).decisions) == 20 and len(big.decided("z" * 1000).decisions[-1]) == 300


def test_the_api_servers_1_mib_limit_is_422_not_a_conflict():
    api = InProcessApi(KubeApiStandIn())
    with pytest.raises(Invalid, match="at most 1048576 bytes"):
        api.request("POST", f"/api/v1/namespaces/{NS}/configmaps", {
            "kind": "ConfigMap", "metadata": {"name": "big"}, "data": {"a": "x" * (1024 * 1024)}})
    # A record over the cap is refused before it is sent (the decider bounds what it writes).
    store = RecordStore(api, NS, RC)
    with pytest.raises(Invalid, match=f"over {MAX_RECORD_BYTES} bytes"):
        store.write(store.get("r"), RunRecord("r", attempts=(Attempt(0, "s0", "x", "y", "z" * MAX_RECORD_BYTES),)))


def test_a_put_answered_404_is_gone_never_success():
    kube = KubeApiStandIn()
    store = RecordStore(InProcessApi(kube), NS, RC)
    stored = store.write(store.get("r"), RunRecord("r"))
    kube.handle("DELETE", f"/api/v1/namespaces/{NS}/configmaps/{stored.name}", {}, None)
    with pytest.raises(Gone):
        store.write(stored, RunRecord("r", generation=1))


def test_a_delete_with_a_uid_precondition_leaves_a_recreated_record_alone():
    kube = KubeApiStandIn()
    store = RecordStore(InProcessApi(kube), NS, RC)
    old = store.write(store.get("r"), RunRecord("r"))
    store.delete(old)
    new = store.write(store.get("r"), RunRecord("r", generation=1))
    with pytest.raises(run_lifecycle.Conflict):
        store.delete(old)
    assert store.get("r").record == new.record


def test_pruning_keeps_every_open_run_and_the_newest_ended_ones():
    kube = KubeApiStandIn()
    store = RecordStore(InProcessApi(kube), NS, RC)
    for i in range(ENDED_KEPT + 3):
        store.write(store.get(f"old-{i:02d}"), RunRecord(f"old-{i:02d}", outcome=run_lifecycle.SUCCEEDED, released=True))
    store.write(store.get("open"), RunRecord("open"))
    pruned = sorted(s.run_id for s in to_prune(store.list()))
    assert pruned == ["old-00", "old-01", "old-02"]


def test_a_record_of_0_5_1_is_read_once_and_converted():
    text = json.dumps({"run_id": "r", "generation": 1, "reopened_at": 1, "deadline": 1.7e9, "outcome": "",
                       "attempts": [{"index": 0, "submission_id": "s0", "by": "pulumi-up", "at": 1.7e9,
                                     "cause": "pulumi-up", "submitted": True},
                                    {"index": 1, "submission_id": "s1", "by": "supervisor", "at": 1.7e9,
                                     "cause": "node-lost", "submitted": True}]})
    converted = RunRecord.from_json(text)
    assert (converted.generation, converted.opened_at, [a.submission_id for a in converted.attempts]) == (1, 1,
                                                                                                          ["s0", "s1"])
    assert converted.budget_used_s == 0.0  # a wall-clock deadline is not carried over


# Every outcome 0.8.0 wrote as free text, and what it now is: the decider makes each of them (its tests pin them).
OUTCOMES_0_8_0 = [
    ("succeeded", SUCCEEDED),
    ("stopped by pulumi (delete or replace)", DELETED),
    ("stopped by verl-gke stop", USER_STOPPED),
    ("verl-grpo-a4-0123456789ab-1 was stopped", run_lifecycle.stopped_outside("verl-grpo-a4-0123456789ab-1")),
    ("budget of 3600 s spent", run_lifecycle.budget_spent(3600.0)),
    ("lost: no record of it and no job of it on the Ray head", UNTRACED),
    ("lost: no record of it, and the Ray head did not answer", UNANSWERED),
    ("lost: the Ray head did not answer for 905 s", run_lifecycle.head_outage(905.0)),
    ("deploy failed before any attempt ran", DEPLOY_FAILED),
    ("attempt 1 (s1) was claimed and never submitted",
     Outcome(Ended.FAILED, "NeverSubmitted", "attempt 1 (s1) was claimed and never submitted")),
    ("jobAttempt 0 of run-a ended while the stack names jobAttempt 1 of run-a, so none of its attempts is "
     "resubmitted: s0 FAILED", Outcome(Ended.FAILED, "NoLongerNamed", "jobAttempt 0 of run-a ended while the stack "
                                       "names jobAttempt 1 of run-a, so none of its attempts is resubmitted: s0 FAILED")),
    ("failed by itself 2 times: OOM\nKilled", Outcome(Ended.FAILED, "RetriesSpent", "failed by itself 2 times: OOM\nKilled")),
    ("no submission id left after 4 attempts",
     Outcome(Ended.FAILED, "SubmissionIdsSpent", "no submission id left after 4 attempts")),
    ("lost nodes 2 times", Outcome(Ended.FAILED, "PreemptionsSpent", "lost nodes 2 times")),
    ("the cluster was not whole within 600 s (1 of 2 GPU workers, 8 of 16 GPUs)",
     Outcome(Ended.FAILED, "CapacityTimeout", "the cluster was not whole within 600 s (1 of 2 GPU workers, 8 of 16 GPUs)")),
    ("something a hand wrote", Outcome(Ended.FAILED, "Unrecognized", "something a hand wrote")),
]


@pytest.mark.parametrize(("text", "outcome"), OUTCOMES_0_8_0)
def test_a_record_of_0_8_0_with_free_text_reads_as_state_reason_and_message(text: str, outcome: Outcome):
    written = json.dumps({"version": 2, "run_id": "r", "outcome": text, "released": True, "attempts": []})
    read = RunRecord.from_json(written)
    assert read.outcome == outcome
    # Written again: 0.8.0's text stays under `outcome` (a 0.8.0 reader during a rolling upgrade reads it).
    again = json.loads(read.to_json())
    assert (again["outcome"], again["outcome_state"], again["outcome_reason"]) == (text, outcome.state.name,
                                                                                   outcome.reason)
    assert RunRecord.from_json(read.to_json()) == read and str(outcome) == text


def test_an_open_run_has_no_outcome_in_any_version():
    assert RunRecord.from_json(json.dumps({"version": 2, "run_id": "r", "outcome": ""})).outcome is None
    assert json.loads(RunRecord("r").to_json())["outcome"] == ""


def test_no_outcome_is_classified_by_its_words():
    """The state decides (`wait`'s exit, grpoJobStatus, reopening); only run_record.py reads 0.8.0's words."""
    from pathlib import Path

    root = Path(__file__).parent.parent
    found = [f"{path.relative_to(root)}:{n}" for folder in ("workloads", "components", "verl_gke")
             for path in sorted((root / folder).rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"outcome\b[^#]*\.(startswith|endswith|removeprefix|removesuffix)\(", line)]
    assert found == []


# --- decide, rule by rule ------------------------------------------------------------------------------


POLICY = Policy(run_id="r", generation=0, submission_ids=("s0", "s1", "s2", "s3"), expected_workers=2,
                expected_gpus=16, max_retries=1, max_preemptions=2, backoff_s=30.0, settle_s=15.0,
                capacity_timeout_s=600.0, head_outage_s=900.0, stall_s=3600.0, replace_window_s=120.0)
RUNNING_0 = RunRecord("r", attempts=(Attempt(0, "s0", "pulumi-up", "pulumi-up", dead_nodes=0, submitted=True),))


def job(sid: str, status: str, **more: object) -> dict:
    return {"submission_id": sid, "status": status, "metadata": {"verl-gke.run_id": "r", "verl-gke.generation": "0",
                                                                  "verl-gke.attempt": sid[1:]}, **more}


def view(record: RunRecord, jobs: dict | None, **more: object) -> View:
    base = {"records": {record.run_id: record}, "policy": POLICY, "jobs": jobs,
            "capacity": Capacity(workers=2, gpus=16, dead=0), "cluster": "running", "elapsed_s": 15.0}
    return View(**{**base, **more})  # type: ignore[arg-type]


def test_a_begun_run_nobody_claimed_is_a_failed_deploy_once_the_decider_holds_the_lease():
    changed, effects = decide(view(RunRecord("r"), {}))
    # No job on the head: released in the same step.
    assert (changed["r"].outcome, changed["r"].released) == (DEPLOY_FAILED, True)
    assert [e.kind for e in effects] == ["suspend"]


def test_a_live_attempt_is_left_alone():
    assert decide(view(RUNNING_0, {"s0": job("s0", "RUNNING")})) == ({}, [])


def test_the_next_attempt_waits_for_a_whole_cluster_then_is_claimed_before_it_is_submitted():
    failed = {"s0": job("s0", "FAILED", message="worker died")}
    short = Capacity(workers=1, gpus=8, dead=1)
    changed, effects = decide(view(RUNNING_0, failed, capacity=short, ended_for_s={"s0": 20.0}))
    assert changed["r"].waiting_s > 0 and effects == []
    changed, effects = decide(view(changed["r"], failed, ended_for_s={"s0": 40.0},
                                   capacity=Capacity(workers=2, gpus=16, dead=1)))
    assert [(a.index, a.cause, a.submitted) for a in changed["r"].attempts] == [(0, "pulumi-up", True),
                                                                              (1, "node-lost", False)]
    assert [(e.kind, e.submission_id) for e in effects] == [("submit", "s1")]


def test_the_capacity_wait_is_bounded_by_its_accumulator():
    waiting = replace(RUNNING_0, waiting_s=590.0)
    changed, _ = decide(view(waiting, {"s0": job("s0", "FAILED")}, capacity=Capacity(1, 8, 1),
                             ended_for_s={"s0": 999.0}))
    assert changed["r"].outcome == Outcome(Ended.FAILED, "CapacityTimeout", "the cluster was not whole within 600 s "
                                                                            "(1 of 2 GPU workers, 8 of 16 GPUs)")


def test_a_run_that_failed_by_itself_waits_its_backoff_on_the_deciders_own_clock():
    failed = {"s0": job("s0", "FAILED", message="OOM")}
    assert decide(view(RUNNING_0, failed, ended_for_s={"s0": 29.0})) == ({}, [])
    changed, effects = decide(view(RUNNING_0, failed, ended_for_s={"s0": 30.0}))
    assert changed["r"].attempts[-1].cause == "run-failed" and effects[0].kind == "submit"


def test_a_head_that_does_not_answer_is_neither_live_nor_ended_until_its_bound():
    changed, effects = decide(view(RUNNING_0, None))
    assert changed["r"].outage_s == 15.0 and not changed["r"].outcome and effects == []
    changed, effects = decide(view(replace(RUNNING_0, outage_s=890.0), None))
    assert changed["r"].outcome == Outcome(Ended.LOST, "HeadOutage", "the Ray head did not answer for 905 s")
    assert changed["r"].released and [e.kind for e in effects] == ["suspend"]  # past the bound: released


def test_an_ended_runs_outage_restarts_when_the_head_answers():
    """docs/run-lifecycle.md: `outage_s` is reset when the head answers, for a run that ended while the head
    was silent (a stop) and waits for its release too: a later silence counts from zero, not on top."""
    stopped = replace(run_lifecycle.ended(RUNNING_0, USER_STOPPED), outage_s=600.0)
    changed, _ = decide(view(stopped, {"s0": job("s0", "RUNNING"), "x9": {"submission_id": "x9", "status": "RUNNING"}}))
    assert changed["r"].outage_s == 0.0 and not changed["r"].released


def test_the_release_waits_for_the_outage_bound_on_every_ended_runs_own_count():
    """An ended run's outage count starts at its record (docs/run-lifecycle.md: reset when the head answers):
    a run begun during the silence (a create whose submit the head may have taken before it went silent)
    has seen less of it. The GPUs go once the shortest count reaches the bound, not the longest."""
    old = replace(run_lifecycle.ended(replace(RUNNING_0, run_id="old"), USER_STOPPED), outage_s=890.0)
    new = replace(run_lifecycle.ended(RUNNING_0, DEPLOY_FAILED), outage_s=15.0)
    silent = view(new, None, records={"old": old, "r": new})
    changed, effects = decide(silent)
    assert ({k: (r.outage_s, r.released) for k, r in changed.items()}, effects) == (
        {"old": (905.0, False), "r": (30.0, False)}, [])
    later = view(new, None, records={"old": replace(old, outage_s=1775.0), "r": replace(new, outage_s=885.0)})
    changed, effects = decide(later)
    assert ({k: (r.outage_s, r.released) for k, r in changed.items()}, effects) == (
        {"old": (1790.0, True), "r": (900.0, True)}, [Effect("suspend")])


def test_the_driver_log_tells_the_step_and_a_save_under_way():
    assert log_state(["step:3 - a:1", "local_global_step_folder: /ck/global_step_4"]) == run_lifecycle.LogState(3, True)
    assert log_state(["local_global_step_folder: x", "step:4 - a:1"]) == run_lifecycle.LogState(4, False)
    assert log_state(["nothing"]) == run_lifecycle.LogState(None, False)


# --- the faults of the design's "Why" list, each as it happened -----------------------------------------


def test_item1_a_same_run_replace_keeps_its_gpus_and_its_run():
    """A replace (delete, then create) of the same run with a supervisor step in between, and during
    the create's gates: 0.5.1 recorded "was stopped", released, and the create's claim lost ("Bump
    jobAttempt"); now the run is reopened, the GPUs stay for the replace window, and nothing is
    resubmitted while `pulumi up` holds the Lease."""
    world = deployed()
    first = world.desired.submission_ids[0]
    assert pulumi_up(world, "delete") == "done"
    assert record(world).outcome == DELETED and world.head.jobs[first]["status"] == "STOPPED"
    steps(world, rounds=2)  # the supervisor's steps between the delete and the create
    assert world.suspended() is False and not record(world).released  # the replace window
    assert pulumi_up(world, between=lambda _label: world.supervisors[0].step()) == "done"
    now = record(world)
    assert (now.outcome, now.opened_at, [a.index for a in now.opened]) == (None, 1, [1])
    assert world.head.live() == [world.desired.submission_ids[1]] and world.suspended() is False
    # A run stopped by a delete whose create never came: released once the window passed.
    assert pulumi_up(world, "delete") == "done"
    steps(world, rounds=10)
    assert record(world).released and world.suspended() is True


def test_item1_variant_an_old_attempt_that_failed_is_not_resubmitted_during_the_gates():
    world = deployed()
    world.head.finish(world.desired.submission_ids[0], "FAILED", 1)
    labels: list[str] = []

    def supervisor_between(label: str) -> None:
        labels.append(label)
        world.passes(60.0)  # the gates (the fabric check) take minutes
        world.supervisors[0].step()

    assert pulumi_up(world, "delete") == "done"
    assert pulumi_up(world, between=supervisor_between) == "done"
    assert [a.by for a in record(world).attempts] == ["pulumi-up", "pulumi-up"]
    assert len(world.live_attempts()) == 1


def test_item2_a_claim_whose_claimer_died_is_submitted_under_its_own_id_once():
    """0.5.1: after 120 s `pulumi up` claimed k+1 beside the dead supervisor's k, which another read
    then submitted: two live attempts. Now whoever decides next submits k itself, never k+1."""
    world = deployed()
    world.head.lose_worker()
    world.head.workers = 2
    original = world.supervisors[0].hands.submit

    def dies_before_submitting(*_args: object) -> None:
        raise SystemExit("OOM-killed between the claim and the submission")

    world.supervisors[0].hands.submit = dies_before_submitting  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        steps(world, rounds=3)
    claimed = record(world).attempts[-1]
    assert (claimed.index, claimed.submitted) == (1, False) and not world.head.live()
    del world.supervisors[0]
    world.passes(200.0)  # far past 0.5.1's claim grace
    assert pulumi_up(world) == "done"  # the stack's next `up` (or the next supervisor: the same rule)
    assert world.head.live() == [claimed.submission_id]
    assert [a.submission_id for a in record(world).attempts] == list(world.desired.submission_ids[:2])
    assert original is not None


def test_item3_a_run_whose_id_changed_mid_up_is_watched_to_its_end_and_released():
    """The supervisor's config rolls to run-b, the `up` fails before the job's replace: 0.5.1's new
    supervisor found no record of run-b and left run-a unsupervised; now run-a is watched: never
    resubmitted, ended when its attempt ends, then released."""
    world = deployed()
    world.desired = run_spec("run-b", 0)
    world.runs["run-b/0"] = world.desired
    world.supervisors.clear()  # killed: its Lease expires
    world.start_supervisor(0, 2)
    steps(world, rounds=8)
    assert world.head.live() == [run_spec("run-a", 0).submission_ids[0]]
    world.head.lose_worker()
    world.head.workers = 2
    steps(world, rounds=4)
    assert not world.head.live()  # no resubmission of a run the stack no longer names
    assert record(world).outcome == Outcome(Ended.FAILED, "NoLongerNamed", (
        f"jobAttempt 0 of run-a ended while the stack names jobAttempt 0 of run-b, so none of its attempts is "
        f"resubmitted: {run_spec('run-a', 0).submission_ids[0]} FAILED"))
    assert record(world).released and world.suspended() is True


def test_item4_a_second_supervisor_never_undoes_a_release():
    """0.5.1: a stale read of a second replica un-suspended the cluster after the other released it."""
    world = deployed()
    world.start_supervisor(1, 3)  # a hand scale, or a pod replaced on a NotReady node
    world.head.finish(world.desired.submission_ids[0], "STOPPED")
    steps(world, rounds=3)
    assert record(world).released and world.suspended() is True
    steps(world, rounds=20)
    assert world.suspended() is True
    assert len([line for line in world.log if "took Lease" in line]) == 1  # the first one decides throughout


def test_item5_an_unreachable_head_is_not_released_under_a_live_job_nor_kept_forever():
    world = deployed()
    world.set_link(False)
    steps(world, rounds=50)  # 750 s: under the 900 s bound
    assert not record(world).outcome and world.suspended() is False
    steps(world, rounds=12)
    assert (record(world).outcome.state, record(world).outcome.reason) == (Ended.LOST, "HeadOutage")
    assert record(world).released and world.suspended() is True


def test_item5_the_exports_bound_is_checked_before_the_head_is_asked():
    world = deployed()
    world.head.finish(world.desired.submission_ids[0], "SUCCEEDED")
    steps(world)
    assert record(world).export_id and world.head.live() == [record(world).export_id]
    world.set_link(False)  # the head never answers again
    config = world.configs[0]
    steps(world, rounds=int(config.export_timeout_s // 15) + 2)
    assert record(world).export_outcome == f"FAILED: not done within {config.export_timeout_s:g} s"
    assert record(world).released and world.suspended() is True


def test_item5_a_released_cluster_is_not_suspended_again_while_an_unreachable_head_may_run_a_lost_record():
    """Every record ended and released, a new run's record deleted while it trains, and its head
    unreachable: 0.6.0 suspended the cluster at once ("a release is final") under the live attempt;
    now the cluster goes only once the head answers with no job live, or past the outage bound."""
    world = deployed()
    world.head.finish(world.desired.submission_ids[0], "STOPPED")
    steps(world, rounds=2)
    assert record(world).released and world.suspended() is True
    world.desired = run_spec("run-b", 0)
    world.runs["run-b/0"] = world.desired
    world.supervisors.clear()
    world.start_supervisor(0, 2)
    steps(world, rounds=8)
    assert pulumi_up(world) == "done"
    assert world.head.live() == [world.desired.submission_ids[0]]
    world.kube.handle("DELETE", f"/api/v1/namespaces/{NS}/configmaps/{record_name(RC, 'run-b')}", {}, None)
    world.set_link(False)
    steps(world, rounds=2)
    assert world.suspended() is False and not world.suspended_under
    steps(world, rounds=59)  # the outage bound (900 s here): the run behind the head is lost, the GPUs go
    assert world.suspended() is True


def test_item6_a_deleted_record_of_a_live_run_is_rebuilt_from_the_head():
    world = deployed()
    path = next(p for p in world.kube.objects if "/configmaps/" in p)
    world.kube.handle("DELETE", path, {}, None)
    steps(world)
    rebuilt = record(world)
    assert [a.submission_id for a in rebuilt.attempts] == [world.desired.submission_ids[0]]
    assert "record rebuilt from the head's job table (1 attempts)" in rebuilt.decisions[-1]
    world.head.finish(world.desired.submission_ids[0], "STOPPED")
    steps(world, rounds=2)
    assert record(world).released and world.suspended() is True


@pytest.mark.parametrize("how", ["not JSON", "immutable"])
def test_item6_a_broken_record_is_replaced_not_retried_forever(how: str):
    world = deployed()
    path = next(p for p in world.kube.objects if "/configmaps/" in p)
    if how == "not JSON":
        world.kube.objects[path]["data"] = {RECORD_KEY: "{broken"}
    else:
        world.kube.objects[path]["immutable"] = True
    steps(world)
    assert not world.kube.objects[path].get("immutable")
    assert [a.submission_id for a in record(world).attempts] == [world.desired.submission_ids[0]]


def test_item6_a_claim_against_a_record_deleted_mid_write_submits_nothing():
    """0.5.1 took a PUT answered 404 for success: its claim "won" and submitted."""
    world = deployed()
    world.head.lose_worker()  # a preemption: the next attempt is claimed once the node is back
    world.head.workers = 2
    decider = world.supervisors[0]
    steps(world, rounds=1)  # sees it ended (the settle runs on its own clock)
    write = decider.records.write

    def deleted_meanwhile(stored, new):  # type: ignore[no-untyped-def]
        world.kube.handle("DELETE", f"/api/v1/namespaces/{NS}/configmaps/{stored.name}", {}, None)
        return write(stored, new)

    decider.records.write = deleted_meanwhile  # type: ignore[method-assign]
    world.passes(60.0)
    with pytest.raises(Gone):
        decider.step()  # the claim's PUT is answered 404
    assert not world.head.live() and world.records() == {}


def test_item6_a_deleted_record_is_rebuilt_when_the_head_forgot_the_earlier_attempts():
    """The head restarted once (attempt 0 gone from its table; the supervisor resubmitted attempt 1),
    then the record was deleted: the rebuilt record keeps attempt 1 in its place, so the live run is
    supervised (0.6.0 rebuilt nothing from a table that starts at attempt 1: a live run without a
    decider, found by the interleaving exploration)."""
    world = deployed()
    ids = world.desired.submission_ids
    world.head.restart()
    steps(world, rounds=2)
    assert world.head.live() == [ids[1]]
    path = next(p for p in world.kube.objects if "/configmaps/" in p)
    world.kube.handle("DELETE", path, {}, None)
    steps(world)
    rebuilt = record(world)
    assert ([a.submission_id for a in rebuilt.attempts], rebuilt.opened_at, rebuilt.outcome) == (["", ids[1]], 1, None)
    world.head.lose_worker()  # supervised: the next attempt follows once the node is back
    world.head.workers = 2
    steps(world, rounds=3)
    assert world.head.live() == [ids[2]] and [a.submission_id for a in record(world).opened] == list(ids[1:3])


def test_item6_a_create_after_the_record_was_lost_adopts_the_live_attempt():
    """The record deleted, and `pulumi up`'s create comes before the supervisor rebuilds it: the create
    begins the run again and names the attempt the head runs, instead of a run with none (which its
    decider would end as a failed deploy under the live attempt)."""
    world = deployed()
    ids = world.desired.submission_ids
    world.kube.handle("DELETE", f"/api/v1/namespaces/{NS}/configmaps/{record_name(RC, 'run-a')}", {}, None)
    assert pulumi_up(world) == "done"
    assert [a.submission_id for a in record(world).attempts] == [ids[0]] and world.head.live() == [ids[0]]
    steps(world, rounds=3)
    assert not record(world).outcome and world.head.live() == [ids[0]]


def test_item6_a_record_lost_twice_never_leads_to_two_live_attempts():
    """The record lost while the head knows only a later, ended attempt (the head restarted once):
    the create that begins the run again claims past every index the head knows, so a second loss
    cannot put an older live attempt behind a newer ended one (0.6.0 reused attempt 0's id, then
    claimed attempt 2 beside it: two live attempts, found by the interleaving exploration)."""
    world = deployed()
    ids = world.desired.submission_ids
    world.head.restart()
    steps(world, rounds=2)
    world.head.finish(ids[1], "FAILED", 1)
    del world.supervisors[0]  # no retry from it: the stack's next `up` decides
    records = f"/api/v1/namespaces/{NS}/configmaps/{record_name(RC, 'run-a')}"
    world.kube.handle("DELETE", records, {}, None)
    assert pulumi_up(world) == "done"
    assert world.head.live() == [ids[2]]
    assert [a.submission_id for a in record(world).attempts] == ["", ids[1], ids[2]]
    world.kube.handle("DELETE", records, {}, None)
    assert pulumi_up(world) == "done"
    assert world.head.live() == [ids[2]] and record(world).attempts[-1].submission_id == ids[2]


def test_item6_a_record_deleted_while_its_head_lost_its_job_table_still_releases_the_gpus():
    """The record deleted and the head restarted (the attempt's driver died with its job table):
    nothing to rebuild from. 0.6.0 kept the GPUs up until the next `pulumi up` or `destroy`; now the
    stack's run is recorded lost and the GPUs are released once the replace window (120 s here)
    has passed with GPU workers up, no record and nothing on the head."""
    world = deployed()
    path = next(p for p in world.kube.objects if "/configmaps/" in p)
    world.kube.handle("DELETE", path, {}, None)
    world.head.restart()
    steps(world, rounds=7)  # the first step after the loss counts from its previous one: 105 s
    lost = record(world)
    assert (lost.run_id, lost.generation, lost.outcome, lost.released, lost.stopped_s) == (
        "run-a", 0, UNTRACED, False, 105.0)
    assert world.suspended() is False
    steps(world)  # 120 s: the window has passed
    assert record(world).released and world.suspended() is True
    assert "no record of run-a and no job of it on the Ray head with 2 GPU workers up" in record(world).decisions[0]
    steps(world, rounds=20)
    assert world.suspended() is True and record(world).outcome == UNTRACED


def test_item6_a_record_deleted_while_its_head_never_answers_again_still_releases_the_gpus():
    """The record deleted while the head does not answer (a NetworkPolicy edit, a broken port; its
    pods, and maybe the attempt, still there). 0.6.0 counted the outage only on a record, so nothing
    counted toward a release: GPUs up until the next `pulumi up`. Now, after the replace window of
    no record and no answer (the holder's own count), the stack's run is recorded lost with the outage
    counted so far, and the GPUs go once the head has not answered for runHeadOutageSeconds (900 s
    here), as for a run with a record."""
    world = deployed()
    attempt = world.desired.submission_ids[0]
    world.set_link(False)
    path = next(p for p in world.kube.objects if "/configmaps/" in p)
    world.kube.handle("DELETE", path, {}, None)
    steps(world, rounds=7)  # 105 s counted (the first step after the loss counts from its previous one)
    assert world.records() == {}
    steps(world)  # 120 s: the replace window
    lost = record(world)
    assert (lost.outcome, lost.released, lost.outage_s, lost.stopped_s, lost.attempts) == (
        UNANSWERED, False, 120.0, 0.0, ())
    assert "no record of run-a and the Ray head has not answered for 120 s" in lost.decisions[0]
    steps(world, rounds=51)  # 885 s: the head may still run the attempt; nothing is suspended
    assert world.suspended() is False and not record(world).released
    steps(world)  # 900 s without an answer: the bound
    assert record(world).released and world.suspended() is True
    steps(world, rounds=10)
    assert world.suspended() is True and record(world).outcome == UNANSWERED
    assert (world.suspended_under, world.lost_under) == ([], [attempt])  # past the stated bound: lost


def test_a_run_recorded_unanswered_adopts_its_attempt_when_the_head_answers_again():
    """The head answers again before the bound with the attempt still live: the lost record gives way
    to one rebuilt from the head's job table (the attempt has its decider again), nothing is stopped."""
    world = deployed()
    attempt = world.desired.submission_ids[0]
    world.set_link(False)
    path = next(p for p in world.kube.objects if "/configmaps/" in p)
    world.kube.handle("DELETE", path, {}, None)
    steps(world, rounds=12)
    assert record(world).outcome == UNANSWERED
    world.set_link(True)
    steps(world)
    back = record(world)
    assert (back.outcome, back.released, [a.submission_id for a in back.attempts]) == (None, False, [attempt])
    assert world.head.live() == [attempt] and world.suspended() is False and not world.bad_stops


def test_a_first_deploy_whose_head_is_not_up_yet_records_nothing():
    """The first `pulumi up`: the supervisor starts while the head pod is still pulling its image (no
    record, no answer); the job's create comes well within the replace window: nothing is recorded lost."""
    world = World()
    world.start_supervisor(0, 0)
    world.set_link(False)
    steps(world, rounds=7)
    assert world.records() == {}
    world.set_link(True)
    assert pulumi_up(world) == "done"
    opened = record(world)
    assert opened.outcome is None and "begun by pulumi-up" in opened.decisions[0]
    assert not [d for d in opened.decisions if "lost" in d]


def test_a_run_recorded_untraced_is_resumed_by_a_replace_of_its_job():
    """`pulumi up --replace <the GrpoJob>` (its delete, then its create) reopens the run: the create
    resumes the cluster and submits; the supervisor never reopens it by itself."""
    world = deployed()
    path = next(p for p in world.kube.objects if "/configmaps/" in p)
    world.kube.handle("DELETE", path, {}, None)
    world.head.restart()
    steps(world, rounds=12)
    assert record(world).released and world.suspended() is True
    assert pulumi_up(world, "delete") == "done" and record(world).outcome == UNTRACED
    assert pulumi_up(world) == "done"
    reopened = record(world)
    assert (reopened.outcome, reopened.released, [a.submission_id for a in reopened.opened]) == (
        None, False, [world.desired.submission_ids[0]])
    assert world.head.live() == [world.desired.submission_ids[0]] and world.suspended() is False


def test_a_first_deploy_whose_gpu_workers_have_not_joined_is_not_released():
    """The first `pulumi up`: the supervisor runs while the RayCluster waits for its GPU nodes (no
    record yet, a head with no job): nothing is billed for GPUs, nothing is written or suspended."""
    world = World()
    world.start_supervisor(0, 0)
    world.head.workers = 0
    steps(world, rounds=200)
    assert world.records() == {} and world.suspended() is False
    world.head.workers = 2
    assert pulumi_up(world) == "done"
    assert world.head.live() == [world.desired.submission_ids[0]] and not record(world).outcome


def test_gpus_up_with_no_record_and_nothing_on_the_head_are_recorded_and_held_for_the_window():
    idle = {"records": {}, "jobs": {}}
    changed, effects = decide(view(RunRecord("r"), **idle))
    assert (changed["r"].outcome, changed["r"].released, changed["r"].stopped_s, effects) == (UNTRACED, False,
                                                                                            15.0, [])
    changed, effects = decide(view(replace(changed["r"], stopped_s=105.0), {},
                                   records={"r": replace(changed["r"], stopped_s=105.0)}))
    assert changed["r"].released and [e.kind for e in effects] == ["suspend"]
    # Not when a job is live, the head does not answer, no GPU worker is up, or the cluster is released.
    assert decide(view(RunRecord("r"), records={}, jobs={"x": job("x", "RUNNING")})) == ({}, [])
    assert decide(view(RunRecord("r"), records={}, jobs=None)) == ({}, [])
    assert decide(view(RunRecord("r"), **idle, capacity=Capacity(workers=0, gpus=0, dead=2))) == ({}, [])
    assert decide(view(RunRecord("r"), **idle, cluster="suspended")) == ({}, [])


def test_no_record_and_no_answer_is_recorded_lost_after_the_window_and_released_at_the_outage_bound():
    silent = {"records": {}, "jobs": None, "capacity": None}
    assert decide(view(RunRecord("r"), **silent, unanswered_s=105.0)) == ({}, [])
    changed, effects = decide(view(RunRecord("r"), **silent, unanswered_s=120.0))
    assert (changed["r"].outcome, changed["r"].outage_s, changed["r"].released, effects) == (UNANSWERED, 120.0,
                                                                                           False, [])
    almost = replace(changed["r"], outage_s=885.0)
    changed, effects = decide(view(almost, None, capacity=None))
    assert (changed["r"].outage_s, changed["r"].released, effects) == (900.0, True, [Effect("suspend")])
    # Not when the cluster is released or absent, or the decider has no run of its own.
    assert decide(view(RunRecord("r"), **silent, unanswered_s=900.0, cluster="suspended")) == ({}, [])
    assert decide(view(RunRecord("r"), **silent, unanswered_s=900.0, policy=None)) == ({}, [])


def test_item7_a_recreated_raycluster_of_a_released_run_is_suspended_again():
    world = deployed()
    world.head.finish(world.desired.submission_ids[0], "STOPPED")
    steps(world, rounds=2)
    assert world.suspended() is True
    world.kube.handle("DELETE", RC_PATH, {}, None)
    steps(world)  # a 404 is "nothing now"
    world.kube.handle("POST", RC_PATH.rsplit("/", 1)[0], {}, {
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": RC, "namespace": NS}, "spec": {}})
    assert world.suspended() is False
    steps(world)
    assert world.suspended() is True


def test_item7_kuberays_suspend_is_atomic_a_resume_while_suspending_loses_the_head():
    kube = KubeApiStandIn()
    heads: list[bool] = []
    kube.on_head = lambda _path, alive: heads.append(alive)
    kube.handle("POST", RC_PATH.rsplit("/", 1)[0], {}, {"metadata": {"name": RC}, "spec": {}})
    api = InProcessApi(kube)
    control = run_lifecycle_control(api)
    control.set_suspended(True)
    kube.reconcile()
    assert cluster_state(kube.get(RC_PATH)) == "suspending"
    control.set_suspended(False)  # flipped back while Suspending
    kube.reconcile()
    assert heads == [True, False] and cluster_state(kube.get(RC_PATH)) == "resuming"
    kube.reconcile()
    assert heads == [True, False, True] and cluster_state(kube.get(RC_PATH)) == "running"


def run_lifecycle_control(api: object) -> object:
    from workloads.kube import RayClusterControl

    return RayClusterControl(api, NS, RC)  # type: ignore[arg-type]


def test_item8_a_failed_step_is_retried_within_a_minute():
    class Failing:
        log = staticmethod(lambda _line: None)
        lease = None

        def step(self) -> bool:
            raise OSError("the head is restarting")

    pauses: list[float] = []
    run_forever(Failing(), poll_s=15.0, sleep=pauses.append, steps=8)  # type: ignore[arg-type]
    assert pauses == [15.0, 15.0, 20.0, 40.0, 60.0, 60.0, 60.0, 60.0] and max(pauses) == STEP_BACKOFF_CAP_S


def test_item8_a_reopened_run_counts_its_retries_from_the_reopening():
    world = deployed()
    world.head.finish(world.desired.submission_ids[0], "FAILED", 1)
    steps(world, rounds=4)  # one retry (max_retries 1)
    assert [a.cause for a in record(world).attempts] == ["pulumi-up", "run-failed"]
    assert pulumi_up(world, "delete") == "done"
    assert pulumi_up(world) == "done"
    assert record(world).opened_at == 2
    world.head.finish(world.desired.submission_ids[2], "FAILED", 1)
    steps(world, rounds=4)
    assert [a.cause for a in record(world).opened] == ["pulumi-up", "run-failed"]  # a retry again, not "2 times"


def test_item8_a_stalled_attempt_is_stopped_and_counted_as_a_failure():
    stalled = replace(RUNNING_0, last_step=7, stall_s=3590.0)
    logs = {"s0": run_lifecycle.LogState(7, False)}
    changed, effects = decide(view(stalled, {"s0": job("s0", "RUNNING")}, logs=logs))
    assert changed["r"].attempts[0].stopped_for == "stalled" and [(e.kind, e.submission_id) for e in effects] == [
        ("stop", "s0")]
    stopped = {"s0": job("s0", "STOPPED")}
    changed, effects = decide(view(changed["r"], stopped, ended_for_s={"s0": 999.0}))
    assert changed["r"].attempts[-1].cause == "run-failed" and not changed["r"].outcome
    assert changed["r"].attempts[-1].reason == "after s0: no training step for 3600 s"


def test_item8_the_budget_stop_waits_for_a_checkpoint_being_written():
    spent = replace(RUNNING_0, budget_s=3600.0, budget_used_s=3600.0, grace_s=900.0)
    policy = replace(POLICY, budget_grace_s=900.0)
    live = {"s0": job("s0", "RUNNING")}
    saving = {"s0": run_lifecycle.LogState(9, True)}
    changed, effects = decide(view(spent, live, policy=policy, logs=saving))
    assert effects == [] and not changed["r"].outcome  # the save under way goes on
    changed, effects = decide(view(spent, live, policy=policy, logs={"s0": run_lifecycle.LogState(10, False)}))
    assert [(e.kind, e.submission_id) for e in effects] == [("stop", "s0")]
    assert changed["r"].outcome == Outcome(Ended.OVER_BUDGET, "BudgetSpent", "budget of 3600 s spent")


def test_item8_the_budget_deadline_is_on_the_heads_clock():
    world = deployed(budget_s=3600.0)
    world.head.now += 12_345.0  # the cluster's clock, far from any laptop's
    (sid,) = world.head.live()
    deadline = int(world.head.jobs[sid]["runtime_env"]["env_vars"][run_lifecycle.DEADLINE_ENV])
    assert abs(deadline - (world.head.now - 12_345.0 + 3600.0)) < 60


def test_item8_a_model_is_named_only_once_its_export_succeeded():
    world = deployed()
    world.head.finish(world.desired.submission_ids[0], "SUCCEEDED")
    steps(world)
    assert record(world).outcome == SUCCEEDED and record(world).export_outcome == ""
    world.head.finish(record(world).export_id, "FAILED", 1)
    steps(world)
    assert record(world).export_outcome.startswith("FAILED")


# --- no record and a silent head: what the outside review found (each failed on 9cd2558) ---------


RECORD = f"/api/v1/namespaces/{NS}/configmaps/{record_name(RC, 'run-a')}"


def lose_record_behind_a_silent_head(world: World) -> None:
    world.set_link(False)
    world.kube.handle("DELETE", RECORD, {}, None)


def cli_run(world: World) -> Run:
    store = RecordStore(world.api("verl-gke cli"), NS, RC)
    return Run("run-a", OUTPUTS, BucketCopy("run-a", "", None), lambda: store)


def test_a_record_not_json_behind_a_silent_head_is_recorded_lost_and_released_at_the_bound():
    """A corrupt record is no record: the silence is counted, and the lost record replaces the corrupt
    one (9cd2558 counted only with no ConfigMap at all: the GPUs stayed up)."""
    world = deployed()
    world.set_link(False)
    world.kube.objects[RECORD]["data"] = {RECORD_KEY: "{broken"}
    steps(world, rounds=8)  # 120 s: the window
    assert (record(world).outcome, record(world).outage_s) == (UNANSWERED, 120.0)
    steps(world, rounds=52)  # 900 s: the bound
    assert record(world).released and world.suspended() is True


def test_a_run_that_succeeded_behind_the_silence_is_rebuilt_as_succeeded_when_the_head_answers():
    """A lost record is provisional until its release: when the head answers with any attempt of the
    run, ended too, the record is rebuilt from it (here: succeeded, its export claimed), as within the
    window (9cd2558 rebuilt only for a live attempt: the success stayed lost, never exported)."""
    world = deployed()
    sid = world.desired.submission_ids[0]
    lose_record_behind_a_silent_head(world)
    world.head.finish(sid, "SUCCEEDED")
    steps(world, rounds=8)  # 120 s: UNANSWERED recorded
    assert record(world).outcome == UNANSWERED
    world.set_link(True)
    steps(world, rounds=3)
    got = record(world)
    assert (got.outcome, bool(got.export_id)) == (SUCCEEDED, True)


def test_verl_gke_stop_on_a_run_recorded_unanswered_stops_its_attempt_when_the_head_answers():
    """`stop` on a provisional lost record records the stop (9cd2558 said 'already ended' and wrote
    nothing: the rebuilt record then let the attempt train on); the rebuilt record carries it."""
    world = deployed()
    sid = world.desired.submission_ids[0]
    lose_record_behind_a_silent_head(world)
    steps(world, rounds=12)
    assert record(world).outcome == UNANSWERED and world.head.live() == [sid]
    assert stop(cli_run(world), wait=False, timeout_s=0.0, poll_s=0.0) == 0
    assert record(world).desired == "stopped"
    world.set_link(True)
    steps(world, rounds=3)
    assert world.head.live() == [] and world.suspended_under == []  # stopped, then released
    assert (record(world).outcome, record(world).released, world.suspended()) == (USER_STOPPED, True, True)
    assert [a.submission_id for a in record(world).attempts] == [sid]


def test_wait_follows_a_run_recorded_unanswered_until_it_really_ends():
    """`wait` goes on following a provisional lost record (9cd2558 exited 7 at once while the run went
    on): here the head answers, the record is rebuilt and the run succeeds: exit 0."""
    world = deployed()
    sid = world.desired.submission_ids[0]
    lose_record_behind_a_silent_head(world)
    steps(world, rounds=12)
    assert record(world).outcome == UNANSWERED and world.head.live() == [sid]
    polls: list[float] = []

    def time_passes(_s: float) -> None:  # between wait's polls: the head answers, the run succeeds
        polls.append(_s)
        assert len(polls) < 20
        world.set_link(True)
        if len(polls) == 2:
            world.head.finish(sid, "SUCCEEDED")
        steps(world)

    try:
        code = follow(cli_run(world), timeout_s=None, poll_s=0.0, outage_window_s=60.0, sleep=time_passes)
    except RunEnded as ended:
        pytest.fail(f"wait exited {ended.exit_code} ({ended}) after {len(polls)} polls; the record is now "
                    f"{record(world).outcome!r} and {world.head.jobs[sid]['status']} on the head")
    assert code == 0


def test_a_destroy_that_could_not_reach_a_silent_head_is_carried_out_when_it_answers():
    """The job's delete writes desired stopped on the lost record, then fails (the head is silent); the
    record rebuilt when the head answers carries the stop, and the decider stops the attempt (9cd2558
    rebuilt it desired running: the attempt trained on)."""
    world = deployed()
    sid = world.desired.submission_ids[0]
    lose_record_behind_a_silent_head(world)
    steps(world, rounds=12)
    assert pulumi_up(world, "delete") == "failed"
    assert record(world).desired == "stopped" and record(world).outcome == UNANSWERED
    world.set_link(True)
    steps(world, rounds=3)
    assert world.head.live() == [] and world.suspended_under == []  # stopped, then released
    assert [a.submission_id for a in record(world).attempts] == [sid] and record(world).desired == "stopped"


def test_a_first_deploy_whose_head_answers_after_the_window_is_not_released_at_once():
    """The supervisor starts long before the job's create (the RayCluster and staging are awaited
    first): a head pulling its image past the window gets a lost record; once it answers with nothing
    of the run, that record is dropped and the rules for no record apply again (nothing while no GPU
    worker has joined). 9cd2558 released the cluster at once, mid-`pulumi up`."""
    world = World()
    world.start_supervisor(0, 0)
    world.set_link(False)  # the head pod still pulling the verl image
    steps(world, rounds=9)  # 135 s > replace window (120 s here; 600 s by default)
    assert record(world).outcome == UNANSWERED
    world.set_link(True)
    world.head.workers = 0  # GPU workers not joined yet
    steps(world)
    assert world.suspended() is False and world.records() == {}


# --- HELD (pass) -------------------------------------------------------------------------------------


def test_a_released_unanswered_run_stays_released_when_the_head_answers_during_the_suspend():
    """A release is final until a create: the head answering between the suspend patch and KubeRay
    deleting the pods does not turn the released lost record into an open one (9cd2558 did, then
    resumed the cluster and submitted attempt 1)."""
    world = deployed()
    lose_record_behind_a_silent_head(world)
    steps(world, rounds=55)
    while True:
        world.supervisors[0].step()
        if record(world).released:
            break
        world.passes(15)
    assert world.suspended() is True and world.pods  # patched; KubeRay has not deleted the pods yet
    world.set_link(True)
    world.supervisors[0].step()  # the head answers from its last seconds
    steps(world, rounds=4)
    after = record(world)
    assert after.outcome == UNANSWERED and after.released and world.suspended() is True, (
        after.outcome, [a.submission_id for a in after.attempts], world.head.live(), world.suspended())


# --- issue 47 -----------------------------------------------------------------------------------------


def test_issue47_item5_a_create_over_a_provisional_record_keeps_it_provisional_while_the_head_is_silent():
    """A create over a "head did not answer" record while the head still does not answer: 0.7.0 reopened
    it (outage zeroed), the create failed, and the record ended DEPLOY_FAILED, no longer provisional, so
    the attempt still live behind the silence was never adopted when the head answered. Now the create
    reaches the head before it reopens: it fails, the record stays provisional with its outage, and
    the head's answer rebuilds the record with the live attempt."""
    world = deployed()
    attempt = world.desired.submission_ids[0]
    world.set_link(False)
    path = next(p for p in world.kube.objects if "/configmaps/" in p)
    world.kube.handle("DELETE", path, {}, None)
    steps(world, rounds=12)
    before = record(world)
    assert (before.outcome, before.released) == (UNANSWERED, False) and before.outage_s > 0
    assert pulumi_up(world) == "failed"
    kept = record(world)
    assert (kept.outcome, kept.desired, kept.outage_s) == (UNANSWERED, before.desired, before.outage_s)
    world.set_link(True)
    steps(world)
    back = record(world)
    assert (back.outcome, [a.submission_id for a in back.attempts]) == (None, [attempt])
    assert world.head.live() == [attempt] and not world.bad_stops


def test_issue47_item1_a_create_retried_after_a_stop_leaves_the_run_stopped():
    """`verl-gke stop`, then a `pulumi up` retrying a create that failed after it submitted: 0.7.0's
    create set `desired` back to running over the recorded stop and the run trained on. Now the stop
    stays (only a new generation clears it): the create refuses in one line and the run is stopped."""
    world = deployed()
    sid = world.desired.submission_ids[0]
    assert stop(cli_run(world), wait=False, timeout_s=0.0, poll_s=0.0) == 0
    assert pulumi_up(world) == "failed"
    assert world.log[-1] == ("pulumi up failed: run run-a (jobAttempt 0) was stopped by `verl-gke stop`: nothing "
                             "submitted. Bump verl-gke:jobAttempt to run it again from its last checkpoint.")
    assert record(world).desired == "stopped"
    steps(world, rounds=3)
    assert world.head.live() == [] and record(world).outcome == USER_STOPPED
    assert [a.submission_id for a in record(world).attempts] == [sid]


def test_issue47_item1_a_stop_during_the_creates_gates_submits_nothing():
    """A stop that lands while the create runs its gates (the head reached, the fabric check, ...):
    0.7.0 submitted a new attempt anyway. Now the submit step reads `desired` first."""
    world = World()
    world.start_supervisor(0, 0)

    def the_user_stops(label: str) -> None:
        if label == "resumed":
            assert stop(cli_run(world), wait=False, timeout_s=0.0, poll_s=0.0) == 0

    assert pulumi_up(world, between=the_user_stops) == "failed"
    assert world.head.jobs == {}
    steps(world)
    assert (record(world).outcome, record(world).desired, record(world).attempts) == (USER_STOPPED, "stopped", ())


def test_issue47_item1_a_create_over_an_immutable_record_keeps_its_stop():
    """Found by the exploration (a stop racing a create): a record made immutable by hand is replaced by
    the create's write; 0.8.0 replaced it with a new record (its content dropped, the stop with it), and the
    next create submitted under the stop. Now an immutable record's content carries into its replacement."""
    world = deployed()
    sid = world.desired.submission_ids[0]
    assert stop(cli_run(world), wait=False, timeout_s=0.0, poll_s=0.0) == 0
    path = next(p for p in world.kube.objects if "/configmaps/" in p)
    world.kube.objects[path]["immutable"] = True
    assert pulumi_up(world) == "failed"
    assert not world.kube.objects[path].get("immutable")
    assert (record(world).desired, [a.submission_id for a in record(world).attempts]) == ("stopped", [sid])
    steps(world, rounds=3)
    assert world.head.live() == [] and record(world).outcome == USER_STOPPED


def test_issue47_item1_a_replace_after_a_stop_does_not_undo_it():
    """A stop, then a replace (its delete, then its create) before the decider acted on the stop: the
    delete ends the run as the user's stop (not reopenable), so the replace's create refuses."""
    world = deployed()
    assert stop(cli_run(world), wait=False, timeout_s=0.0, poll_s=0.0) == 0
    assert pulumi_up(world, "delete") == "done"
    assert record(world).outcome == USER_STOPPED
    assert pulumi_up(world) == "failed"
    steps(world, rounds=2)
    assert world.head.live() == [] and record(world).outcome == USER_STOPPED


def test_issue47_item2_a_submission_retried_on_5xx_never_lands_after_the_lease_ran_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A head whose job agent is still starting answers 500 to submissions for a while; 0.7.0 retried for
    up to 60 s after one Lease check, past the holder's 55 s of validity: its retry could land after
    another decider took over and submitted. Now the Lease is checked before every try."""
    world = World()
    world.start_supervisor(0, 0)
    decider = world.supervisors[0]
    assert decider.step()
    handle, posts = world.head.handle, []

    def agent_starting(method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        if method == "POST" and path == "/api/jobs/":
            posts.append(world.t)
            if len(posts) <= 70:
                return 500, b"No available agent to submit job, please try again later."
        return handle(method, path, body)

    world.head.handle = agent_starting  # type: ignore[method-assign]

    class WorldTime:  # the lifecycle's clock and sleep, on the world's time (nobody renews meanwhile)
        monotonic = staticmethod(lambda: world.t)
        sleep = staticmethod(world.passes)

    monkeypatch.setattr(run_lifecycle, "time", WorldTime)
    run = RunRecord(run_id="run-a", generation=0)
    attempt = Attempt(index=0, submission_id=world.desired.submission_ids[0], by="supervisor", cause="pulumi-up")
    with pytest.raises(LeaseLost):
        decider.hands.submit(run, attempt)
    assert world.head.jobs == {} and 50 <= len(posts) <= LEASE_DURATION_S - DECIDE_MARGIN_S + 1, posts


def test_issue47_item8_the_silence_count_survives_a_new_holder():
    """No record and a silent head: 0.7.0's count lived in the holder's memory and restarted at every
    re-acquire (a restart, a renew 409, a `pulumi up` hand-over). Now it is carried in the Lease: a new
    holder counts on, and records the run lost once the silence (not its own share) reaches the window."""
    world = deployed()
    world.set_link(False)
    path = next(p for p in world.kube.objects if "/configmaps/" in p)
    world.kube.handle("DELETE", path, {}, None)
    steps(world, rounds=7)  # 90 s counted by supervisor 0 (its first step after the loss counts from the last)
    assert world.records() == {}
    world.supervisors.pop(0)
    world.start_supervisor(1, 2)
    taken = None
    while not world.records():
        if world.supervisors[1].step() and taken is None:
            taken = world.t
        world.passes(15.0)
    assert taken is not None and world.t - taken <= 60.0, (taken, world.t)
    lost = record(world)
    assert lost.outcome == UNANSWERED and lost.outage_s >= 90.0, lost


def test_a_head_restart_with_a_supervisor_restart_resubmits_once_and_after_the_end_keeps_the_release():
    """A KubeRay head pod restart (no GCS fault tolerance: the head forgets its jobs, test_run_faults::test_1
    shows a real head does) while the supervisor is evicted: the next one rebuilds from the record and submits
    the next attempt once; after the run ended and was released, a restart and a new supervisor keep it so."""
    world = deployed()
    ids = world.desired.submission_ids
    world.supervisors.pop(0).lease.release()  # SIGTERM: it leaves the Lease free, its memory is gone
    world.head.restart()
    world.start_supervisor(0, 2)
    steps(world, rounds=4)
    assert world.head.live() == [ids[1]]
    assert [(a.index, a.by, a.cause) for a in record(world).attempts] == [
        (0, "pulumi-up", "pulumi-up"), (1, "supervisor", "node-lost")]
    world.head.finish(ids[1], "SUCCEEDED")
    steps(world)
    world.head.finish(record(world).export_id, "SUCCEEDED")
    steps(world, rounds=2)
    assert record(world).outcome == SUCCEEDED and record(world).released and world.suspended() is True
    done = record(world)
    world.supervisors.pop(0).lease.release()
    world.head.restart()
    world.start_supervisor(0, 3)
    steps(world, rounds=20)
    assert world.suspended() is True and world.head.jobs == {} and record(world) == done  # not reopened


def test_with_export_model_off_a_succeeded_run_releases_the_workers_at_once():
    """exportModel: false: no export is claimed or submitted (the export ids are known, the policy says no)."""
    succeeded = run_lifecycle.ended(RUNNING_0, SUCCEEDED)
    changed, effects = decide(view(succeeded, {"s0": job("s0", "SUCCEEDED")},
                                   export_ids={"r": ("verl-export-r-final-0", "/data/models/r/model")}))
    assert changed["r"].released and (changed["r"].export_id, changed["r"].export_outcome) == ("", "")
    assert [e.kind for e in effects] == ["suspend"]


def test_item3_variant_an_older_generation_left_by_a_failed_up_is_watched_to_its_end_and_released():
    """A jobAttempt bump whose `up` failed before the job's replace: the new generation's supervisor
    resubmits none of the older generation's attempts (their ids are not its own) and releases it once it ends."""
    world = deployed()
    older = run_spec("run-a", 0).submission_ids[0]
    world.desired = run_spec("run-a", 1)
    world.runs["run-a/1"] = world.desired
    world.supervisors.clear()  # replaced by the new generation's: its Lease expires
    world.start_supervisor(0, 2)
    steps(world, rounds=8)
    assert world.head.live() == [older] and not record(world).outcome and world.suspended() is False
    world.head.finish(older, "STOPPED")
    steps(world, rounds=4)
    assert not world.head.live() and [a.submission_id for a in record(world).attempts] == [older]
    assert record(world).outcome == Outcome(Ended.FAILED, "NoLongerNamed", (
        f"jobAttempt 0 of run-a ended while the stack names jobAttempt 1 of run-a, so none of its attempts is "
        f"resubmitted: {older} STOPPED"))
    assert record(world).released and world.suspended() is True
