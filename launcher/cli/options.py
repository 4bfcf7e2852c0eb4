"""The options several commands share, declared once as `Annotated` types.

    def logs(config_path: ConfigOpt = DEFAULT_CONFIG, worker: WorkerOpt = None): ...
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

ConfigOpt = Annotated[
    Path, typer.Option("--config", "-c", help="Run config file.", show_default=True)
]
DEFAULT_CONFIG = Path("tpuctl.yaml")
WorkerOpt = Annotated[
    int | None, typer.Option("--worker", "-w", help="Only this worker (0-based).", min=0)
]
JobOpt = Annotated[
    str | None, typer.Option("--job", help="A job id (default: the latest job of the run).")
]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the plan; touch nothing.")]
