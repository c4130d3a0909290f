"""The network figures the stack sets and `verl-gke verify` expects to find on GCP."""

from __future__ import annotations

VPC_MTU = 8896
"""The largest MTU GCP allows; Cluster Toolkit's gke-a4/a3-ultragpu blueprints set it on every VPC,
the gVNIC one included (the default 1460 fragments the host network's bulk traffic)."""

# Every GPU node pulls ~20 GB of images and the model over many parallel connections. Google's Cloud
# NAT guidance for such VMs (cloud.google.com/nat/docs/ports-and-addresses, "Dynamic port
# allocation"; and nat/docs/tune-nat-configuration): let each VM grow its
# ports as it needs them, from a higher floor than the default 64 static ports (which caps a node at
# 64 concurrent connections to one destination). Dynamic allocation needs endpoint-independent
# mapping off; min and max must be powers of two, max above min and at most 65536.
MIN_PORTS_PER_VM = 4096
MAX_PORTS_PER_VM = 65536
