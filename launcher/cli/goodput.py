"""`tpuctl goodput`: where the run's time and money went, from its ledger in output_dir.

    tpuctl goodput -c tpuctl.yaml
    tpuctl goodput -c tpuctl.yaml --format json | jq .buckets.compile
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Annotated

import typer

from launcher.cli.options import DEFAULT_CONFIG, ConfigOpt


class Format(str, Enum):
    text = "text"
    json = "json"


def goodput(
    config_path: ConfigOpt = DEFAULT_CONFIG,
    format: Annotated[Format, typer.Option(
        "--format", help="text, or json: one object with wall_s, buckets (name -> seconds, "
        "dollars), goodput, billed, disruptions.")] = Format.text,
) -> None:
    """Wall time and dollars per bucket (productive, compile, checkpoints, queueing, set-up,
    preemptions, idle ...), goodput as a share of billed chip-hours, steps redone."""
    from launcher import goodput as report
    from launcher import launch

    found = report.run_report(launch.load(config_path))
    if format is Format.json:
        typer.echo(json.dumps(found, indent=1))
        return
    for line in report.report_lines(found):
        typer.echo(line)
