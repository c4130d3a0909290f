"""How a config problem reads: one line naming the key, the value and what is allowed, all of them at once."""

from __future__ import annotations

import json
from typing import Any


class ConfigError(Exception):
    """A stack config that must not be deployed; `str()` is the message for the user."""

    def __init__(self, problems: list[str], source: str = "The stack config") -> None:
        self.problems = problems
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__(f"{source} has {len(problems)} {noun}:\n" + "\n".join(f"  {p}" for p in problems))


def problem_line(key: str, value: Any, message: str) -> str:
    """One problem as users read it: `key = value: what is allowed`."""
    return f"{key} = {json.dumps(value)}: {message}"
