"""`verl-gke dashboard`: the Ray dashboard through a port-forward and this command's local proxy, open
until Ctrl-C or --minutes."""

from __future__ import annotations

import argparse
import time
from typing import Any

from verl_gke import reach, stack_outputs
from verl_gke.console import positive_float, progress

DASHBOARD_MINUTES = 60.0
"""How long `verl-gke dashboard` keeps its port-forward open unless told otherwise."""


def add_parser(subparsers: Any, parents: list[argparse.ArgumentParser]) -> None:
    dash = subparsers.add_parser(
        "dashboard", parents=parents, help="open the Ray dashboard locally until Ctrl-C or --minutes",
        description="Open a port-forward to the Ray head behind a local proxy of this command and print its URL "
                    "until Ctrl-C or --minutes. The URL holds a secret of this session: the proxy admits only "
                    "requests that carry it, for its own address, from no other site, so a web page in your "
                    "browser cannot reach the Ray Job API (which has no authentication before Ray 2.52). With "
                    "--dashboard-url: checks that it answers, prints it and returns (no port-forward to hold).")
    dash.add_argument("--minutes", type=positive_float, default=DASHBOARD_MINUTES, metavar="M",
                      help=f"close the port-forward after M minutes (default {DASHBOARD_MINUTES:g})")
    dash.set_defaults(handler=cmd_dashboard)


def cmd_dashboard(args: argparse.Namespace) -> int:
    outputs = None if args.dashboard_url else stack_outputs.load(args.outputs, args.stack)
    with reach.head(args, outputs) as url:
        if args.dashboard_url:
            print(f"Ray dashboard: {url}")
            return 0  # directly reachable: there is no tunnel to hold open
        try:  # Ctrl-C, or the time limit, ends it
            print(f"Ray dashboard: {url}/", flush=True)
            progress("the link holds this session's secret: it works in your browser until this command ends, and "
                      "nothing without it (another site, a page that guesses the port) gets through")
            progress(f"port-forward open for {args.minutes:g} min; press Ctrl-C to close it sooner")
            end = time.monotonic() + args.minutes * 60
            while (left := end - time.monotonic()) > 0:
                time.sleep(min(left, 60.0))
            progress(f"closing the port-forward after {args.minutes:g} min")
        except KeyboardInterrupt:
            progress("closing the port-forward")
    return 0
