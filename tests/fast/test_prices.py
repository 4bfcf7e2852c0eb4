"""Hourly prices from the versioned table, checked against hand calculations."""

import pytest

from payload.cloud.accelerators import ACCELERATORS, accelerator
from payload.cloud.prices import PRICE_NOTE, PRICE_TABLE_DATE, cost_usd, hourly_cost, hourly_price
from payload.core.errors import UserError


def test_v4_8_on_demand_by_hand():
    price = hourly_price(accelerator("v4-8"), "us-central2-b", "on_demand")
    assert price.known and price.chips == 4 and price.region == "us-central2"
    assert price.per_chip == 3.22
    assert price.usd_per_hour == pytest.approx(12.88)  # 4 chips x 3.22
    assert price.source_date == PRICE_TABLE_DATE
    text = price.describe()
    assert text.startswith("$12.88/h for v4-8 (4 chips x $3.2200, on-demand, us-central2;")
    assert PRICE_TABLE_DATE in text and PRICE_NOTE in text


def test_v4_32_counts_chips_not_cores():
    price = hourly_price(accelerator("v4-32"), "us-central2-b", "on_demand")
    assert price.chips == 16
    assert price.usd_per_hour == pytest.approx(51.52)  # 16 x 3.22
    assert hourly_price(accelerator("v4-32"), "us-central2-b", "spot").usd_per_hour == (
        pytest.approx(14.72))  # 16 x 0.92


def test_v5litepod_16_on_demand_and_spot():
    acc = accelerator("v5litepod-16")
    assert hourly_price(acc, "us-central1-a", "on_demand").usd_per_hour == pytest.approx(19.20)
    spot = hourly_price(acc, "us-central1-a", "spot")
    assert spot.usd_per_hour == pytest.approx(3.408)  # 16 x 0.213
    assert "$3.41/h" in spot.describe() and "spot" in spot.describe()


def test_preemptible_is_billed_at_the_spot_rate():
    acc = accelerator("v5p-8")
    spot = hourly_price(acc, "us-east5-a", "spot")
    pre = hourly_price(acc, "us-east5-a", "preemptible")
    assert pre.usd_per_hour == spot.usd_per_hour == pytest.approx(4 * 1.56)
    assert pre.provisioning == "preemptible"


def test_missing_region_is_an_explicit_unknown():
    price = hourly_price(accelerator("v4-8"), "europe-west4-a", "on_demand")
    assert not price.known and price.usd_per_hour is None and price.per_chip is None
    assert price.describe().startswith(
        "no on-demand price for TPU v4 in europe-west4 in the price table of")
    # On-demand exists in us-west4 for v5e, spot does not: no number is invented for it.
    acc = accelerator("v5litepod-8")
    assert hourly_price(acc, "us-west4-a", "on_demand").usd_per_hour == pytest.approx(9.60)
    assert hourly_price(acc, "us-west4-a", "spot").usd_per_hour is None


def test_unknown_provisioning_is_one_line():
    with pytest.raises(UserError) as info:
        hourly_price(accelerator("v4-8"), "us-central2-b", "reserved")
    assert str(info.value) == (
        "unknown provisioning 'reserved'; use one of on_demand, spot, preemptible, flex_start")


def test_every_type_has_an_on_demand_price_in_some_zone_that_offers_it():
    for acc in ACCELERATORS.values():
        prices = [hourly_price(acc, zone, "on_demand") for zone in acc.zones]
        known = [p for p in prices if p.known]
        assert known, acc.name
        assert all(p.usd_per_hour == pytest.approx(p.per_chip * acc.chips) for p in known)


def test_config_run_plan_and_provider_all_price_through_the_one_catalog(monkeypatch):
    """A price comes from prices.hourly_cost alone: change the catalog's answer and the cluster's
    price, the run plan's cost and the gcp provider's node price all follow it."""
    from payload.cloud import prices
    from payload.config import parse_config
    from payload.training import runplan
    from payload.training.strategy import Hardware
    from tests.support.configs import plan_config

    asked = []

    def catalog(accelerator_type, zone, provisioning, slices=1):
        asked.append((accelerator_type, zone, provisioning))
        return prices.Price(usd_per_hour=7.0, per_chip=7.0 / 16, chips=16,
                            accelerator=accelerator_type, generation="v5e",
                            region="us-central1", provisioning=provisioning)

    monkeypatch.setattr(prices, "hourly_cost", catalog)
    config = parse_config(plan_config())
    assert config.cluster.hourly_usd() == 7.0
    plan = runplan.run_plan(config, hardware=Hardware.tpu("v5litepod-16", "plan"), num_workers=4)
    assert plan.usd_per_hour == 7.0
    assert plan.cost_usd == pytest.approx(prices.cost_usd(7.0, plan.wall_time_s / 3600))

    from launcher.providers import gcp_infra
    from payload.cloud import tpu_api

    node = tpu_api.Node(name="n", uid="u", state="READY", health="", health_description="",
                        symptoms=(), accelerator_type="v5litepod-16", runtime_version="r",
                        endpoints=(), create_time=None, labels={})
    assert gcp_infra.node_price(node, "us-central1-a", "spot") == "$7.00/h"
    assert asked and all(a == ("v5litepod-16", "us-central1-a", "spot") for a in asked)


def test_the_catalog_looks_up_by_accelerator_name():
    assert hourly_cost("v4-8", "us-central2-b", "on_demand") == hourly_price(
        accelerator("v4-8"), "us-central2-b", "on_demand")
    assert cost_usd(12.88, 2.0) == pytest.approx(25.76)
