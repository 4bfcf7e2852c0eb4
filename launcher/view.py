"""What a user watching a job sees: which worker lines show, the chief's progress, the summary.

    view = View(live=True)                 # live: progress goes to one redrawn line
    for text in view.feed(worker, line):   # what to print for this worker's line (maybe nothing)
        print(text)
    view.progress, view.final              # the newest progress record, the final one
    summary(final=view.final, family="gpt2", output_dir="runs/x", exported=True)

Everything a worker prints stays in its full log (output_dir/logs/worker-N.log and the launcher's
copy); the view only chooses. It hides what TensorFlow, absl, gRPC, CUDA, Gloo and transformers
print on every healthy run past the stages' own logging (`NOISE`, one table of rules, each with a
line it hides; the libraries that log through Python the stages quiet themselves:
payload.__main__.QUIET_LIBRARIES), never a line of a
traceback, an exception or an error of tpuctl's, and reads training progress from the chief's
records (payload.training.progress) instead of showing them: evaluations become lines, the rest feeds
the live line, or, when the output is not a terminal, plain lines at a steady pace.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from payload.core import layout
from payload.core.pytorch_weights import TF_WEIGHTS
from payload.training import progress

# Without a terminal, a progress line at most this often (by training time, so a replayed log
# reads the same as the live run did); the first and the last step always.
PLAIN_EVERY_S = 10.0

_TF_TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: "  # TensorFlow's own C++ log prefix
# absl/glog after the severity letter: MMDD, time, thread. Before absl is set up, the time is
# "00:00:<epoch seconds>".
_GLOG_TIME = r"\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ "
# The payload's own log prefix (payload/__main__.py), which a library's message carries, with
# the library's name, when its logger propagates to the root one (transformers does when the
# environment says CI=true).
_PAYLOAD_LOG = r"(\d\d:\d\d:\d\d w\d+ \w+ (\[\w+\] )?)?"
_PEER_GONE = (r"(leader task was preempted/died|following tasks are unhealthy "
              r"\(stopped sending heartbeats\))")


# Control characters (C0 but tab, DEL, C1): what a worker's line, a log or a record may carry
# (a corpus key, a library's colours) and a terminal would obey (window title, clear screen).
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """`text` safe for a terminal: every control character but tab as a visible escape
    (ESC as `\\x1b`). Everything tpuctl prints from a worker, a log or a record goes through
    here; only `tpuctl logs --raw` into a file keeps the bytes as they are."""
    return _CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


@dataclass(frozen=True)
class Noise:
    """Lines of one kind of noise: a message's first line, and the lines that may continue it
    (hidden only right after it)."""

    what: str
    head: str
    example: str
    then: tuple[str, ...] = ()

    def starts(self, line: str) -> bool:
        return re.match(self.head, line) is not None

    def continues(self, line: str) -> bool:
        return any(re.match(pattern, line) for pattern in self.then)


NOISE: tuple[Noise, ...] = (
    Noise("TensorFlow probing for CUDA on a machine without a GPU",
          rf"{_TF_TIME}E \S+\] failed call to cuInit: ",
          "2026-11-22 15:59:42.610467: E external/local_xla/xla/stream_executor/cuda/"
          "cuda_platform.cc:51] failed call to cuInit: INTERNAL: CUDA error: Failed call to "
          "cuInit: UNKNOWN ERROR (303)"),
    Noise("absl saying where it logs before it is set up",
          r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
          r"STDERR$",
          "WARNING: All log messages before absl::InitializeLog() is called are written to "
          "STDERR"),
    Noise("INFO lines of TensorFlow's C++ side (absl format)",
          rf"I{_GLOG_TIME}\S+:\d+\] ",
          "I0000 00:00:1795363182.623833    9674 grpc_server_lib.cc:466] Started server with "
          "target: grpc://localhost:40995"),
    Noise("INFO lines of TensorFlow's C++ side (its own format)",
          rf"{_TF_TIME}I \S+:\d+\] ",
          "2026-11-22 15:59:42.610467: I tensorflow/core/util/port.cc:153] oneDNN custom "
          "operations are on."),
    Noise("transformers announcing the end of its TensorFlow classes",
          rf"{_PAYLOAD_LOG}TensorFlow and JAX classes are deprecated and will be removed in "
          r"Transformers v5\. ",
          "TensorFlow and JAX classes are deprecated and will be removed in Transformers v5. We "
          "recommend migrating to PyTorch classes or pinning your version of Transformers."),
    Noise("Gloo (the JAX engine's CPU collectives) saying its peers connected",
          r"\[Gloo\] Rank \d+ is connected to \d+ peer ranks\. Expected number of connected "
          r"peer ranks is : \d+$",
          "[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks "
          "is : 1"),
    # A worker whose peer has left says so at teardown. When a peer dies mid-training, the
    # exception that ends the worker repeats it, in a traceback, which is always shown.
    Noise("collectives aborted because another worker has left",
          rf"({_TF_TIME}E |E{_GLOG_TIME})\S+\] \S*StartAbort [A-Z_]+: .*{_PEER_GONE}",
          "2026-11-22 16:15:03.551113: E tensorflow/core/common_runtime/base_collective_executor"
          ".cc:248] BaseCollectiveExecutor::StartAbort UNAVAILABLE: Error reported from "
          "/job:worker/task:1: The following tasks are unhealthy (stopped sending heartbeats):",
          then=(r"/job:\w+/replica:\d+/task:\d+$",
                r"The tasks have crashed\. Check the task logs for an earlier error",
                r"Additional GRPC error information from remote target /job:\S+ while calling "
                r"/tensorflow\.CoordinationService/\w+:$",
                r":UNKNOWN:Error received from peer ")),
    Noise("a heartbeat to the coordination service of a worker that has left",
          r"Additional GRPC error information from remote target /job:\S+ while calling "
          r"/tensorflow\.CoordinationService/Heartbeat:$",
          "Additional GRPC error information from remote target /job:worker/replica:0/task:0 "
          "while calling /tensorflow.CoordinationService/Heartbeat:",
          then=(r":UNKNOWN:Error received from peer ",)),
)

# Shown whatever a rule says: a traceback (from its first line until tpuctl speaks again), an
# exception, an error line, tpuctl's own lines.
_TRACEBACK = re.compile(r"Traceback \(most recent call last\):")
_ALWAYS = re.compile(r"Traceback \(most recent call last\)|^\s+File \"|"
                     r"^[\w.]*(Error|Exception|Interrupt|Exit)\b|^error: |^== tpuctl: |"
                     r"^tpuctl: ")


class LineFilter:
    """Which lines of each worker show. It remembers, per worker, the noise a message started
    (to hide its continuation lines) and whether a traceback is being printed."""

    def __init__(self):
        self._noise: dict[int, Noise | None] = {}
        self._traceback: dict[int, bool] = {}

    def keeps(self, worker: int, line: str) -> bool:
        if _TRACEBACK.search(line):
            self._traceback[worker] = True
        elif line.startswith("== tpuctl: "):
            self._traceback[worker] = False
        previous, self._noise[worker] = self._noise.get(worker), None
        if self._traceback.get(worker) or _ALWAYS.search(line):
            return True
        if previous is not None and previous.continues(line):
            self._noise[worker] = previous
            return False
        self._noise[worker] = next((n for n in NOISE if n.starts(line)), None)
        return self._noise[worker] is None


def shown_lines(lines: list[str]) -> list[str]:
    """The lines of one worker's log the view shows, records described."""
    view = View(live=False, plain_every_s=0.0)
    return [text for line in lines for text in view.feed(0, line)]


def step_and_last(records: list[dict], lines: list[str]) -> tuple[str, str]:
    """What `tpuctl status` shows of a worker: the step of its newest progress record
    ("150/200", or "" if it has none) and its last line the view shows."""
    step = next((f"{r['step']}/{r['steps']}" for r in reversed(records)
                 if r["kind"] in ("start", "train") and "step" in r and "steps" in r), "")
    shown = shown_lines(lines)
    return step, shown[-1] if shown else ""


class View:
    """Folds the lines of every worker into what to show (not thread-safe: one caller at a time).

    `live`: progress is drawn by the caller from `progress`; otherwise it comes out as lines,
    one per `plain_every_s` of training time."""

    def __init__(self, *, live: bool, plain_every_s: float = PLAIN_EVERY_S):
        self.live = live
        self.plain_every_s = plain_every_s
        self.filter = LineFilter()
        self.progress: dict | None = None  # the newest start or train record
        self.final: dict | None = None
        self._shown_at: float | None = None  # elapsed_s of the last progress line shown

    def feed(self, worker: int, line: str) -> list[str]:
        record = progress.parse(line)
        if record is None:
            return [line] if self.filter.keeps(worker, line) else []
        kind = record["kind"]
        if kind == "eval":
            return [progress.describe(record)]
        if kind == "final":
            self.final = record
            return []
        self.progress = record
        if self.live:
            return []
        if kind == "start":
            self._shown_at = None
            return [progress.describe(record)]
        return [progress.describe(record)] if self._paced(record) else []

    def _paced(self, record: dict) -> bool:
        elapsed = record.get("elapsed_s")
        last = record.get("step") == record.get("steps")
        if (self._shown_at is None or last or not isinstance(elapsed, int | float)
                or elapsed < self._shown_at or elapsed - self._shown_at >= self.plain_every_s):
            self._shown_at = elapsed if isinstance(elapsed, int | float) else self._shown_at
            return True
        return False

    @property
    def training_over(self) -> bool:
        return self.final is not None


def live_text(record: dict) -> str:
    """The words of the live progress line (after its bar)."""
    if record.get("kind") == "start":
        return (f"{record.get('step', 0)}/{record.get('steps', '?')}  starting: building and "
                "compiling the step")
    return progress.describe(record).removeprefix("step ")


# What each objective's model loads with: transformers' AutoModelFor<X> / TFAutoModelFor<X>.
AUTO_MODEL = {"mlm": "MaskedLM", "clm": "CausalLM", "span": "Seq2SeqLM"}


def load_lines(family: str, model_dir: str, *, tf_weights: bool | None) -> list[str]:
    """The lines of Python that load an exported model: PyTorch, then TensorFlow (which needs
    use_safetensors=False: docs/pipeline.md, "Export") where model/ holds tf_model.h5
    (`tf_weights`; None: not known here, a folder on gs://). An export made without TensorFlow,
    or of a family transformers has no TF class for, holds model.safetensors alone."""
    from payload.core.families import FAMILIES

    auto = AUTO_MODEL[FAMILIES[family].objective]
    lines = [f'PyTorch:    from transformers import AutoModelFor{auto}; '
             f'model = AutoModelFor{auto}.from_pretrained("{model_dir}")']
    if tf_weights is not False:
        where = "" if tf_weights else f" (where it holds {TF_WEIGHTS})"
        lines.append(f'TensorFlow{where}: from transformers import TFAutoModelFor{auto}; '
                     f'model = TFAutoModelFor{auto}.from_pretrained("{model_dir}", '
                     'use_safetensors=False)')
    return lines


def summary(*, final: dict | None, family: str | None, output_dir: str,
            exported: bool) -> list[str]:
    """The end of a job that went well: the final evaluation, whether training stopped early,
    where the model is and how to load it."""
    from payload.core import storage
    from payload.core.families import FAMILIES

    lines = []
    evaluation = (final or {}).get("eval")
    if evaluation:
        lines.append(f"final evaluation at step {evaluation.get('step', '?')}: "
                     f"{progress.eval_figures(evaluation)}")
    if final and final.get("stopped"):
        lines.append(f"training stopped at step {final.get('step', '?')}, before train.steps: "
                     f"{final['stopped']}; the model is that step's")
    if exported:
        model = layout.model_dir(output_dir)
        lines.append(f"model: {model}")
        if family in FAMILIES:
            local, tf_weights = model, None
            if storage.is_gcs(model):
                lines.append(f"  copy it here first: gcloud storage cp -r {model} .")
                local = layout.MODEL_DIR
            else:
                tf_weights = os.path.isfile(os.path.join(model, TF_WEIGHTS))
            lines += [f"  {text}" for text in load_lines(family, local, tf_weights=tf_weights)]
    return lines
