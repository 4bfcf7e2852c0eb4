"""The optional Weights & Biases sink (`train.wandb`): the chief's scalars, the ones TensorBoard
gets, logged to one W&B run that a resumed run continues.

    run = open_run(config, resume=False, header={"family": "gpt2"})   # None without train.wandb
    run.scalars(50, {"train/loss": 2.1, "train/learning_rate": 1e-3})
    run.close()

The run's id is made at a fresh start and kept in output_dir (layout.WANDB_RUN), so a resumed
run (`--resume`, auto-resume) logs to the same W&B run (`resume="allow"`); a fresh start, over
an old output_dir too, makes a new one. wandb is imported only here, only when asked for: the
workers install it (pyproject's `wandb` extra) only for a config that sets train.wandb, and the
launcher hands WANDB_API_KEY to the chief's train command only when it is set
(WANDB_MODE=offline, in the workers' environment, keeps the run in a local folder).
"""

from __future__ import annotations

import json
import secrets

from payload.core import layout, storage
from payload.core.errors import UserError

API_KEY_ENV = "WANDB_API_KEY"  # what wandb reads its key from; a secret of the chief's command
EXTRA = "wandb"  # pyproject's extra the workers install for a config with train.wandb


class WandbRun:
    """One W&B run, as the metrics sink (payload.training.metrics) fans scalars out to it."""

    def __init__(self, run):
        self.run = run

    def scalars(self, step: int, values: dict) -> None:
        self.run.log(dict(values), step=step)

    def close(self) -> None:
        self.run.finish()


def run_id(output_dir: str, *, resume: bool) -> str:
    """The W&B run id of this run: the recorded one when it resumes, else a new one, recorded."""
    path = layout.own_path(output_dir, layout.WANDB_RUN)
    if resume and storage.exists(path):
        try:
            return str(json.loads(storage.read_text(path))["id"])
        except (ValueError, KeyError, TypeError):
            pass  # unreadable: a new run, recorded below
    made = secrets.token_hex(8)
    storage.write_text(path, json.dumps({"id": made}) + "\n")
    return made


def open_run(config, *, resume: bool, header: dict) -> WandbRun | None:
    """The run `config.train.wandb` asks for (None when it asks for none), started: only the chief
    calls this. `header` is the run's description (metrics.json's), as the W&B run's config."""
    settings = config.train.wandb
    if settings is None:
        return None
    try:
        import wandb
    except ImportError:
        raise UserError("train.wandb: wandb is not installed in the workers' Python",
                        hint="install tpuctl's `wandb` extra there (tpuctl does when it sets the "
                             "environment up), or remove train.wandb") from None
    run = wandb.init(project=settings.project, entity=settings.entity, name=config.name,
                     id=run_id(config.output_dir, resume=resume), resume="allow",
                     config=header)
    return WandbRun(run)
