"""The GRPO run rendered for Ray: the tutorial's overrides, safely quoted, and its runtime env."""

from __future__ import annotations

import shlex

from domain.config import load_config
from domain.grpo_spec import CHECKPOINT_LAUNCHER, entrypoint, runtime_env
from domain.platforms import PLATFORMS
from tests.conftest import BASE_CONFIG

# The tutorial's A4/A3 Ultra `ray job submit` overrides, plus resume_mode=auto and keeping two checkpoints.
TUTORIAL_A4 = [
    "algorithm.adv_estimator=grpo",
    "data.train_files=/data/gsm8k/train.parquet",
    "data.val_files=/data/gsm8k/test.parquet",
    "data.train_batch_size=256",
    "data.max_prompt_length=512",
    "data.max_response_length=512",
    "actor_rollout_ref.model.path=/data/Qwen2.5-32B-Instruct",
    "actor_rollout_ref.actor.optim.lr=1e-05",
    "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=8",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "algorithm.kl_ctrl.kl_coef=0.001",
    "trainer.logger=console",
    "trainer.val_before_train=False",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=2",
    "trainer.save_freq=10",
    "trainer.test_freq=10",
    "trainer.total_epochs=2",
    "trainer.default_local_dir=/data/verl/checkpoints",
    "trainer.max_actor_ckpt_to_keep=2",
    "trainer.max_critic_ckpt_to_keep=2",
    "trainer.resume_mode=auto",
]


def _args(command: str) -> list[str]:
    words = shlex.split(command)
    assert words[:7] == [*CHECKPOINT_LAUNCHER, "python3", "-m", "verl.trainer.main_ppo"]
    return words[7:]


# The execution profile in place of the tutorial's micro batches and rollout TP 8 (same math).
PROFILE_A4 = {
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "8",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "16",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "16",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "4",
    "actor_rollout_ref.model.use_remove_padding": "True",
    "actor_rollout_ref.actor.use_dynamic_bsz": "True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": "16384",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": "True",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": "32768",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": "True",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": "32768",
}


def test_a4_entrypoint_is_the_tutorials_with_the_execution_profile():
    cfg = load_config(BASE_CONFIG)
    tutorial = dict(a.split("=", 1) for a in TUTORIAL_A4)
    assert dict(a.split("=", 1) for a in _args(entrypoint(cfg.grpo, 8, cfg.gpu_nodes))) == {**tutorial, **PROFILE_A4}


def test_a4x_entrypoint_has_the_tutorials_a4x_overrides():
    cfg = load_config({**BASE_CONFIG, "verl-gke:platform": "a4x", "verl-gke:gpuNodes": "4"})
    args = _args(entrypoint(cfg.grpo, 4, cfg.gpu_nodes))
    for expected in ("actor_rollout_ref.actor.ppo_mini_batch_size=64",
                     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                     "actor_rollout_ref.actor.use_kl_loss=True",
                     "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
                     "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
                     "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
                     "actor_rollout_ref.model.use_remove_padding=True",
                     "actor_rollout_ref.actor.use_dynamic_bsz=True",
                     "trainer.n_gpus_per_node=4", "trainer.nnodes=4"):
        assert expected in args
    assert not any(a.startswith("trainer.val_before_train") for a in args)


def test_extra_overrides_are_quoted_and_cannot_inject_commands():
    cfg = load_config({**BASE_CONFIG, "verl-gke:grpoExtraOverrides":
                       '["trainer.experiment_name=run 1; rm -rf /", "trainer.project_name=gsm8k"]'})
    command = entrypoint(cfg.grpo, 8, 2)
    assert "'trainer.experiment_name=run 1; rm -rf /'" in command
    assert _args(command)[-2:] == ["trainer.experiment_name=run 1; rm -rf /", "trainer.project_name=gsm8k"]


def test_runtime_env_has_the_platform_nccl_settings_and_no_broken_keys():
    env = runtime_env(PLATFORMS["a3u"], nnodes=2, worker_cpus=220, verl_dir=None)
    assert set(env) == {"env_vars"}  # no working_dir", py_executable", setup_hook or pip
    variables = env["env_vars"]
    assert variables["NCCL_TUNER_CONFIG_PATH"] == "/usr/local/gib/configs/tuner_config_a3u.txtpb"
    assert variables["NCCL_NET_PLUGIN"] == "/usr/local/gib/lib64/libnccl-net_internal.so"
    assert variables["NCCL_IB_TC"] == "52" and variables["NCCL_IB_FIFO_TC"] == "84"
    assert variables["HF_HOME"] == "/data/huggingface_cache"
    assert variables["CPUS_PER_WORKER"] == "220" and variables["NUM_WORKERS"] == "2"
    assert "PYTHONPATH" not in variables


def test_a4_uses_the_b200_tuner_and_a4x_the_gcp_env_plugin():
    a4 = runtime_env(PLATFORMS["a4"], nnodes=2, worker_cpus=220, verl_dir=None)["env_vars"]
    a4x = runtime_env(PLATFORMS["a4x"], nnodes=4, worker_cpus=136, verl_dir="/data/verl")["env_vars"]
    assert a4["NCCL_TUNER_CONFIG_PATH"] == "/usr/local/gib/configs/tuner_config_a4.txtpb"
    assert a4x["NCCL_ENV_PLUGIN"] == "gcp" and "NCCL_TUNER_CONFIG_PATH" not in a4x
    assert a4x["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64:/usr/local/gib/lib64"
    assert a4x["PYTHONPATH"] == "/data/verl"
