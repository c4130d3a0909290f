"""The stack's price per hour, the run's estimate and budget, and the capacity config rules."""

from __future__ import annotations

import pytest

from domain import pricing
from domain.config import ConfigError, load_config
from tests.conftest import BASE_CONFIG, STACKS

A3U = {"verl-gke:platform": "a3u"}


def config(**changes: str) -> dict[str, str]:
    raw = {**BASE_CONFIG, **A3U}
    raw.update({f"verl-gke:{k}": v for k, v in changes.items()})
    return raw


def problems(**changes: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(config(**changes))
    return caught.value.problems


def test_hourly_cost_adds_the_gpu_nodes_cpu_nodes_gke_nat_and_bucket():
    shape = pricing.StackShape("a3-ultragpu-8g", "c2-standard-16", "us-central1", gpu_nodes=2, cpu_nodes=1,
                               nat=True, bucket_gb=768 * 2**30 / 1e9)
    cost = pricing.hourly_cost(shape, "spot")
    assert cost.parts == pytest.approx({"gpu nodes": 2 * 50.0856, "cpu nodes": 0.835232, "gke": 0.10,
                                        "nat": 3 * 0.0014 + 0.005, "bucket": 824.633720832 * 0.020 / 730})
    assert cost.usd == 101.14
    assert cost.unknown == ("NAT data processing ($0.045/GiB)",)


def test_a_reservation_bills_at_the_on_demand_rate():
    shape = pricing.StackShape("a3-ultragpu-8g", "c2-standard-16", "us-central1", 1, 0, False, 0.0)
    assert pricing.hourly_cost(shape, "reservation").parts["gpu nodes"] == 83.492
    assert pricing.hourly_cost(shape, "on-demand").parts["gpu nodes"] == 83.492


def test_an_unknown_gpu_price_makes_the_whole_price_unknown_and_says_why():
    shape = pricing.StackShape("a4-highgpu-8g", "c2-standard-16", "us-central1", 2, 1, True, 0.0)
    cost = pricing.hourly_cost(shape, "reservation")
    assert cost.usd is None
    assert cost.line() == f"reservation: {UNKNOWN_A4}"  # what is left out besides is not mixed in
    flex = pricing.hourly_cost(pricing.StackShape("a3-ultragpu-8g", "c2-standard-16", "us-central1", 2, 1, True, 0.0),
                               "flex-start")
    assert flex.usd is None


def test_every_known_price_names_its_source():
    for prices in pricing.MACHINE_PRICES.values():
        for price in prices.values():
            assert price.source.strip()
    assert all(p.source.startswith("https://") for p in pricing.CPU_MACHINE_PRICES.values())


def test_run_hours_is_the_earliest_bound():
    assert pricing.run_hours(0, 0, 100.0, flex_start=False) is None
    assert pricing.run_hours(10, 0, 100.0, flex_start=False) == 10
    assert pricing.run_hours(10, 500, 100.0, flex_start=False) == 5
    assert pricing.run_hours(0, 0, None, flex_start=True) == 168
    assert pricing.run_hours(200, 0, 100.0, flex_start=True) == 168
    assert pricing.run_cost(5, 101.14) == 505.7
    assert pricing.run_cost(None, 101.14) is None


def test_spend_so_far_from_the_first_attempts_start():
    assert pricing.spend_so_far(1_000.0, 1_000.0 + 5400, 184.94) == 277.41
    assert pricing.spend_so_far(2_000.0, 1_000.0, 184.94) == 0.0


def test_config_prices_its_capacity_and_converts_a_dollar_budget():
    cfg = load_config(config(runBudgetUsd="1000"))
    assert cfg.capacity_kinds == ("reservation",)
    assert cfg.hourly_usd == 167.95  # 2 x 83.492 + c2-standard-16 + GKE + NAT + 768Gi bucket
    assert cfg.run_budget_h == pytest.approx(1000 / 167.95)
    assert cfg.run_budget_s == 21435  # 5.95 h
    both = load_config(config(runBudgetUsd="1000", runBudgetHours="2"))
    assert both.run_budget_s == 7200


def test_several_kinds_cost_what_the_dearest_costs_and_flex_start_bounds_the_run():
    cfg = load_config(config(capacity='["spot","on-demand"]', reservation=""))
    assert [c.kind for c in cfg.hourly_costs] == ["spot", "on-demand"]
    assert cfg.hourly_usd == 167.95  # on-demand, the dearer
    flex = load_config(config(capacity='["flex-start"]', reservation=""))
    assert flex.hourly_usd is None and flex.run_budget_h == 168


UNKNOWN_A4 = ("unknown: verl-gke's price table has no a4-highgpu-8g price on reservation in us-central1; set "
              "verl-gke:gpuNodeHourlyUsd (USD per GPU node-hour, by capacity kind)")


def test_a_dollar_budget_without_a_price_is_refused_in_one_line():
    assert problems(platform="a4", runBudgetUsd="500") == [
        f"verl-gke:runBudgetUsd = 500: needs the stack's hourly price, which is {UNKNOWN_A4}; or set runBudgetHours."]


def test_an_unknown_price_is_one_sentence_naming_the_key_that_sets_it():
    cfg = load_config(config(platform="a4"))
    assert [c.line() for c in cfg.hourly_costs] == [f"reservation: {UNKNOWN_A4}"]
    assert pricing.run_estimate_line(cfg.hourly_usd, cfg.run_budget_h, cfg.price_unknown) == UNKNOWN_A4


def test_your_price_per_capacity_kind_prices_every_stack_and_its_dollar_budget():
    cfg = load_config(config(platform="a4", gpuNodeHourlyUsd='{"reservation": 60, "spot": 25.5}', runBudgetUsd="500"))
    # 2 x 60 + c2-standard-16 0.835232 + GKE 0.10 + NAT 0.0092 + 768Gi bucket 0.0226.
    assert cfg.hourly_usd == 120.97 and cfg.price_unknown is None
    assert cfg.run_budget_h == pytest.approx(500 / 120.97)
    assert cfg.hourly_costs[0].line() == (
        "reservation: $120.97/h (gpu nodes $120.00 at verl-gke:gpuNodeHourlyUsd, cpu nodes $0.84, gke $0.10, "
        "nat $0.01, bucket $0.02; not included: NAT data processing ($0.045/GiB))")
    # Your price replaces the table's where it has one too.
    assert load_config(config(gpuNodeHourlyUsd='{"reservation": 60}')).hourly_usd == 120.97


@pytest.mark.parametrize(("value", "message"), [
    ('{"reservation": 0.0}', "each price more than 0 and at most 1000 USD per GPU node-hour (A3 Ultra's list price "
                           "is $83.49)."),
    ('{"reservation": 5000.0}', "each price more than 0 and at most 1000 USD per GPU node-hour (A3 Ultra's list "
                              "price is $83.49)."),
    ('{"cheap": 5}', "must be one of 'reservation', 'flex-start', 'spot' or 'on-demand'"),
    ('{"spot": "low"}', "must be a number"),
])
def test_a_price_that_is_no_price_is_refused_naming_the_key(value: str, message: str):
    import json

    assert problems(gpuNodeHourlyUsd=value) == [f"verl-gke:gpuNodeHourlyUsd = {json.dumps(json.loads(value))}: {message}"]


@pytest.mark.parametrize(("changes", "kinds"), [
    ({}, ("reservation",)),
    ({"gpuSpot": "true", "reservation": ""}, ("spot",)),
    ({"clusterMode": "autopilot", "reservation": "", "platform": "a4"}, ("on-demand",)),
    ({"capacity": '["reservation","flex-start","spot"]'}, ("reservation", "flex-start", "spot")),
])
def test_capacity_defaults_to_what_gpu_spot_and_reservation_meant(changes: dict[str, str], kinds: tuple[str, ...]):
    assert load_config(config(**changes)).capacity_kinds == kinds


@pytest.mark.parametrize(("changes", "expected"), [
    ({"capacity": '["spot","spot"]', "reservation": ""},
     'verl-gke:capacity = ["spot", "spot"]: name each kind at most once, in order of preference.'),
    ({"capacity": '["flex-start"]', "reservation": "", "platform": "a4x", "gpuNodes": "4"},
     'verl-gke:capacity = ["flex-start"]: A4X (4x NVIDIA GB200, arm64) takes only reservation, spot in verl-gke '
     '(not flex-start).'),
    ({"capacity": '["reservation","spot"]', "platform": "a4x", "gpuNodes": "4"},
     'verl-gke:capacity = ["reservation", "spot"]: A4X (4x NVIDIA GB200, arm64) nodes come from one kind at a time '
     '(a fixed-size 1x72 placement); name one.'),
    ({"capacity": '["flex-start"]', "reservation": "", "gpuSpot": "true"},
     'verl-gke:gpuSpot = true: gpuSpot means capacity ["spot"]; with capacity ["flex-start"] set, drop gpuSpot.'),
    ({"capacity": '["reservation","spot"]', "reservation": ""},
     'verl-gke:reservation = "": capacity lists "reservation": set the reservation\'s name.'),
    ({"capacity": '["flex-start","spot"]'},
     'verl-gke:reservation = "my-reservation": capacity ["flex-start", "spot"] takes no reservation; add '
     '"reservation" or leave this empty.'),
    ({"capacity": '["cheap"]'},
     'verl-gke:capacity = ["cheap"]: must be one of \'reservation\', \'flex-start\', \'spot\' or \'on-demand\''),
])
def test_capacity_rules_name_the_key_in_one_line(changes: dict[str, str], expected: str):
    assert problems(**changes) == [expected]


def test_synth_prints_the_price_and_exports_the_estimate_and_the_budget_in_seconds(tmp_path):
    from verl_gke import synth

    result = synth.run("a3u-standard", overrides={"verl-gke:runBudgetUsd": "1000"})
    text = synth.summary(result, tmp_path)
    # europe-west1: 2 x 91.9472 + c2-standard-16 0.9188 + GKE 0.10 + NAT 0.0092 + bucket 0.0226.
    assert ("price per hour, GPU nodes on reservation: $184.94/h (gpu nodes $183.89, cpu nodes $0.92, gke $0.10, "
            "nat $0.01, bucket $0.02; not included: NAT data processing ($0.045/GiB))") in text
    assert "run estimate: $1000.00 for at most 5.4 h at $184.94/h" in text
    assert result.outputs["hourlyCostUsd"] == 184.94
    assert result.outputs["estimatedRunCostUsd"] == 1000.0
    [job] = [r for r in result.registrations if r.type == synth.GRPO_JOB_TYPE]
    assert job.inputs["budget_s"] == round(1000 / 184.94 * 3600)


# Every stack's price as shipped: the table's where a price is published, else the reason, which names the key.
STACK_PRICES = {
    # europe-west1: 2 x 91.9472 + c2-standard-16 0.9188 + GKE 0.10 + NAT 0.0092 + bucket 0.0226.
    "a3u-standard": [("reservation", 184.94)],
    # us-central1: 2 x g2-standard-8 (Spot 0.336764, on demand 0.853624271) + c2-standard-16 0.835232 + GKE 0.10
    # + NAT (3 VMs x 0.0014 + one address 0.005) + bucket 824.6 GB x 0.020 / 730.
    "smoke": [("spot", 1.64), ("on-demand", 2.67)],
    "a4": [("spot", None)], "a4-standard": [("reservation", None)], "a4x": [("reservation", None)],
}


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_has_the_published_price_or_says_none_is(stack: str) -> None:
    from domain.stack_files import raw_config

    cfg = load_config(raw_config(stack, overrides={"gcp:project": "my-project-123",
                                                   "verl-gke:reservation": "my-reservation"}
                                 if stack != "smoke" else {"gcp:project": "my-project-123"})[0])
    assert [(c.kind, c.usd) for c in cfg.hourly_costs] == STACK_PRICES[stack]
    for cost in cfg.hourly_costs:
        source = pricing.MACHINE_PRICES[(cfg.facts.machine_type, cfg.region)][cost.kind].source
        # A price names where it was read; no price says which sources had none and the key that sets it.
        assert ("https://" in source) if cost.usd else ("gpuNodeHourlyUsd" in source and "https://" in source)


def test_the_g2_price_is_the_billing_catalogs_per_region() -> None:
    prices = pricing.MACHINE_PRICES
    assert (prices[("g2-standard-8", "us-central1")]["on-demand"].usd_per_hour,
            prices[("g2-standard-8", "us-central1")]["spot"].usd_per_hour,
            prices[("g2-standard-8", "europe-west1")]["on-demand"].usd_per_hour,
            prices[("g2-standard-8", "europe-west1")]["spot"].usd_per_hour) == (0.853624271, 0.336764, 0.939925708,
                                                                                 0.339764)
    # Flex-start: no published price in our sources for any machine.
    assert prices[("g2-standard-8", "us-central1")]["flex-start"].usd_per_hour is None


def test_a_dollar_budget_works_on_the_smoke_stack() -> None:
    from domain.stack_files import raw_config

    cfg = load_config(raw_config("smoke", overrides={"gcp:project": "my-project-123",
                                                     "verl-gke:runBudgetUsd": "5"})[0])
    # The dearer kind bounds it: $5 at $2.67/h on demand.
    assert cfg.hourly_usd == 2.67 and cfg.run_budget_h == pytest.approx(5 / 2.67)
