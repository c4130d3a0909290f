"""Every stack saves its checkpoints on the nodes' local disk and copies them in the background: the job runs
verl through the checkpoint launcher, every Ray pod has the local folder and the program, every GPU worker
the copier, and verl composes the launcher's settings (its own Hydra config, both pinned releases)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from domain.bucket import LOCAL_CHECKPOINTS
from domain.config import load_config
from domain.grpo_spec import CHECKPOINT_LAUNCHER, CHECKPOINT_PROGRAM, CHECKPOINT_PROGRAM_DIR, VERL_ENTRY_MODULE
from domain.platforms import CHECKPOINT_COPIER, PLATFORMS
from domain.stack_files import raw_config
from domain.stack_run import stack_run
from domain.verl_config import compose_run
from domain.verl_wheel import config_dir
from manifests import checkpoints as manifest
from tests.conftest import STACKS
from verl_gke import synth
from workloads import checkpoints

REPO = Path(__file__).resolve().parent.parent


def _job(result: synth.SynthResult) -> dict:
    return next(r.inputs for r in result.registrations if r.type == synth.GRPO_JOB_TYPE)


def _cluster(result: synth.SynthResult) -> dict:
    return next(m for m in result.manifests() if m["kind"] == "RayCluster")


@pytest.mark.parametrize("stack", STACKS)
def test_the_job_runs_verl_through_the_checkpoint_launcher(synth_stack, stack: str) -> None:
    words = shlex.split(_job(synth_stack(stack))["entrypoint"])
    assert tuple(words[:4]) == CHECKPOINT_LAUNCHER == ("python3", "/opt/verl-gke/checkpoints.py", "launch", "--")
    assert words[4:7] == ["python3", "-m", VERL_ENTRY_MODULE]
    cfg = load_config(raw_config(stack)[0])
    # verl's own setting still names the run's folder on the bucket; the launcher moves it per attempt.
    assert f"trainer.default_local_dir={cfg.verl.get('trainer.default_local_dir')}/{stack_run(cfg)[0]}" in words


@pytest.mark.parametrize("stack", STACKS)
def test_every_ray_pod_has_the_local_folder_and_every_worker_its_copier(synth_stack, stack: str) -> None:
    result = synth_stack(stack)
    cfg = load_config(raw_config(stack)[0])
    spec = _cluster(result)["spec"]
    program = next(m for m in result.manifests() if m["kind"] == "ConfigMap"
                   and m["metadata"]["name"].startswith(manifest.CONFIG_MAP))
    # With its GCS JSON API client: markers name the bucket's object generations (VERL_GKE_BUCKET below).
    assert program["data"] == {"checkpoints.py": (REPO / "workloads" / "checkpoints.py").read_text(),
                               "gcs.py": (REPO / "workloads" / "gcs.py").read_text()}
    head = spec["headGroupSpec"]["template"]
    worker = spec["workerGroupSpecs"][0]["template"]
    ray_head, = head["spec"]["containers"]
    ray_worker, copier = worker["spec"]["containers"]
    local = {"name": "local-checkpoints", "mountPath": "/local-checkpoints"}
    code = {"name": "checkpoint-program", "mountPath": "/opt/verl-gke", "readOnly": True}
    bucket = next(m for m in result.manifests() if m["kind"] == "PersistentVolume")["spec"]["csi"]["volumeHandle"]
    for container in (ray_head, ray_worker, copier):
        assert local in container["volumeMounts"] and code in container["volumeMounts"]
        assert {"name": "VERL_GKE_BUCKET", "value": bucket} in container["env"]
    for pod in (head, worker):
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        # The node's ephemeral storage: Local SSD on A4 and A3 Ultra GPU nodes (Platform.local_ssd_count).
        assert volumes["local-checkpoints"] == {"name": "local-checkpoints", "emptyDir": {}}
        assert volumes["checkpoint-program"]["configMap"]["name"] == program["metadata"]["name"] == (
            f"verl-gke-checkpoints-{manifest.digest(program['data']['checkpoints.py'] + program['data']['gcs.py'])[:10]}")
        assert pod["metadata"]["annotations"]["verl-gke/checkpoints-sha256"] == manifest.digest(
            program["data"]["checkpoints.py"] + program["data"]["gcs.py"])
    assert copier["command"] == ["python3", "/opt/verl-gke/checkpoints.py", "copy", "--local-root",
                                 "/local-checkpoints", "--bucket-root", cfg.verl.get("trainer.default_local_dir")]
    assert {"name": "training-bucket-vol", "mountPath": "/data"} in copier["volumeMounts"]
    assert copier["image"] == ray_worker["image"]
    assert copier["resources"]["requests"] == copier["resources"]["limits"] == {
        "cpu": "1", "memory": "1Gi", "ephemeral-storage": "1Gi"}


def test_the_copier_is_counted_in_the_workers_share_of_the_node() -> None:
    a4 = PLATFORMS["a4"]
    assert CHECKPOINT_COPIER.cpu == 1 and CHECKPOINT_COPIER.memory_gi == 1
    # floor(allocatable 223.x) - 3 of headroom - 1 for the copier
    assert (a4.worker_cpus, a4.max_worker_cpus) == (219, 222)
    assert a4.autopilot_worker is not None and a4.autopilot_worker.cpu == 220 - 2 - 1


@pytest.mark.parametrize("stack", ["a4", "a4x"])
def test_verl_composes_the_launchers_settings(synth_stack, stack: str, tmp_path: Path) -> None:
    """What the launcher hands verl (local folder, resume from a bucket checkpoint, no deletion by verl)
    is a valid override list for the platform's own verl release."""
    words = shlex.split(_job(synth_stack(stack))["entrypoint"])
    run_dir = Path(next(w for w in words if w.startswith("trainer.default_local_dir=")).split("=", 1)[1])
    plan = checkpoints.plan_launch(words[4:], "a1b2c3d4e5f6", Path(LOCAL_CHECKPOINTS))
    cfg = load_config(raw_config(stack)[0])
    assert plan.world_size == cfg.gpu_nodes * cfg.facts.gpus_per_node
    assert plan.local_dir == Path(LOCAL_CHECKPOINTS) / run_dir.name / "a1b2c3d4e5f6"
    resumed = [*[w for w in plan.command[3:] if not w.startswith("trainer.resume_mode=")],
               "trainer.resume_mode=resume_path", f"trainer.resume_from_path={run_dir}/global_step_20"]
    composed = compose_run(config_dir(cfg.facts.verl), resumed)
    trainer = composed.trainer
    assert (trainer.default_local_dir, trainer.resume_mode, trainer.resume_from_path) == (
        str(plan.local_dir), "resume_path", f"{run_dir}/global_step_20")
    assert (trainer.max_actor_ckpt_to_keep, trainer.del_local_ckpt_after_load) == (None, False)


def test_the_program_runs_where_the_pods_mount_it() -> None:
    assert CHECKPOINT_PROGRAM == f"{CHECKPOINT_PROGRAM_DIR}/{manifest.PROGRAM_FILE}"
    assert manifest.PROGRAM_FILE == "checkpoints.py" and LOCAL_CHECKPOINTS == checkpoints.LOCAL_ROOT


def test_a_run_that_saves_nothing_with_its_model_export_on_is_refused_in_one_line_naming_both_keys() -> None:
    """verl writes no checkpoint with trainer.save_freq <= 0 (its default, -1): the run would succeed with no
    model, and its export fail later (issue 47, item 7)."""
    from tests.test_config import config, problems, verl

    for freq in (0, -1):
        assert [p for p in problems(**verl(trainer__save_freq=freq)) if "save_freq" in p] == [
            f"verl-gke:verl.trainer.save_freq = {freq}: must be a positive number of steps with "
            "verl-gke:exportModel = true (the default): verl writes no checkpoint otherwise, and the run would "
            "succeed with no model to export; set verl-gke:exportModel to false to train without one"]
    assert load_config(config(exportModel="false", **verl(trainer__save_freq=-1))).export_model is False
