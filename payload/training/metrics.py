"""One sink for what training says about itself: progress records, TensorBoard and metrics.json.

    sink = MetricsSink(config, trainer, plan, meter=meter)
    sink.open(resume=False, start=0)     # the history so far, and the events file
    sink.say("start", {"step": 0, "steps": 200})
    sink.compiled(0, 200, {"compile_s": 31.5, "cache": "miss"})   # an engine that compiles ahead
    sink.report(record, kept=True)       # a progress record, its scalars, metrics.json's "train"
    sink.evaluation(result)              # the same for an evaluation
    sink.write(50)                       # metrics.json as it stands
    sink.write(200, final=final_figures)  # and the run's final figures
    sink.mark("checkpoint_save_start", step=50)   # an event in the run's ledger

The training loop (payload.training.loop) tells the sink once and the sink fans it out, as
MaxText's MetricLogger does: the chief's log (payload.training.progress: the launcher's live
view and `tpuctl status` read it back), TensorBoard's events under logs/tensorboard
(payload.data.events, which needs no framework), Weights & Biases when train.wandb asks
(payload.training.wandb_sink: the same scalars), and metrics.json, whose "train" and "evals"
are the same records. Only the chief
writes or says anything; the other processes keep the history alike and stay silent.

The chief also keeps the run's ledger (payload.core.ledger: restores, compiles, steps,
evaluations, checkpoints), held in memory until training has started (a stage that refuses
writes nothing), then written in batches by a thread of its own (no step waits for it; `close`
writes the rest), and metrics.json and TensorBoard carry the goodput so far
(payload.cloud.goodput, from the ledger as it stood when this process started and what it noted
since).
"""

from __future__ import annotations

import json
import os
import time

from payload.cloud import goodput
from payload.core import layout, ledger, storage
from payload.data.events import EventWriter
from payload.training import progress, wandb_sink


class MetricsSink:
    def __init__(self, config, trainer, plan, *, meter=None, stream=None):
        self.config, self.trainer, self.meter = config, trainer, meter
        self.stream = stream  # payload.data.stream.TrainStream: the digests and source counts
        self.is_chief = plan.is_chief
        self.path = layout.metrics_path(config.output_dir)
        self.header = {
            "family": config.model.family,
            "engine": config.train.engine,
            "steps": config.train.steps,
            "global_batch_size": config.train.batch_size,
            "seq_len": config.data.seq_len,
            "replicas": trainer.replicas,
            "strategy": plan.kind.value,
            **({"utilisation": meter.header()} if meter else {}),
        }
        self.history: dict = {"evals": [], "train": [], "data_digests": {}}
        self.writer = None
        self.wandb = None  # the W&B run (train.wandb), the chief's
        self.ledger = ledger.Writer(config.output_dir if self.is_chief else None,
                                    source=ledger.CHIEF, job=os.environ.get(ledger.JOB_ENV),
                                    hold=True, background=True)
        self.earlier_events: list[dict] = []  # the ledger before this process

    def open(self, *, resume: bool, start: int) -> None:
        """The figures up to `start` of the run this one resumes, and the events file (opened
        once training has started: it is a write)."""
        if resume:
            self.history = self._history_until(start)
        if self.is_chief:
            self.writer = EventWriter(
                layout.join(self.config.output_dir, layout.LOGS_DIR, layout.TENSORBOARD_DIR))
            self.wandb = wandb_sink.open_run(self.config, resume=resume, header=self.header)
            try:
                self.earlier_events = ledger.read(self.config.output_dir)
            except Exception:  # goodput so far is worth no failed run
                self.earlier_events = []
            self.ledger.release()

    def mark(self, name: str, *, step: int | None = None, **fields) -> None:
        """An event of training in the run's ledger (the chief's; payload.core.ledger)."""
        if self.is_chief:
            self.ledger.note(name, step=step, **fields)

    def goodput(self) -> dict:
        """The run's goodput so far, as metrics.json keeps it: wall time, the share that was
        productive, and the seconds of each bucket that took any."""
        report = goodput.account(self.earlier_events + self.ledger.events, until=time.time())
        return {"wall_s": report["wall_s"], "goodput": report["goodput"],
                "goodput_of": report["goodput_of"],
                "seconds": {name: b["seconds"] for name, b in report["buckets"].items()
                            if b["seconds"] > 0}}

    def _history_until(self, start: int) -> dict:
        old = self.read()
        # "compiles": each start's compile of the step (engines that compile ahead).
        keys = ("evals", "train", *(("compiles",) if "compiles" in old else ()))
        history = {key: [e for e in old.get(key, []) if e["step"] <= start] for key in keys}
        history["data_digests"] = {step: digest for step, digest
                                   in old.get("data_digests", {}).items() if int(step) <= start}
        return history

    def read(self) -> dict:
        """metrics.json as written so far ({} without one)."""
        if not storage.exists(self.path):
            return {}
        return json.loads(storage.read_text(self.path))

    def say(self, kind: str, fields: dict) -> None:
        """A progress record in the chief's log."""
        if self.is_chief:
            progress.emit(kind, fields)

    def _scalars(self, step: int, values: dict) -> None:
        if self.writer is not None:
            self.writer.scalars(step, values)
        if self.wandb is not None:
            self.wandb.scalars(step, values)

    def compiled(self, step: int, steps: int, compiled: dict) -> None:
        """The training step compiled ahead of the first one (Trainer.compile_step): its time
        and whether the compilation cache had it."""
        self.history.setdefault("compiles", []).append({"step": step, **compiled})
        self.say("compiled", {"step": step, "steps": steps, **compiled})

    def report(self, record: dict, *, kept: bool) -> None:
        """A training progress record; `kept`: a report, which also goes to TensorBoard and to
        metrics.json's "train" (between reports the chief only says where training is); a
        mixture's records also say the examples drawn from each source so far."""
        if self.stream is not None and len(self.stream.segments[0].weights) > 1:
            record = {**record, "examples_per_source": self.examples_per_source(record["step"])}
        self.say("train", record)
        if not kept:
            return
        values = {"train/loss": record["loss"], "train/learning_rate": record["learning_rate"]}
        if record["tokens_per_s"] is not None:
            values["train/tokens_per_s"] = record["tokens_per_s"]
        if self.meter and "mfu" in record:
            values.update(self.meter.scalars(record))
        self._scalars(record["step"], values)
        self.history["train"].append(record)

    def evaluation(self, result: dict) -> None:
        self.say("eval", result)
        self._scalars(result["step"], {f"eval/{key}": value for key, value in result.items()
                                       if key != "step"})
        self.history["evals"].append(result)

    def write(self, step: int, *, final: dict | None = None) -> None:
        """metrics.json at `step`, with the final figures when the run ends (then also said as
        the last progress record)."""
        if not self.is_chief:
            return
        family, engine, *rest = self.header.items()  # the step after what trained
        self._take_data_digests(step)
        payload = {**dict((family, engine)), "step": step, **dict(rest), **self.history}
        if self.stream is not None:
            payload["examples_per_source"] = self.examples_per_source(step)
        if final is not None:
            payload["final"] = final
        payload["goodput"] = self.goodput()
        values = {f"goodput/seconds/{name}": s for name, s in payload["goodput"]["seconds"].items()}
        if payload["goodput"]["goodput"] is not None:
            values["goodput/goodput"] = payload["goodput"]["goodput"]
        self._scalars(step, values)
        storage.write_text(self.path, json.dumps(payload, indent=1) + "\n")
        if final is not None:
            self.say("final", {"family": self.config.model.family, **final})

    def examples_per_source(self, step: int) -> dict[str, int]:
        """The training examples each data.corpus source gave before `step`, by its name in
        the config (metrics.json's `examples_per_source`)."""
        return {self.config.data.source_name(name): count
                for name, count in self.stream.consumed(step).items()}

    def _take_data_digests(self, step: int) -> None:
        """The reader's digests of the batches trained up to `step` (batch b trains step b + 1):
        metrics.json's `data_digests`, keyed by step."""
        if self.stream is None:
            return
        digests = self.history["data_digests"]
        for batch in sorted(b for b in self.stream.digests if b < step):
            digests[str(batch + 1)] = self.stream.digests.pop(batch)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.flush()
        if self.wandb is not None:
            self.wandb.close()
        self.ledger.close()
