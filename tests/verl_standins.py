"""Stand-ins for what verl's validate_config reads that cannot exist here, for tests/verl_validate.py's child:
the model folder a critic loads (HFModelConfig) and the A4X image's vLLM (its version and the names verl imports,
read from the image's pinned vLLM source). Each keeps exactly what validate_config reads; the rest is absent.
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import json
import sys
import types
import typing
from pathlib import Path

# huggingface.co/Qwen/Qwen2.5-32B-Instruct (and every Qwen2.5 Instruct): tokenizer_config.json's
# added_tokens_decoder, eos_token "<|im_end|>", pad_token "<|endoftext|>", bos_token null; config.json's
# bos_token_id 151643, eos_token_id 151645; generation_config.json's eos_token_id [151645, 151643].
QWEN25_SPECIAL = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}


def write_qwen2_model(dest: Path, shape: dict[str, int | bool]) -> None:
    """A Qwen2.5 Instruct model folder without weights: config.json from the shape verl-gke pins
    (domain/run_memory.MODELS; other fields Qwen2Config's defaults), the generation config and a byte-level
    tokenizer holding the model's special tokens at their real ids (verl copies bos/eos/pad ids into the config;
    the real vocabulary's merges are not read until the first prompt is tokenized)."""
    dest.mkdir(parents=True, exist_ok=True)
    hidden, head_dim = int(shape["hidden"]), int(shape["head_dim"])
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
              "hidden_size": hidden, "intermediate_size": shape["intermediate"],
              "num_hidden_layers": shape["layers"], "num_attention_heads": hidden // head_dim,
              "num_key_value_heads": shape["kv_heads"], "vocab_size": shape["vocab"],
              "tie_word_embeddings": bool(shape["tied_embeddings"]), "torch_dtype": "bfloat16",
              "bos_token_id": QWEN25_SPECIAL["<|endoftext|>"], "eos_token_id": QWEN25_SPECIAL["<|im_end|>"]}
    generation = {"bos_token_id": QWEN25_SPECIAL["<|endoftext|>"], "pad_token_id": QWEN25_SPECIAL["<|endoftext|>"],
                  "eos_token_id": [QWEN25_SPECIAL["<|im_end|>"], QWEN25_SPECIAL["<|endoftext|>"]]}
    from tokenizers.pre_tokenizers import ByteLevel

    vocab = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}
    added = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for c, i in QWEN25_SPECIAL.items()]
    tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
                 "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                                   "use_regex": True},
                 "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": False,
                                                      "trim_offsets": False, "use_regex": True},
                 "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                           "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                           "vocab": {**vocab, **QWEN25_SPECIAL}, "merges": []}}
    tokenizer_config = {"tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|im_end|>",
                        "pad_token": "<|endoftext|>", "unk_token": None, "add_prefix_space": False,
                        "model_max_length": 131072, "errors": "replace", "clean_up_tokenization_spaces": False}
    for name, body in (("config.json", config), ("generation_config.json", generation),
                       ("tokenizer.json", tokenizer), ("tokenizer_config.json", tokenizer_config)):
        (dest / name).write_text(json.dumps(body))


def _bound_names(tree: ast.Module) -> dict[str, ast.expr | None]:
    """Names a module binds when imported (its top level, both arms of try/if, not `if TYPE_CHECKING`), with the
    assigned expression; vLLM's lazy exports (MODULE_ATTRS, served by its module __getattr__) too."""
    names: dict[str, ast.expr | None] = {}

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names[node.name] = None
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update({(a.asname or a.name).split(".")[0]: None for a in node.names if a.name != "*"})
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            names[name.id] = node.value
                if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                        and any(isinstance(t, ast.Name) and t.id == "MODULE_ATTRS" for t in node.targets)):
                    names.update({k.value: None for k in node.value.keys if isinstance(k, ast.Constant)})
            elif isinstance(node, ast.Try):
                visit(node.body + [s for h in node.handlers for s in h.body] + node.orelse + node.finalbody)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                visit(node.body + node.orelse)

    visit(tree.body)
    return names


class VllmStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """vLLM as the A4X image holds it, for what validate_config asks: its installed version (a dist-info) and its
    modules, served from the image's pinned vLLM source: a module exists only where the source has its file, a
    name only where that file binds it (else ImportError, as from the real vLLM), a `Literal[...]` alias (such
    as vllm.config.lora.MaxLoRARanks) holds the source's values, and anything else is a placeholder that refuses
    to be called (vLLM itself needs CUDA and its compiled kernels)."""

    def __init__(self, source: Path, version: str, site: Path) -> None:
        self.source = source
        dist = site / f"vllm-{version}.dist-info"
        dist.mkdir(parents=True, exist_ok=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
        sys.path.append(str(site))
        sys.meta_path.insert(0, self)

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] != "vllm":
            return None
        base = self.source.joinpath(*fullname.split("."))
        for file, package in ((base / "__init__.py", True), (base.with_suffix(".py"), False)):
            if file.is_file():
                spec = importlib.machinery.ModuleSpec(fullname, self, origin=str(file), is_package=package)
                if package:
                    spec.submodule_search_locations = [str(base)]
                return spec
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        bound = _bound_names(ast.parse(Path(str(module.__spec__.origin)).read_text()))
        name = module.__name__

        def lookup(attr: str) -> object:
            if attr not in bound:
                raise AttributeError(f"module {name!r} has no attribute {attr!r} (vLLM source {self.source})")
            value = _literal(bound[attr]) or _placeholder(name, attr)
            setattr(module, attr, value)
            return value

        module.__getattr__ = lookup  # type: ignore[method-assign]


def _literal(node: ast.expr | None) -> object:
    """`Literal[a, b, ...]` of constants, evaluated; None for anything else."""
    if not (isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("Literal", "typing.Literal")):
        return None
    try:
        values = ast.literal_eval(node.slice)
    except ValueError:
        return None
    return typing.Literal[values if isinstance(values, tuple) else (values,)]  # type: ignore[valid-type]


def _placeholder(module: str, name: str) -> type:
    def refuse(*_: object, **__: object) -> None:
        raise RuntimeError(f"stand-in for {module}.{name}: the real vLLM needs the A4X image")

    return type(name, (), {"__module__": module, "__init__": refuse})
