"""Training progress as records: one line each in the chief's log, written here and read here.

    emit("train", {"step": 50, "steps": 200, "loss": 7.64, "learning_rate": 8.4e-4})
    record = parse('tpuctl-progress {"kind": "eval", "step": 50, "loss": 7.0}')  # or None
    describe(record)   # 'eval at step 50: loss 7.0000'

The training chief writes each record once (payload.training.metrics); the launcher's live view,
`tpuctl logs` and `tpuctl status` read them back from the worker's log, and metrics.json keeps
the same dicts for its reports ("train") and evaluations ("evals"). A record is a flat JSON
object whose `kind` says what it is:
- start: training begins at `step` of `steps` (before the first step is compiled);
- compiled: the training step is compiled (an engine that compiles ahead, payload.engines.jax):
  `step`, `steps`, `compile_s`, `cache` (hit: loaded from the persistent compilation cache,
  miss: compiled now and stored, off);
- train: `step`, `steps`, `loss` (mean since the last report), `learning_rate`, `tokens_per_s`
  (null until a step past the first, compiling, has been timed), `elapsed_s` (since this
  process began training), `eta_s` (null until known); the first also has `first_step_s`
  (and `compile_s` when the step was compiled ahead, which first_step_s then leaves out);
  with a rate, payload.training.utilisation's `tokens_per_s_per_device`, `model_flops_per_s`, `mfu`;
  a weighted mixture's also `examples_per_source` (each data.corpus source as the config names
  it -> the training examples drawn from it so far);
- eval: `step`, `loss`, `accuracy`, and `perplexity` for the causal and span objectives;
- final: metrics.json's `final` (`step`, `eval`, `stopped`, ...) and the model `family`.
Fields are added by name; readers take what they know and ignore the rest.
"""

from __future__ import annotations

import json
import math

PREFIX = "tpuctl-progress "
KINDS = ("start", "compiled", "train", "eval", "final")


def line(kind: str, fields: dict) -> str:
    """The log line of one record."""
    if kind not in KINDS:
        raise ValueError(f"unknown progress record kind {kind!r}")
    return PREFIX + json.dumps({"kind": kind, **fields})


def emit(kind: str, fields: dict) -> None:
    """Print one record (the caller decides that it is the one who speaks: the chief)."""
    print(line(kind, fields), flush=True)


def parse(text: str) -> dict | None:
    """The record a log line holds, or None for any other line."""
    if not text.startswith(PREFIX):
        return None
    try:
        record = json.loads(text[len(PREFIX):])
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("kind") not in KINDS:
        return None
    return record


def duration(seconds: float | None) -> str:
    """`4m09s`, `2h05m`; `?` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _number(value, spec: str) -> str:
    return "?" if value is None else format(value, spec)


def eval_figures(record: dict) -> str:
    """`loss 7.0087  accuracy 0.0289` (and perplexity where the record has one)."""
    names = ("loss", "perplexity", "accuracy")
    return "  ".join(f"{name} {record[name]:.4f}" for name in names
                     if isinstance(record.get(name), int | float))


def describe(record: dict) -> str:
    """One readable line for a record, as the launcher shows it."""
    kind = record.get("kind")
    if kind == "start":
        return (f"training from step {record.get('step', 0)} of {record.get('steps', '?')}: "
                "building and compiling the step")
    if kind == "compiled":
        cache = {"hit": "loaded from the compilation cache",
                 "miss": "compiled and cached for a resume"}.get(record.get("cache"), "compiled")
        return (f"training from step {record.get('step', 0)} of {record.get('steps', '?')}: "
                f"the step is ready after {_number(record.get('compile_s'), '.1f')}s ({cache});"
                " the first step runs")
    if kind == "eval":
        return f"eval at step {record.get('step', '?')}: {eval_figures(record)}"
    if kind == "final":
        stopped = record.get("stopped")
        said = f"training ended at step {record.get('step', '?')}"
        return f"{said}: {stopped}" if stopped else said
    text = (f"step {record.get('step', '?')}/{record.get('steps', '?')}  "
            f"loss {_number(record.get('loss'), '.4f')}  "
            f"lr {_number(record.get('learning_rate'), '.3g')}")
    if record.get("first_step_s") is not None:
        if record.get("compile_s") is not None:
            return (f"{text}  first step {record['first_step_s']:.1f}s after "
                    f"{record['compile_s']:.1f}s of compiling")
        return f"{text}  first step {record['first_step_s']:.1f}s (compiling included)"
    rate = record.get("tokens_per_s")
    if rate is not None:
        text += f"  {rate:,.0f} tokens/s"
    mfu = record.get("mfu")
    if isinstance(mfu, int | float):  # tiny models: a fraction of a percent
        text += f"  MFU {mfu:.1%}" if mfu >= 0.01 else f"  MFU {mfu * 100:.2g}%"
    return f"{text}  ETA {duration(record.get('eta_s'))}{_sources(record)}"


def _sources(record: dict) -> str:
    """`  examples web.txt 820 / code 205`: a mixture's examples per source, each by the last
    name of its path (the whole path is in metrics.json)."""
    drawn = record.get("examples_per_source")
    if not isinstance(drawn, dict) or not drawn:
        return ""
    return "  examples " + " / ".join(
        f"{' + '.join(p.rstrip('/').rsplit('/', 1)[-1] for p in str(name).split(' + '))} {n:,}"
        for name, n in drawn.items())
