"""The GrpoJob provider as Pulumi's provider host loads it: serialized by pulumi.dynamic (dill, by
reference to `components.grpo_job.GrpoJobProvider`), then loaded in a fresh interpreter started as
`pulumi-resource-pulumi-python` starts `python -m pulumi.dynamic`: another working directory, no
project directory on sys.path, only the install. Props arrive with every number a float."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pulumi.dynamic.dynamic import serialize_provider

from components.grpo_job import GrpoJobProvider
from verl_gke import synth

REPO = Path(__file__).resolve().parent.parent

# What pulumi/dynamic/__main__.py's get_provider does with props["__provider"], then a method call.
_HOST = """
import base64, json, sys
import dill
request = json.load(sys.stdin)
assert not any(p in ("", ".") or p.startswith(request["repo"] + "/tests") for p in sys.path), sys.path
provider = dill.loads(base64.b64decode(request["provider"]))
checked = provider.check({}, request["news"])
diff = provider.diff("id", request["olds"], request["news"])
print(json.dumps({"module": type(provider).__module__, "class": type(provider).__name__,
                  "failures": [f.reason for f in checked.failures or []],
                  "replaces": diff.replaces, "changes": diff.changes}))
"""


def test_the_provider_loads_and_answers_in_the_provider_hosts_interpreter(synth_stack, tmp_path: Path) -> None:
    pickled = serialize_provider(GrpoJobProvider())
    job = next(r for r in synth_stack("a4-standard").registrations if r.type == synth.GRPO_JOB_TYPE)
    olds = synth.engine_numbers({k: v for k, v in job.inputs.items() if k != "__provider"})
    assert isinstance(olds["ready_timeout_s"], float) and isinstance(olds["expected_workers"], float)
    news = {**olds, "entrypoint": olds["entrypoint"] + " trainer.total_epochs=2"}
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "PULUMI_PROJECT": synth.PROJECT}
    answer = subprocess.run(
        [sys.executable, "-I", "-c", _HOST], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        input=json.dumps({"provider": pickled, "olds": olds, "news": news, "repo": str(REPO)}))
    assert answer.returncode == 0, answer.stderr
    assert json.loads(answer.stdout) == {"module": "components.grpo_job", "class": "GrpoJobProvider",
                                         "failures": [], "replaces": ["entrypoint"], "changes": True}


def test_the_provider_is_pickled_by_reference_not_by_value() -> None:
    """Every existing stack's state names `components.grpo_job.GrpoJobProvider`; by value, a change
    to the module would not reach stacks, and a rename would break none visibly."""
    import base64

    raw = base64.b64decode(serialize_provider(GrpoJobProvider()))
    assert b"components.grpo_job" in raw and b"GrpoJobProvider" in raw
    assert b"def create" not in raw and b"co_code" not in raw and len(raw) < 200
