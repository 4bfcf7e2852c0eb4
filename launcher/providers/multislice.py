"""Several TPU slices as one run, as the providers plan them: names, dry-run lines, the price.

    slice_names("my-run", 2)          # ("my-run-0", "my-run-1"): the TPU API's multislice names
    slices_lines(config.cluster.tpu_topology)   # the slices, their DCN and the MEGASCALE names
    per_slice_price(config)           # " = 2 x $19.20/h per slice"
    names_words(("a-0", "a-1"))       # "a-0 and a-1"
    check_one_slice(config, "gce's up")   # UserError where one slice is all that is made

The arithmetic is the accelerator table's (payload.cloud.accelerators.Topology); this module
only words it for `up --dry-run` on gcp and gce.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from payload.core.errors import UserError

if TYPE_CHECKING:
    from payload.config import RunConfig


def slice_names(tpu_name: str, slices: int) -> tuple[str, ...]:
    """The TPU nodes of the run: its name for one slice; for several, NAME-0 .. NAME-(N-1), as
    the TPU API names a queued request's nodes (multislice_params.node_id_prefix = NAME)."""
    return (tpu_name,) if slices == 1 else tuple(f"{tpu_name}-{i}" for i in range(slices))


def names_words(names: tuple[str, ...]) -> str:
    """"a", "a-0 and a-1", "a-0 .. a-3": the nodes in a line."""
    return " and ".join(names) if len(names) < 3 else f"{names[0]} .. {names[-1]}"


def check_one_slice(config: RunConfig, what: str) -> None:
    """What is made for one slice only (gce's `up`, `train --down`) refuses several."""
    slices = config.cluster.slices
    if slices > 1:
        raise UserError(f"cluster.slices: {slices}: {what} does not handle several slices yet",
                        hint="set cluster.slices: 1 (docs/multislice.md says what is left)")


def slices_lines(top) -> list[str]:
    """What the dry run says of several slices: how they are joined, and what each host is told."""
    if top.num_slices == 1:
        return []
    from payload.training.strategy import MEGASCALE_NAMES, MEGASCALE_PORT

    return [f"{top.num_slices} slices of {top.name}: {top.chips} chips, {top.hosts} hosts "
            f"({top.hosts_per_slice} per slice), data parallel across the slices over the "
            "data-center network, the training state sharded only within one",
            f"DCN between the slices: {top.dcn_words()}; every host is told "
            f"{', '.join(MEGASCALE_NAMES)} (port {MEGASCALE_PORT}, slice 0's worker 0 "
            "coordinates)"]


def per_slice_price(config: RunConfig) -> str:
    """" = N x $P/h per slice" after the cost of several slices; "" for one or no price."""
    cluster = config.cluster
    if cluster.slices == 1:
        return ""
    one = cluster.model_copy(update={"slices": 1}).hourly_price()
    if not one.known:
        return ""
    return f" = {cluster.slices} x ${one.usd_per_hour:,.2f}/h per slice"
