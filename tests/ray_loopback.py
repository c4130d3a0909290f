"""`ray start` for a node that joins a test head, with every address kept at 127.0.0.1.

Ray (2.60, ray/scripts/scripts.py `start`) refuses to start a node that joins a head unless its
multi-node mode is on (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1, the default on Linux), and in that mode it
maps `--node-ip-address=127.0.0.1` and the head's 127.0.0.1 to the machine's own address
(ray/_private/services.py `resolve_ip_for_localhost`), so the node and everything it starts listen
on every interface of the machine (ray/dashboard/agent.py: loopback only for a localhost node).

This launcher turns the mode on for its own process only, without the mapping; the processes it
starts (raylet, agents, workers, job drivers) inherit RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 and keep
127.0.0.1 as Ray's own single-node mode does. Used by tests/ray_head.start_node as
`python -m tests.ray_loopback start --address=127.0.0.1:<port> --node-ip-address=127.0.0.1 ...`.
"""

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
