"""A stack's run: its identity (domain/run_identity.py) and trainer choice, from its config."""

from __future__ import annotations

from domain.config import StackConfig
from domain.grpo_spec import overrides
from domain.run_identity import legacy_trainer_for_deadline, run_id


def stack_run(cfg: StackConfig) -> tuple[str, bool]:
    """The stack's run id, and whether it runs verl's legacy trainer (for the budget's deadline)."""
    legacy = legacy_trainer_for_deadline(cfg.verl.version, cfg.run_budget_hours > 0)
    if cfg.staged_verl:
        verl = cfg.staged_verl.version
    else:
        verl = f"{'source' if cfg.verl_source_install else 'image'} {cfg.verl_image}"
    args = [(o.key, o.value) for o in overrides(cfg.verl, legacy_trainer=legacy)]
    return run_id(model=cfg.model, model_revision=cfg.model_revision, dataset=cfg.dataset,
                  dataset_revision=cfg.dataset_revision, verl=verl, gpus_per_node=cfg.facts.gpus_per_node,
                  nnodes=cfg.gpu_nodes, overrides=args), legacy
