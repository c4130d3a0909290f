"""The Ray test harness itself: node starts on one machine never pick ports at the same time."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.ray_head import PORT_LOCK, ports_held

REPO = Path(__file__).resolve().parent.parent


def test_a_node_start_waits_for_another_processes_port_pick_and_names_the_lock() -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom tests.ray_head import ports_held\n"
                               "with ports_held():\n    print('held', flush=True)\n    time.sleep(30)"],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        started = time.monotonic()
        with pytest.raises(RuntimeError) as caught:
            with ports_held(timeout_s=1.0):
                pass
        assert time.monotonic() - started >= 1.0
        assert str(caught.value) == f"another Ray node start held {PORT_LOCK} for over 1 s"
    finally:
        holder.kill()
        holder.wait()
    with ports_held():  # free again once its holder is gone (another worker may hold it a while)
        pass
