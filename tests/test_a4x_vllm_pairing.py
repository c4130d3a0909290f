"""A4X runs verl 0.9.0 on `verlai/verl:vllm023.aarch64.dev1`, a pairing verl's CI never ran (its CI ran
0.9.0 with vLLM 0.24.0). Evidence kept as a test over the pinned sources: everything verl 0.9.0 asks
of vLLM (the names it imports and the members of them it touches, the `vllm serve` options it sets,
the engine methods it calls, the run model's `load_weights`) is compared between the image's vLLM
(0.23.0's sdist) and the CI's (0.24.0's); every difference is listed below with where verl meets it.
A difference not listed, or a listed one that is gone, fails the test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from domain.platforms import PLATFORMS, VERL_0_9_0, VLLM_0_23_0, VLLM_0_24_0
from domain.verl_wheel import unpacked as verl_unpacked
from tests import vllm_calls, vllm_source

RUN = "on the run's path"
OFF = "off the run's path"
_BF16 = "quantized rollouts only; the run's rollout is bf16 (rollout.quantization unset)"
_LORA = "LoRA only; the run trains the full model (lora rank 0)"
_MOE = "MoE models and their quantized kernels only; Qwen2.5-32B is dense"

# finding -> (kind of difference, where verl meets it, why the run behaves as under verl's CI).
# Read in both sdists (vLLM 0.23.0 and 0.24.0) and in verl 0.9.0's callers.
REVIEWED: dict[str, tuple[str, str, str]] = {
    "vllm.entrypoints.openai.api_server:init_app_state": (
        "body differs", RUN,
        "builds the OpenAI server's handlers; 0.24 renames the tokenization handler and reads the reasoning "
        "parser from another argument; verl passes (engine, config, state, args) alike and reads none of them"),
    "vllm.model_executor.model_loader.utils:process_weights_after_loading": (
        "body differs", RUN,
        "verl's bf16 weight sync runs it after the last bucket; 0.24 adds release_device_memory_under_pressure, "
        "which returns at once on a discrete GPU (is_integrated false on GB200)"),
    "vllm.transformers_utils.config:get_config": (
        "body differs", RUN,
        "0.23 still has a GGUF branch that 0.24 dropped; the run's model is safetensors, so both take the same path"),
    "vllm.lora.lora_model:LoRAModel.from_local_checkpoint": ("body differs", OFF, _LORA),
    "vllm.lora.lora_model:LoRAModel.from_lora_tensors": ("body differs", OFF, _LORA),
    "vllm.lora.models:LoRAModel": (
        "missing in both", OFF, "the fallback of a guarded import whose first choice (vllm.lora.lora_model) exists"),
    "vllm.lora.peft_helper:PEFTHelper.from_local_dir": ("body differs", OFF, _LORA),
    "vllm.model_executor.layers.fused_moe:FusedMoE": ("signature differs", OFF, f"Ascend NPU patch; {_MOE}"),
    "vllm.model_executor.layers.fused_moe:MoERunner": ("missing in the image's vLLM", OFF, f"guarded; {_BF16}"),
    "vllm.model_executor.layers.fused_moe:RoutedExperts": ("signature differs", OFF, _BF16),
    "vllm.model_executor.layers.fused_moe.fused_marlin_moe:MarlinExperts": (
        "missing in both", OFF, "ModelOpt NVFP4 Marlin MoE only (fails under verl's CI vLLM alike)"),
    "vllm.model_executor.layers.fused_moe.layer:FusedMoE": ("signature differs", OFF, _BF16),
    "vllm.model_executor.layers.fused_moe.oracle.fp8:convert_to_fp8_moe_kernel_format": (
        "signature differs", OFF, _BF16),
    "vllm.model_executor.layers.fused_moe.oracle.nvfp4:convert_to_nvfp4_moe_kernel_format": (
        "signature differs", OFF, _BF16),
    "vllm.model_executor.layers.quantization.fp8:Fp8Config.__init__": ("signature differs", OFF, _BF16),
    "vllm.model_executor.layers.quantization.fp8:Fp8LinearMethod.process_weights_after_loading": (
        "body differs", OFF, _BF16),
    "vllm.model_executor.layers.quantization.fp8:Fp8MoEMethod.get_fused_moe_quant_config": (
        "body differs", OFF, _BF16),
    "vllm.model_executor.layers.quantization.utils.fp8_utils:maybe_post_process_fp8_weight_block": (
        "missing in both", OFF, f"verl calls it only below vLLM 0.20; {_BF16}"),
    "vllm.model_executor.layers.quantization.utils.fp8_utils:process_fp8_weight_block_strategy": (
        "body differs", OFF, _BF16),
    "vllm.model_executor.layers.quantization.utils.quant_utils:swizzle_blockscale": (
        "missing in both", OFF, "QAT W4A4 (fbgemm/cutlass) only"),
    "vllm.model_executor.layers.rotary_embedding.common:ApplyRotaryEmb.__init__": (
        "body differs", OFF, "Ascend NPU patch only"),
    "vllm.model_executor.models.kimi_vl:KimiVLForConditionalGeneration (bases)": (
        "signature differs", OFF, "a patch for Kimi-VL models only"),
    "vllm.model_executor.models.kimi_vl:KimiVLForConditionalGeneration.__init__": (
        "body differs", OFF, "a patch for Kimi-VL models only"),
    "vllm.model_executor.models.qwen3_next:Qwen3NextForCausalLM (bases)": (
        "signature differs", OFF, "a patch for Qwen3-Next models only"),
}


@pytest.fixture(scope="module")
def found() -> dict[str, str]:
    return vllm_calls.findings(verl_unpacked(VERL_0_9_0), vllm_source.unpacked(VLLM_0_23_0),
                               vllm_source.unpacked(VLLM_0_24_0))


def test_a4x_names_the_vllm_its_image_was_built_from_and_the_one_verls_ci_ran() -> None:
    a4x = PLATFORMS["a4x"]
    assert a4x.image == "verlai/verl:vllm023.aarch64.dev1"
    assert (a4x.verl.version, a4x.image_vllm, a4x.verl.ci_vllm) == ("0.9.0", VLLM_0_23_0, VLLM_0_24_0)
    # The x86 platforms run verl 0.6.1 in the image verl's CI ran it in: nothing to compare.
    assert [(p.image_vllm, p.verl.ci_vllm) for p in (PLATFORMS["a4"], PLATFORMS["a3u"])] == [(None, None)] * 2


def test_every_difference_between_the_images_vllm_and_the_cis_is_reviewed(found: dict[str, str]) -> None:
    assert found == {key: kind for key, (kind, _, _) in REVIEWED.items()}


def test_the_run_meets_no_changed_signature_and_no_missing_name() -> None:
    on_path = {key: kind for key, (kind, where, _) in REVIEWED.items() if where == RUN}
    assert set(on_path.values()) == {"body differs"}


def test_every_engine_option_and_engine_method_verl_uses_is_read(found: dict[str, str]) -> None:
    """The `vllm serve` options and AsyncLLM methods were compared, and none differs."""
    verl = verl_unpacked(VERL_0_9_0)
    assert {"max_num_seqs", "gpu_memory_utilization", "tensor_parallel_size", "enable_sleep_mode",
            "worker_extension_cls"} <= vllm_calls.engine_arg_keys(verl)
    assert {"generate", "wake_up", "sleep", "collective_rpc"} <= vllm_calls.engine_methods(verl)
    assert not [key for key in found if key.startswith(("vllm.engine.arg_utils:EngineArgs.",
                                                        "vllm.v1.engine.async_llm:AsyncLLM.",
                                                        "vllm.model_executor.models.qwen2:"))]


def test_no_version_gate_of_verl_lies_between_the_two_vllms() -> None:
    """verl branches on vLLM's version (`_VLLM_VERSION < version.parse("0.22.0")`): a gate in
    (0.23.0, 0.24.0] would make the image take another branch than verl's CI took."""
    def key(v: str) -> tuple[int, ...]:
        return tuple(int(p) for p in v.split("."))

    gates = vllm_calls.version_literals(verl_unpacked(VERL_0_9_0))
    assert "0.22.0" in gates
    assert [v for v in gates if key(VLLM_0_23_0.version) < key(v) <= key(VLLM_0_24_0.version)] == []


# --- the reader itself, on trees small enough to see -------------------------------------------------

def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


_VLLM_BASE = {
    "vllm/__init__.py": 'MODULE_ATTRS = {"LLM": ".entrypoints.llm:LLM"}\n',
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/llm.py": "class LLM:\n    def generate(self, prompts, params=None):\n        return 1\n",
    "vllm/engine/__init__.py": "",
    "vllm/engine/arg_utils.py": "class EngineArgs:\n    max_num_seqs: int = 256\n",
    "vllm/v1/__init__.py": "", "vllm/v1/engine/__init__.py": "",
    "vllm/v1/engine/async_llm.py": "class AsyncLLM:\n    async def sleep(self, level: int = 1):\n        pass\n",
    "vllm/model_executor/__init__.py": "", "vllm/model_executor/models/__init__.py": "",
    "vllm/model_executor/models/qwen2.py": "class Qwen2ForCausalLM:\n    def load_weights(self, w):\n        return w\n",
    "vllm/utils/__init__.py": "from .helpers import cdiv\n",
    "vllm/utils/helpers.py": '"""x"""\ndef cdiv(a, b):\n    """Ceil."""\n    return -(a // -b)\n',
}
_VERL = {
    "verl/__init__.py": "",
    vllm_calls.SERVER: (
        "from vllm import LLM\nfrom vllm.utils import cdiv\n"
        "try:\n    from vllm.gone import Thing\nexcept ImportError:\n    Thing = None\n"
        "async def launch_server(self):\n    args = {'max_num_seqs': 1}\n    build_cli_args_from_config(args)\n"
        "    await self.engine.sleep(level=1)\n    LLM().generate([])\n"),
}


def test_the_reader_sees_the_same_trees_as_the_same(tmp_path: Path) -> None:
    verl = _write(tmp_path / "verl", _VERL)
    a, b = _write(tmp_path / "a", _VLLM_BASE), _write(tmp_path / "b", _VLLM_BASE)
    assert vllm_calls.findings(verl, a, b) == {}


@pytest.mark.parametrize(("change", "finding"), [
    ({"vllm/entrypoints/llm.py": "class LLM:\n    def generate(self, prompts):\n        return 1\n"},
     {"vllm:LLM.generate": "signature differs"}),
    ({"vllm/utils/helpers.py": "def cdiv(a, b):\n    return a // b\n"}, {"vllm.utils:cdiv": "body differs"}),
    ({"vllm/utils/__init__.py": ""}, {"vllm.utils:cdiv": "missing in the image's vLLM"}),
    ({"vllm/engine/arg_utils.py": "class EngineArgs:\n    max_num_seqs: int = 1024\n"},
     {"vllm.engine.arg_utils:EngineArgs.max_num_seqs": "signature differs"}),
    ({"vllm/v1/engine/async_llm.py": "class AsyncLLM:\n    pass\n"},
     {"vllm.v1.engine.async_llm:AsyncLLM.sleep": "missing in the image's vLLM"}),
    ({"vllm/gone.py": "Thing = 1\n"}, {"vllm.gone:Thing": "missing in the CI's vLLM"}),
])
def test_the_reader_names_each_kind_of_difference(tmp_path: Path, change: dict[str, str],
                                                  finding: dict[str, str]) -> None:
    verl = _write(tmp_path / "verl", _VERL)
    image = _write(tmp_path / "image", {**_VLLM_BASE, **change})
    ci = _write(tmp_path / "ci", _VLLM_BASE)
    assert vllm_calls.findings(verl, image, ci) == finding


def test_an_unguarded_import_neither_vllm_has_is_a_finding(tmp_path: Path) -> None:
    verl = _write(tmp_path / "verl", {**_VERL, "verl/x.py": "from vllm.gone import Thing\n"})
    a, b = _write(tmp_path / "a", _VLLM_BASE), _write(tmp_path / "b", _VLLM_BASE)
    assert vllm_calls.findings(verl, a, b) == {"vllm.gone:Thing": "missing in both"}
