"""The launcher's side of the run's ledger, and the goodput report read back from it.

    pen = launcher_ledger(config.output_dir, job=job_id, hold=True)   # held until released
    pen.note("setup_started"); ...; pen.release()
    report = run_report(config)           # `tpuctl goodput --format json` prints this
    for line in report_lines(report): print(line)

The launcher notes what only it sees (payload.core.ledger.EVENTS["launcher"]), in output_dir
as the workers see it; it writes there only where it can see that folder too (a gs:// path, or
local workers on this machine, or a cloud run whose billing record it keeps there), and never
in a folder holding files tpuctl did not write. The report is payload.cloud.goodput's account
of the ledger, billing.json and the price table, with the run's name and the price's date.
"""

from __future__ import annotations

import contextlib
import time

from payload.cloud import budget, goodput
from payload.core import layout, ledger, ownership
from payload.core.errors import UserError


def launcher_ledger(output_dir: str | None, *, job: str | None = None,
                    hold: bool = False) -> ledger.Writer:
    """The launcher's pen for this run's ledger: one that writes nothing where output_dir
    holds someone else's files (or is None: not visible from here)."""
    if output_dir is not None:
        try:
            ownership.check_output_dir(output_dir)
        except Exception:  # someone's folder, or unreachable: no ledger then
            output_dir = None
    return ledger.Writer(output_dir, source=ledger.LAUNCHER, job=job, hold=hold)


def sees_output_dir(output_dir: str, *, shares_machine: bool, bills: bool) -> bool:
    """Whether the launcher sees output_dir as the workers do: gs://, local workers, or a cloud
    run (whose billing record the launcher keeps there already)."""
    return layout.is_gcs(output_dir) or shares_machine or bills


def teardown_noted(output_dir: str | None, *, delete_bucket: bool = False) -> None:
    """After a teardown checked through the API: the ledger says so, and the billing record
    stops counting its nodes. Not when the run's objects were just deleted on request."""
    if output_dir is None or delete_bucket:
        return
    when = time.time()
    launcher_ledger(output_dir).note("torn_down", t=when)
    with contextlib.suppress(Exception):  # the record is unreadable or gone: nothing to close
        budget.record_all_deleted(output_dir, when)


def run_report(config, *, now: float | None = None) -> dict:
    """The goodput report of the config's run, from its ledger in output_dir."""
    out = config.output_dir
    events = ledger.read(out)
    if not events:
        raise UserError(f"no ledger of run {config.name} in {ledger.ledger_dir(out)}",
                        hint="it is written by `tpuctl train` (and `up`, `down`); run one first")
    nodes = budget.read_nodes(out)
    price = config.cluster.hourly_price()
    usd = price.usd_per_hour if price is not None else None
    # billing.json lists one node per slice, and the price is all slices': each node-hour is
    # one slice's (as payload.cloud.budget.billed_hours counts it).
    slices = config.cluster.slices
    report = goodput.account(events, nodes=nodes,
                             usd_per_hour=None if usd is None else usd / slices,
                             chips=price.chips // slices if price is not None else None,
                             now=time.time() if now is None else now)
    report = {"run": config.name, "output_dir": out, **report}
    report["price"] = None if price is None else {
        "usd_per_hour": usd, "chips": price.chips, "accelerator": price.accelerator,
        "provisioning": price.provisioning, "region": price.region,
        "table_date": price.source_date, "words": price.describe()}
    return report


def _money(value: float | None) -> str:
    return "" if value is None else f" ${value:,.2f}"


def report_lines(report: dict) -> list[str]:
    """The report in a few lines: goodput, wall time and cost, the buckets that took time, and
    each preemption with the steps redone and what they cost."""
    from payload.training.progress import duration

    share = report["goodput"]
    head = "goodput: " + ("?" if share is None else f"{share:.1%}")
    billed, price = report.get("billed"), report.get("price")
    if billed and billed.get("dollars") is not None:
        head += (f" of {billed['chip_hours']:.3g} billed chip-hours (${billed['dollars']:,.2f} "
                 f"at ${price['usd_per_hour']:,.2f}/h, prices of {price['table_date']})")
    elif billed:
        head += f" of {billed['hours']:.3g} billed hours (no price: {price['words']})"
    else:
        head += " of the wall time (nothing billed by tpuctl)"
    lines = [f"{head}; wall time {duration(report['wall_s'])}"]
    taken = sorted(((name, b) for name, b in report["buckets"].items() if b["seconds"] >= 0.5),
                   key=lambda item: -item[1]["seconds"])
    if taken:
        lines.append("  " + ", ".join(f"{name} {duration(b['seconds'])}{_money(b['dollars'])}"
                                      for name, b in taken))
    for d in report["disruptions"]:
        redone = ("?" if d["steps_redone"] is None else str(d["steps_redone"]))
        after = (f"training again {duration(d['recovery_s'])} later" if d["recovery_s"]
                 is not None else "training has not started again")
        lines.append(f"  preempted at step {d['lost_at_step']}: {redone} steps redone from the "
                     f"checkpoint of step {d['resumed_from_step']} ({duration(d['wasted_s'])}"
                     f"{_money(d['wasted_dollars'])}); {after}")
    if report.get("skew_s"):
        lines.append(f"  host clocks lined up with the launcher's by {report['skew_s']} s")
    return lines
