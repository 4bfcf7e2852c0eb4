"""What a TPU slice costs per hour, from a versioned price table; prices change, the date shows.

    from payload.cloud.accelerators import accelerator
    price = hourly_price(accelerator("v4-8"), "us-central2-b", "on_demand")
    price.usd_per_hour      # 12.88 (4 chips x 3.22)
    price.describe()        # "$12.88/h (4 chips x $3.2200, on-demand, us-central2; prices of ...)"

A region without an entry gives a Price whose `usd_per_hour` is None and whose `describe()` says so
("no spot price for TPU v4 in europe-west4 ..."): never a made-up number.
"""

from __future__ import annotations

from dataclasses import dataclass

from payload.cloud.accelerators import Accelerator, region_of
from payload.core.errors import UserError

PRICE_TABLE_DATE = "2026-11-22"  # when this table was transcribed
PRICE_SOURCE = (
    "skypilot-org/skypilot-catalog catalogs/v7/gcp/vms.csv @017e250 (from the Cloud Billing "
    "Catalog API, TPU service E000-3F24-B8AA); snapshot date unknown"
)
PRICE_NOTE = "prices change: check https://cloud.google.com/tpu/pricing before a long run"

PROVISIONING = ("on_demand", "spot", "preemptible")

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
_TABLES = {"on_demand": _ON_DEMAND, "spot": _SPOT, "preemptible": _SPOT}


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


def hourly_price(acc: Accelerator, zone: str, provisioning: str) -> Price:
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
        accelerator=acc.name,
        generation=acc.generation,
        region=region,
        provisioning=provisioning,
    )
