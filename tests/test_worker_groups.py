"""`make test`'s `--dist loadgroup`: the tests of a file that share a module fixture (a Ray head of the
module's own, its nodes) run on one worker, so the fixture is set up once, not once per worker; so do the tests of
one `xdist_group` mark (tests/test_verl_config.py's validator process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROBE = '''
import os, time, pytest

@pytest.fixture(scope="module")
def shared():
    with open(os.environ["PROBE_LOG"], "a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")

def marked():
    with open(os.environ["PROBE_LOG"] + ".marked", "a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
    time.sleep(0.2)

def test_alone_0(): time.sleep(0.2)
''' + "".join(f"@pytest.mark.xdist_group('own')\ndef test_marked_{i}(): marked()\n" for i in range(6)) + "".join(
    f"def test_shared_{i}(shared): time.sleep(0.2)\ndef test_alone_{i + 1}(): time.sleep(0.2)\n" for i in range(4))


def test_a_module_fixture_is_set_up_on_one_worker_once_and_a_marked_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_probe.py").write_text(PROBE)
    log = tmp_path / "setups"
    # Of the installed pytest plugins, xdist alone: importing the others (hypothesis, hydra's) was most of the CPU.
    env = {**os.environ, "PYTHONPATH": str(REPO), "PROBE_LOG": str(log), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "xdist.plugin",
                           "-p", "tests.conftest",
                           "-n", "2", "--dist", "loadgroup", "--rootdir", str(tmp_path), str(tmp_path / "test_probe.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(log.read_text().split()) == 1, log.read_text()
    workers = Path(f"{log}.marked").read_text().split()
    assert len(workers) == 6 and len(set(workers)) == 1, workers
