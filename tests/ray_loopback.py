"""`ray start` for a node that joins a test head, with every address kept at 127.0.0.1.

Ray 2.60 joins a head only in multi-node mode, which maps 127.0.0.1 to the machine's own address
(ray/_private/services.py `resolve_ip_for_localhost`) and so listens on every interface. This launcher
turns the mode on for its own process only; what it starts inherits RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
and keeps 127.0.0.1. Used by tests/ray_head.start_node as
`python -m tests.ray_loopback start --address=127.0.0.1:<port> --node-ip-address=127.0.0.1 ...`."""

from __future__ import annotations

import sys

import ray._private.ray_constants as ray_constants
import ray._private.services as services
from ray.scripts.scripts import main


def _keep(host: str) -> str:
    return host


if __name__ == "__main__":
    ray_constants.ENABLE_RAY_CLUSTER = True
    services.resolve_ip_for_localhost = _keep
    sys.exit(main())
