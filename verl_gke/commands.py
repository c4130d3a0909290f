"""Running the user's own command-line tools (gcloud, pulumi) with a deadline and a one-line error."""

from __future__ import annotations

import subprocess


def run_tool(command: list[str], shown: str, timeout_s: float, error: type[Exception]) -> str:
    """`command`'s stdout; `error` naming `shown` when it does not finish in time or fails (its
    last stderr line is the user's clue)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise error(f"`{shown}` did not finish within {timeout_s:g} s") from None
    if done.returncode != 0:
        last = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), "no message")
        raise error(f"`{shown}` failed (exit {done.returncode}): {last.strip()}")
    return done.stdout
