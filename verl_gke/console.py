"""How the `verl-gke` commands speak: results on stdout, progress on stderr, an error as one line."""

from __future__ import annotations

import argparse
import sys

PROG = "verl-gke"


class CliError(Exception):
    """A failure the user can act on; printed as one line."""


class UsageError(Exception):
    """A wrong command line: nothing was tried."""

    exit_code = 2


class HeadUnreachable(CliError):
    """`wait` lost the head (or the run record) for longer than its outage window: the run may still be going."""

    exit_code = 3


class TimedOut(CliError):
    """A command's --timeout passed: what it waited for goes on."""

    exit_code = 8


def progress(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def fail(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)


def one_line(error: BaseException) -> str:
    return first_line(str(error)) or type(error).__name__


def first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def print_rows(rows: list[tuple[str, str]]) -> int:
    """`label  value` lines, the labels padded to one width."""
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label.ljust(width)}  {value}")
    return 0


def positive_float(text: str) -> float:
    """An argument type: a number of seconds (or minutes, gigabytes) above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value
