"""Warm starts (verl-gke:startFrom, domain/start_from.py): the form offline, the objects preview reads, and the
checkpoint launcher's resume plan against the emulator bucket (tests/gcs_emulator.py, the generations world of
tests/test_checkpoint_generations.py: markers rest on GCS generations, as in the pods)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from domain import preflight, start_from
from domain.config import ConfigError, load_config
from tests.conftest import BASE_CONFIG
from tests.test_checkpoint_generations import world  # noqa: F401 the fixture
from tests.test_checkpoints import GPUS, NODES, RUN, WORLD, _logs, _start_attempt, verl_saves
from verl_gke import synth
from workloads import checkpoints as ck

NEW_RUN = "run-fedcba987654"


def _command(run_dir: Path, start: str) -> list[str]:
    return ["python3", "-m", "verl.trainer.main_ppo", f"trainer.nnodes={NODES}", f"trainer.n_gpus_per_node={GPUS}",
            f"trainer.default_local_dir={run_dir}", "trainer.resume_mode=auto", f"trainer.resume_from_path={start}"]


def _complete_step(world: dict, attempt: str, step: int) -> Path:  # noqa: F811
    _, log = _logs()
    launch = _start_attempt(world, attempt)
    verl_saves(world["nodes"], world["head"], attempt, step)
    ck.announce(launch, attempt, step - 1, log)
    for i, node in enumerate(world["nodes"]):
        ck.copy_once(node, world["bucket"], f"node{i}", log)
    return world["run"] / f"global_step_{step}"


def test_a_warm_start_resumes_the_other_runs_complete_checkpoint_until_the_run_has_its_own(world: dict) -> None:  # noqa: F811
    source = _complete_step(world, "a1", 20)
    new_run = world["bucket"] / NEW_RUN
    plan = ck.plan_launch(_command(new_run, str(source)), "b1", Path("/local-checkpoints"))
    assert plan.command[-5:] == [
        "trainer.resume_mode=resume_path", "trainer.max_actor_ckpt_to_keep=null",
        "trainer.max_critic_ckpt_to_keep=null", "trainer.del_local_ckpt_after_load=False",
        f"trainer.resume_from_path={source}"]
    assert [a for a in plan.command if a.startswith("trainer.resume_from_path=")] == [f"trainer.resume_from_path={source}"]
    assert (plan.resume_from, plan.start_dir, plan.resume_dir) == (20, source, source)
    ck.record_attempt(plan, "b1", None)
    assert ck.read_record(new_run / ck.STATE_DIR / ck.ATTEMPT_FILE)["resume_from"] is None  # not its own step


def test_a_warm_start_from_a_step_rewritten_since_its_marker_is_refused(world: dict) -> None:  # noqa: F811
    source = _complete_step(world, "a1", 20)
    gcs = world["gcs"]
    shard = f"{gcs.name(source)}/actor/optim_world_size_{WORLD}_rank_1.pt"
    gcs.write(shard, b"x" * 1000, gcs.stat(shard).generation)  # same size, another generation
    with pytest.raises(ck.CheckpointError) as caught:
        ck.plan_launch(_command(world["bucket"] / NEW_RUN, str(source)), "b1", Path("/l"))
    assert str(caught.value) == (f"verl-gke:startFrom: {source} is not a complete checkpoint of world size {WORLD} "
                                 "(its complete marker is missing, another attempt's, or a file changed since)")


def test_a_warm_start_at_another_world_size_or_a_missing_step_is_refused(world: dict) -> None:  # noqa: F811
    source = _complete_step(world, "a1", 20)
    wider = [a.replace(f"trainer.nnodes={NODES}", "trainer.nnodes=4") for a in _command(world["bucket"] / NEW_RUN,
                                                                                     str(source))]
    with pytest.raises(ck.CheckpointError, match="world size 8"):
        ck.plan_launch(wider, "b1", Path("/l"))
    with pytest.raises(ck.CheckpointError, match="global_step_30 is not a complete checkpoint"):
        ck.plan_launch(_command(world["bucket"] / NEW_RUN, str(source.with_name("global_step_30"))), "b1", Path("/l"))


def test_a_warm_started_run_with_a_checkpoint_of_its_own_resumes_from_it(world: dict) -> None:  # noqa: F811
    source = _complete_step(world, "a1", 20)
    own = dict(world, run=world["bucket"] / RUN)  # the source run stands for a run with its own step 20
    plan = ck.plan_launch(_command(own["run"], str(world["bucket"] / NEW_RUN / "global_step_5")), "a2", Path("/l"))
    assert (plan.resume_from, plan.start_dir) == (20, None)
    assert f"trainer.resume_from_path={source}" in plan.command


# --- the form, offline, and what preview reads -------------------------------------------------------------


def _problems(**changes: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config({**BASE_CONFIG, **changes})
    return caught.value.problems


@pytest.mark.parametrize("value", [
    {"run": "run-0123", "step": 20}, {"run": RUN, "step": 0}, {"run": RUN}, {"run": RUN, "step": "20x"},
    {"model": "/data/models/x"}, {"model": f"gs://b/models/{RUN}/other"}, {"run": RUN, "step": 2, "model": "gs://b"},
])
def test_a_malformed_start_is_one_line_naming_both_forms(value: dict) -> None:
    assert _problems(**{start_from.KEY: json.dumps(value)}) == [
        f"{start_from.KEY} = {json.dumps(value)}: must be {start_from.FORMS}."]


def test_a_model_start_and_a_model_path_both_set_are_refused() -> None:
    value = {"model": f"gs://my-bucket/models/{RUN}/model"}
    verl = json.dumps({"actor_rollout_ref": {"model": {"path": "/data/mine"}}})
    [line] = _problems(**{start_from.KEY: json.dumps(value), "verl-gke:verl": verl})
    assert line.startswith(f"{start_from.KEY} = {json.dumps(value)}: names the model, and so does "
                           "verl-gke:verl.actor_rollout_ref.model.path")


def test_resume_from_path_is_set_through_start_from_only() -> None:
    [line] = _problems(**{"verl-gke:verl": json.dumps({"trainer": {"resume_from_path": "/data/x/global_step_1"}})})
    assert line.startswith("verl-gke:verl.trainer.resume_from_path = ") and "verl-gke:startFrom" in line


@pytest.mark.parametrize(("value", "read", "problem"), [
    ({"run": RUN, "step": 20}, {"marker": {"attempt": "a", "world_size": 16}, "saved": {"attempt": "a"}}, None),
    ({"run": RUN, "step": 20}, {"marker": None, "saved": {"attempt": "a"}},
     f"run {RUN} has no complete checkpoint at step 20 (not saved, still copying, or rotated away;"),
    ({"run": RUN, "step": 20}, {"marker": {"attempt": "a", "world_size": 16}, "saved": {"attempt": "b"}},
     "is being saved again by a later attempt"),
    ({"run": RUN, "step": 20}, {"marker": {"attempt": "a", "world_size": 8}, "saved": {"attempt": "a"}},
     "step 20 was saved by 8 GPUs and this stack has 16"),
    ({"model": f"gs://my-bucket/models/{RUN}/model"}, {"pointer": {"step": 58}}, None),
    ({"model": f"gs://my-bucket/models/{RUN}/model"}, {"pointer": None}, "no model exported there"),
])
def test_preview_reads_the_marker_or_the_pointer(value: dict, read: dict, problem: str | None) -> None:
    assert set(start_from.objects_to_read(value, "/data/verl/checkpoints")) == set(read)
    found = start_from.resumable_problem(value, 16, read)
    assert (found is None) if problem is None else (problem in found and found.count("\n") == 0)


def test_the_objects_preview_reads_are_the_launchers_markers() -> None:
    from workloads import export_model

    assert (start_from.MODELS_DIR, start_from.POINTER_SUFFIX) == (export_model.MODELS_DIR, export_model.POINTER_SUFFIX)
    assert start_from.objects_to_read({"run": RUN, "step": 20}, "/data/verl/checkpoints") == {
        "marker": f"verl/checkpoints/{RUN}/global_step_20/{ck.MARKER}",
        "saved": f"verl/checkpoints/{RUN}/global_step_20/{ck.STATE_DIR}/{ck.SAVED_FILE}"}
    assert start_from.objects_to_read({"model": f"gs://my-bucket/models/{RUN}/model-step-10"}, "/x") == {
        "pointer": f"models/{RUN}/model-step-10.json"}


# --- through synth -------------------------------------------------------------------------------------------


def test_a_warm_start_through_synth_changes_the_run_id_and_is_in_the_plan() -> None:
    plain = synth.run("a4-standard")
    start = {"run": RUN, "step": 20}
    warm = synth.run("a4-standard", overrides={start_from.KEY: json.dumps(start)})
    assert warm.outputs["runId"] != plain.outputs["runId"]
    [entry] = {r.inputs["entrypoint"] for r in warm.registrations if "entrypoint" in r.inputs}
    assert f"trainer.resume_from_path=/data/verl/checkpoints/{RUN}/global_step_20" in entry
    assert f"  warm start from run {RUN} step 20 (its model and optimizer state)" in warm.log


# --- at preview: the stack's bucket, through the gcp provider's invoke ---------------------------------------


def _preview(value: dict, objects: dict[str, object]) -> tuple[list[str], list[dict]]:
    """start_from_problems with the provider answering from `objects` (object name -> JSON, or an error text as
    the provider gives it for a missing object: google_storage_bucket_object_content's "404 ... not found")."""
    cfg = load_config({**BASE_CONFIG, start_from.KEY: json.dumps(value)})
    asked: list[dict] = []

    def invoke(token: str, args: dict) -> dict:
        assert token == preflight.OBJECT
        asked.append(args)
        found = objects.get(args["name"], "googleapi: Error 404: No such object")
        if isinstance(found, str):
            raise RuntimeError(f"invoke of {token} failed: {found}")
        return {"content": json.dumps(found)}
    return preflight.start_from_problems(cfg, "mine", invoke), asked


def test_preview_refuses_a_step_that_is_not_there_and_takes_one_that_is() -> None:
    value = {"run": RUN, "step": 20}
    step = f"verl/checkpoints/{RUN}/global_step_20"
    problems, asked = _preview(value, {})
    assert asked[0] == {"bucket": f"verl-mine-{BASE_CONFIG['gcp:project']}", "name": f"{step}/{ck.MARKER}"}
    assert problems == [f"{start_from.KEY} = {json.dumps(value)}: run {RUN} has no complete checkpoint at step 20 "
                        "(not saved, still copying, or rotated away; a step with its model alone can be exported with "
                        "`verl-gke export --step 20` and started from as a model)."]
    whole = {"attempt": "a1", "world_size": 16}
    assert _preview(value, {f"{step}/{ck.MARKER}": whole, f"{step}/.verl-gke/saved.json": {"attempt": "a1"}})[0] == []


def test_preview_refuses_a_model_in_another_bucket_or_not_exported_and_an_unreadable_bucket() -> None:
    other = {"model": f"gs://someone-else/models/{RUN}/model"}
    [line] = _preview(other, {})[0]
    assert line.startswith(f"{start_from.KEY} = {json.dumps(other)}: the model must be in this stack's bucket verl-mine-")
    bucket = f"verl-mine-{BASE_CONFIG['gcp:project']}"
    mine = {"model": f"gs://{bucket}/models/{RUN}/model"}
    assert "no model exported there" in _preview(mine, {})[0][0]
    assert _preview(mine, {f"models/{RUN}/model.json": {"step": 58}})[0] == []
    [denied] = _preview(mine, {f"models/{RUN}/model.json": "googleapi: Error 403: forbidden"})[0]
    assert denied.endswith(f"gs://{bucket}/models/{RUN}/model.json could not be read: the provider said: "
                           "googleapi: Error 403: forbidden")


# --- the run's lineage: its record -----------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "lineage"), [
    ({"run": RUN, "step": 20}, f"run {RUN} step 20"),
    ({"model": f"gs://my-bucket/models/{RUN}/model-step-10"}, f"model models/{RUN}/model-step-10"),
    ({}, ""),
])
def test_the_record_a_run_is_opened_with_names_its_warm_start(value: dict, lineage: str) -> None:
    from domain.grpo_spec import entrypoint
    from domain.stack_run import stack_run
    from workloads import run_lifecycle
    from workloads.run_record import start_of

    cfg = load_config({**BASE_CONFIG, **({start_from.KEY: json.dumps(value)} if value else {})})
    run_id, legacy = stack_run(cfg)
    entry = entrypoint(cfg.verl, run_id=run_id, legacy_trainer=legacy)
    record = run_lifecycle.opened(None, run_id, 0, 0.0, start_of(entry))
    assert record.start_from == lineage
    assert type(record).from_json(record.to_json()).start_from == lineage


def test_synth_refuses_a_malformed_start_in_one_line_without_a_traceback(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    value = json.dumps({"run": "run-0123456789ab"})
    assert synth.main(["a4-standard", "--out", str(tmp_path / "out"), "--set", f"{start_from.KEY}={value}"]) == 2
    err = capsys.readouterr().err
    assert f"  {start_from.KEY} = {value}: must be {start_from.FORMS}." in err.splitlines()
    assert "Traceback" not in err
