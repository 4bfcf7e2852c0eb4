"""The price catalog: what a TPU slice costs, from a versioned price table; the date shows.

    price = hourly_cost("v4-8", "us-central2-b", "on_demand")
    price.usd_per_hour      # 12.88 (4 chips x 3.22)
    price.describe()        # "$12.88/h (4 chips x $3.2200, on-demand, us-central2; prices of ...)"
    cost_usd(12.88, hours=2.0)   # 25.76

`hourly_cost` is the one lookup: the config (a cluster's price), the run plan and the gcp
provider all ask it, and every amount of money is `cost_usd` of a price and a time.

A region without an entry gives a Price whose `usd_per_hour` is None and whose `describe()` says so
("no spot price for TPU v4 in europe-west4 ..."): never a made-up number.
"""

from __future__ import annotations

from dataclasses import dataclass

from payload.cloud.accelerators import Accelerator, Topology, accelerator, region_of
from payload.core.errors import UserError

PRICE_TABLE_DATE = "2026-11-22"  # when this table was transcribed
PRICE_SOURCE = (
    "skypilot-org/skypilot-catalog catalogs/v7/gcp/vms.csv @017e250 (from the Cloud Billing "
    "Catalog API, TPU service E000-3F24-B8AA); snapshot date unknown"
)
PRICE_NOTE = "prices change: check https://cloud.google.com/tpu/pricing before a long run"

PROVISIONING = ("on_demand", "spot", "preemptible", "flex_start")

# USD per chip-hour (v4/v5p catalog prices divided by chips = suffix/2), by generation and region.
_ON_DEMAND: dict[str, dict[str, float]] = {
    "v4": {"us-central2": 3.22},
    "v5e": {
        "us-central1": 1.20,
        "us-east1": 1.20,
        "us-east5": 1.20,
        "us-west1": 1.20,
        "us-west4": 1.20,
        "us-south1": 1.416,
        "europe-west4": 1.56,
        "asia-east1": 1.389,
    },
    "v5p": {
        "us-central1": 4.20,
        "us-east1": 4.20,
        "us-east5": 4.20,
        "europe-west4": 4.2525,
        "us-south1": 4.779,
        "europe-west1": 4.459,
    },
    "v6e": {
        "us-central1": 2.70,
        "us-east1": 2.70,
        "us-east4": 2.70,
        "us-east5": 2.70,
        "us-south1": 2.70,
        "us-west1": 2.70,
        "europe-west4": 2.97,
        "asia-southeast1": 2.97,
        "asia-northeast1": 3.24,
        "asia-south1": 3.24,
    },
}
_SPOT: dict[str, dict[str, float]] = {
    "v4": {"us-central2": 0.92},
    "v5e": {"us-central1": 0.213, "us-east1": 0.213, "us-west1": 0.213, "us-east5": 0.60,
            "europe-west4": 0.443},
    "v5p": {"us-central1": 1.68, "us-east1": 1.68, "us-east5": 1.56, "europe-west4": 1.348,
            "us-south1": 2.395},
    "v6e": {"us-central1": 0.648, "us-east1": 0.648, "us-west1": 0.648, "us-east4": 0.858,
            "us-east5": 1.08, "us-south1": 1.89, "europe-west4": 0.713},
}
# The source has no separate preemptible TPU price: preemptible is billed here at the spot rate.
# Compute Engine TPU VMs (provider gce: machine types ct6e-*, ct5p-*, tpu7x-*) bill the same TPU
# SKUs per chip-hour as the TPU API's nodes of their generation: the v6e and v5p rows above serve
# both. TPU7x (2026-11-25): neither the catalog snapshot above nor Google's stored pricing pages
# give a per-chip-hour price, so its rows are empty and the price says "no ... price": never a
# made-up number. Flex-start (Dynamic Workload Scheduler) has its own discounted rates, which the
# source does not carry: empty too, until they are transcribed with their date.
_TPU7X_ON_DEMAND: dict[str, float] = {}
_TPU7X_SPOT: dict[str, float] = {}
_FLEX_START: dict[str, dict[str, float]] = {}
_TABLES = {"on_demand": {**_ON_DEMAND, "tpu7x": _TPU7X_ON_DEMAND},
           "spot": {**_SPOT, "tpu7x": _TPU7X_SPOT}, "preemptible": _SPOT,
           "flex_start": _FLEX_START}


@dataclass(frozen=True, kw_only=True)
class Price:
    usd_per_hour: float | None  # None: no entry for this generation, region and provisioning
    per_chip: float | None
    chips: int
    accelerator: str
    generation: str
    region: str
    provisioning: str
    source_date: str = PRICE_TABLE_DATE

    @property
    def known(self) -> bool:
        return self.usd_per_hour is not None

    def cost_usd(self, hours: float) -> float | None:
        return None if self.usd_per_hour is None else cost_usd(self.usd_per_hour, hours)

    def describe(self) -> str:
        label = self.provisioning.replace("_", "-")
        if self.usd_per_hour is None or self.per_chip is None:
            return (
                f"no {label} price for TPU {self.generation} in {self.region} in the price "
                f"table of {self.source_date}; {PRICE_NOTE}"
            )
        return (
            f"${self.usd_per_hour:,.2f}/h for {self.accelerator} ({self.chips} chips x "
            f"${self.per_chip:.4f}, {label}, {self.region}; prices of {self.source_date}, "
            f"{PRICE_NOTE})"
        )


def hourly_cost(accelerator_type: str, zone: str, provisioning: str, slices: int = 1) -> Price:
    """What `slices` slices of `accelerator_type` (e.g. "v4-8") cost per hour in `zone`, by
    the table."""
    from payload.cloud.accelerators import topology_of

    return hourly_price(topology_of(accelerator(accelerator_type), slices), zone, provisioning)


def cost_usd(usd_per_hour: float, hours: float) -> float:
    """What `hours` at `usd_per_hour` cost."""
    return usd_per_hour * hours


def hourly_price(acc: Accelerator | Topology, zone: str, provisioning: str) -> Price:
    """The same lookup for an Accelerator already resolved (hourly_cost resolves the name), or
    for every slice of a Topology: its chips, all slices together."""
    if provisioning not in _TABLES:
        raise UserError(
            f"unknown provisioning '{provisioning}'", hint="use one of " + ", ".join(PROVISIONING)
        )
    region = region_of(zone)
    per_chip = _TABLES[provisioning].get(acc.generation, {}).get(region)
    return Price(
        usd_per_hour=None if per_chip is None else round(per_chip * acc.chips, 6),
        per_chip=per_chip,
        chips=acc.chips,
        accelerator=acc.label,
        generation=acc.generation,
        region=region,
        provisioning=provisioning,
    )
