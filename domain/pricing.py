"""What a stack costs per hour, from a price table pinned here with its date and source per price.

List prices in USD, before taxes, discounts and committed-use contracts. A price the sources did not
give is `None` ("unknown") rather than a guess: the estimate then says which part it leaves out, and
a dollar budget (runBudgetUsd) cannot be converted to hours. Prices change (Spot's up to once a day):
this is an estimate for planning, not a bill.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

CapacityKind = Literal["reservation", "flex-start", "spot", "on-demand"]
CAPACITY_KINDS: tuple[CapacityKind, ...] = ("reservation", "flex-start", "spot", "on-demand")

PRICE_KEY = "verl-gke:gpuNodeHourlyUsd"
"""Where the user states the GPU nodes' price per capacity kind (a negotiated one, or one the table lacks)."""
MAX_NODE_USD_PER_HOUR = 1000.0
"""A typo guard on a stated price: no GPU node lists near it (A3 Ultra: $83.49 on demand, MACHINE_PRICES)."""


SET_PRICE = f"set {PRICE_KEY} (USD per GPU node-hour, by capacity kind)"


def unknown_price(machine_type: str, kinds: Sequence[str], region: str) -> str:
    """The one sentence every place says when the GPU nodes' price is unknown, naming the key that sets it."""
    return f"unknown: verl-gke's price table has no {machine_type} price on {' or '.join(kinds)} in {region}; {SET_PRICE}"

FLEX_START_MAX_HOURS = 7 * 24
"""Flex-start (Dynamic Workload Scheduler) nodes run at most seven days (GKE "About flex-start
provisioning", https://cloud.google.com/kubernetes-engine/docs/concepts/dws)."""

HOURS_PER_MONTH = 730
"""Google Cloud's month for per-month prices (the pricing pages' 730 hours)."""

# Sources, each read on PRICES_READ unless it says otherwise.
PRICES_READ = "2026-12-03"
_BILLING_CATALOG_SNAPSHOT = (
    "https://huggingface.co/datasets/tanod/cloud-gpu-list-prices (Google Cloud Billing Catalog API, "
    "snapshot 2026-10-13, per-GPU instance share x 8)")
_C2_TABLE = ("https://github.com/Cyclenerd/google-cloud-pricing-cost-calculator/blob/"
             "0166a59ebba7c36f2cc8c931d9f258dcebc44776/pricing.yml (Cloud Billing Catalog; c2-standard-4 x 4: "
             "C2 is priced per vCPU and GB, so 16 vCPU/64 GB is four times 4 vCPU/16 GB)")
_G2_TABLE = ("https://github.com/Cyclenerd/google-cloud-pricing-cost-calculator/blob/"
             "0166a59ebba7c36f2cc8c931d9f258dcebc44776/pricing.yml (Cloud Billing Catalog, generated 2025-03-06: "
             "g2-standard-8 hour and hour_spot, read 2026-12-07; Google's own pages, https://cloud.google.com/compute/gpus-pricing "
             "and https://cloud.google.com/spot-vms/pricing, price G2 by its L4, vCPUs and memory)")
_RESERVATION_RULE = ("https://cloud.google.com/compute/docs/instances/reservations-overview: reserved VMs are "
                     "billed at the on-demand rate whether or not they run; committed-use discounts are not modeled")
_FLEX_UNKNOWN = ("no published flex-start price found for this machine (https://cloud.google.com/products/dws/"
                 "pricing is not in our sources)")
NAT_SOURCE = "https://cloud.google.com/nat/pricing"
GCS_SOURCE = "https://cloud.google.com/storage/pricing"


@dataclass(frozen=True)
class Price:
    """One price in USD per hour, or None when the sources give none."""

    usd_per_hour: float | None
    source: str


def _unknown(why: str) -> Price:
    return Price(None, why)


def _machine(on_demand: float | None, spot: float | None, source: str) -> dict[CapacityKind, Price]:
    """A GPU machine's prices by capacity kind: a reservation bills at the on-demand rate."""
    od = Price(on_demand, source) if on_demand is not None else _unknown(source)
    return {
        "on-demand": od,
        "reservation": Price(on_demand, f"{_RESERVATION_RULE}; on-demand from {source}") if on_demand is not None
        else _unknown(source),
        "spot": Price(spot, source) if spot is not None else _unknown(source),
        "flex-start": _unknown(_FLEX_UNKNOWN),
    }


_NO_A4_SOURCE = (
    "no Google-published or Billing-Catalog price for this machine found in our sources (SkyPilot's catalog, "
    "built from the Billing Catalog, lists a4-highgpu-8g at 0.0 and a4x-highgpu-4g not at all: "
    "https://github.com/skypilot-org/skypilot-catalog/blob/8427bbff988abdd050a9f51addd314ef31cb4e85/catalogs/v8/gcp/vms.csv; "
    "nor Cyclenerd's Billing-Catalog table at 0166a59e (_G2_TABLE), which has no a4 or a4x machine, read 2026-12-07); "
    "your price: set verl-gke:gpuNodeHourlyUsd")

# (machine type, region) -> capacity kind -> price of one node per hour.
MACHINE_PRICES: dict[tuple[str, str], dict[CapacityKind, Price]] = {
    # 8 x 10.4365 and 8 x 6.2607 per GPU-hour.
    ("a3-ultragpu-8g", "us-central1"): _machine(83.492, 50.0856, _BILLING_CATALOG_SNAPSHOT),
    # 8 x 11.4934 and 8 x 6.8944 per GPU-hour.
    ("a3-ultragpu-8g", "europe-west1"): _machine(91.9472, 55.1552, _BILLING_CATALOG_SNAPSHOT),
    ("a4-highgpu-8g", "us-central1"): _machine(None, None, _NO_A4_SOURCE),
    ("a4x-highgpu-4g", "us-central1"): _machine(None, None, _NO_A4_SOURCE),
    # The smoke stack's G2: one L4, 8 vCPUs, 32 GB.
    ("g2-standard-8", "us-central1"): _machine(0.853624271, 0.336764, _G2_TABLE),
    ("g2-standard-8", "europe-west1"): _machine(0.939925708, 0.339764, _G2_TABLE),
}

# (machine type, region) -> on-demand price of one CPU node per hour (the head's pool never runs on Spot).
CPU_MACHINE_PRICES: dict[tuple[str, str], Price] = {
    ("c2-standard-16", "us-central1"): Price(0.835232, _C2_TABLE),
    ("c2-standard-16", "europe-west1"): Price(0.9188, _C2_TABLE),
}

NAT_USD_PER_VM_HOUR = 0.0014
"""Per VM that uses the gateway, up to 32 VMs; the same in every region (NAT_SOURCE)."""
NAT_MAX_USD_PER_HOUR = 0.044
NAT_USD_PER_IP_HOUR = 0.005
"""Per external address the gateway uses (AUTO_ONLY allocates at least one)."""
# Data processed through NAT ($0.045/GiB) depends on traffic, not time: not in the hourly price.

GCS_STANDARD_USD_PER_GB_MONTH: dict[str, float] = {"us-central1": 0.020, "europe-west1": 0.020}
"""Standard storage in a region, per GB-month (GCS_SOURCE)."""

GKE_CLUSTER_USD_PER_HOUR = 0.10
"""GKE's cluster management fee, Standard and Autopilot (https://cloud.google.com/kubernetes-engine/pricing)."""


@dataclass(frozen=True)
class StackShape:
    """What the hourly price depends on; plain values from the stack config."""

    machine_type: str
    cpu_machine_type: str
    region: str
    gpu_nodes: int
    cpu_nodes: int
    """CPU nodes that run all the time (the pool's minimum); Autopilot: 0, its pods are billed differently."""
    nat: bool
    bucket_gb: float
    """Data kept in the bucket, for its storage price."""
    autopilot: bool = False
    your_prices: Mapping[str, float] = field(default_factory=dict)
    """capacity kind -> the user's price of one GPU node per hour (PRICE_KEY); it replaces the table's."""


@dataclass(frozen=True)
class HourlyCost:
    """The stack's price per hour on one capacity kind: the known parts, and the parts left out."""

    kind: CapacityKind
    parts: dict[str, float]
    unknown: tuple[str, ...]
    """Parts left out of the total (their price depends on use, or is not in the table)."""
    gpu_unknown: str | None = None
    """unknown_price()'s sentence when the GPU nodes' price is unknown: then there is no total."""
    yours: bool = False
    """The GPU nodes are priced at the user's PRICE_KEY, not the table's."""

    @property
    def gpu_known(self) -> bool:
        return "gpu nodes" in self.parts

    @property
    def usd(self) -> float | None:
        """The total of the known parts, rounded to cents; None without the GPU nodes' price (the bulk)."""
        return round(sum(self.parts.values()), 2) if self.gpu_known else None

    def line(self) -> str:
        if self.usd is None:
            return f"{self.kind}: {self.gpu_unknown}"
        parts = ", ".join(f"{name} ${usd:.2f}" + (f" at {PRICE_KEY}" if name == "gpu nodes" and self.yours else "")
                          for name, usd in self.parts.items())
        left_out = f"; not included: {', '.join(self.unknown)}" if self.unknown else ""
        return f"{self.kind}: ${self.usd:.2f}/h ({parts}{left_out})"


def hourly_cost(shape: StackShape, kind: CapacityKind) -> HourlyCost:
    """The stack's price per hour while its GPU nodes run on `kind`: at the user's price for it, else the table's."""
    parts: dict[str, float] = {}
    unknown: list[str] = []
    gpu = MACHINE_PRICES.get((shape.machine_type, shape.region), {}).get(kind)
    yours = shape.your_prices.get(kind)
    if yours is not None:
        parts["gpu nodes"] = shape.gpu_nodes * yours
    elif gpu is not None and gpu.usd_per_hour is not None:
        parts["gpu nodes"] = shape.gpu_nodes * gpu.usd_per_hour
    if shape.autopilot:
        unknown.append("Autopilot's CPU pods and any accelerator premium")
    elif shape.cpu_nodes:
        cpu = CPU_MACHINE_PRICES.get((shape.cpu_machine_type, shape.region))
        if cpu is not None and cpu.usd_per_hour is not None:
            parts["cpu nodes"] = shape.cpu_nodes * cpu.usd_per_hour
        else:
            unknown.append(f"{shape.cpu_machine_type} in {shape.region}")
    parts["gke"] = GKE_CLUSTER_USD_PER_HOUR
    if shape.nat:
        vms = shape.gpu_nodes + shape.cpu_nodes
        parts["nat"] = min(NAT_MAX_USD_PER_HOUR, NAT_USD_PER_VM_HOUR * vms) + NAT_USD_PER_IP_HOUR
        unknown.append("NAT data processing ($0.045/GiB)")
    gcs = GCS_STANDARD_USD_PER_GB_MONTH.get(shape.region)
    if gcs is not None:
        parts["bucket"] = shape.bucket_gb * gcs / HOURS_PER_MONTH
    else:
        unknown.append(f"GCS storage in {shape.region}")
    missing = None if "gpu nodes" in parts else unknown_price(shape.machine_type, [kind], shape.region)
    return HourlyCost(kind, parts, tuple(unknown), missing, yours is not None)


def worst_case(costs: list[HourlyCost]) -> float | None:
    """The highest known hourly price of the kinds a stack may get: what it may cost; None if any is unknown."""
    prices = [c.usd for c in costs]
    if not prices or any(p is None for p in prices):
        return None
    return max(p for p in prices if p is not None)


def run_hours(budget_hours: float, budget_usd: float, usd_per_hour: float | None,
              flex_start: bool) -> float | None:
    """The run's budget in hours: the earliest of runBudgetHours, runBudgetUsd at the hourly price and,
    when nodes may be flex-start, its seven days. None: no bound."""
    bounds = [math.inf]
    if budget_hours:
        bounds.append(budget_hours)
    if budget_usd and usd_per_hour:
        bounds.append(budget_usd / usd_per_hour)
    if flex_start:
        bounds.append(FLEX_START_MAX_HOURS)
    hours = min(bounds)
    return None if math.isinf(hours) else hours


def run_cost(hours: float | None, usd_per_hour: float | None) -> float | None:
    """The run's estimate: its budget in hours at the hourly price, rounded to cents."""
    if hours is None or usd_per_hour is None:
        return None
    return round(hours * usd_per_hour, 2)


def spend_so_far(started_at_s: float, now_s: float, usd_per_hour: float) -> float:
    """What the stack has cost since the run's first attempt started, rounded to cents."""
    return round(max(0.0, now_s - started_at_s) / 3600 * usd_per_hour, 2)


def run_estimate_line(usd_per_hour: float | None, hours: float | None, unknown: str = "") -> str:
    """The run's estimate as preview and synth print it; `unknown`: unknown_price()'s sentence when there is no
    price."""
    if usd_per_hour is None:
        return unknown
    if hours is None:
        return (f"no bound (no runBudgetHours, runBudgetUsd or flex-start): ${usd_per_hour:.2f} for every hour "
                "the GPU nodes run")
    return f"${run_cost(hours, usd_per_hour):.2f} for at most {hours:.1f} h at ${usd_per_hour:.2f}/h"
