"""verl-gke: config -> components -> exports. Wiring only."""

import pulumi

from components.config import from_pulumi

cfg, hf_token = from_pulumi()

pulumi.export("gpuPlatform", cfg.platform)
pulumi.export("gpuNodes", cfg.gpu_nodes)
pulumi.export("gpusPerNode", cfg.facts.gpus_per_node)
