"""The JAX engine's checkpoints: the whole train state in Orbax, one folder per step.

    ckpts = Checkpoints(output_dir + "/checkpoints", keep=3)
    ckpts.save(state)                                   # under the step, the optimizer's count
    state = ckpts.restore_latest(program.abstract_state())   # sharded as the program wants it
    ckpts.close()

Every process calls `save` and `restore_latest` (Orbax writes each array's shards from the
processes that hold them and has process 0 commit). A save is atomic: on a local disk Orbax
writes `<step>.orbax-checkpoint-tmp-*`, adds `commit_success.txt` and renames it to `<step>`
when complete; on `gs://` (where renames are not atomic) it writes `<step>/` and adds the
`commit_success.txt` last. A folder without its commit is never listed as a step, so a crash mid-save leaves the previous
checkpoint the latest. On `gs://` the arrays go through tensorstore's own GCS driver, but the
folders (listing, creating, the commit file) through etils.epath, which picks TensorFlow's
tf.io.gfile whenever TensorFlow is installed (etils 1.x `gpath._backend`), else fsspec's gcsfs
(not installed here); EPATH_USE_TF=false turns that off.

A step that cannot be restored (truncated files, another model's arrays) is one line naming it
and the newest intact step (payload.training.checkpoints.restore_newest); Orbax's own error is dropped, and the reads it
left in flight are waited for before its event loop closes (`read_step`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import re
import sys
from collections.abc import Callable
from typing import TypeVar

import orbax.checkpoint as ocp

from payload.core import storage
from payload.core.errors import UserError
from payload.training.checkpoints import restore_newest

T = TypeVar("T")
_SHAPES = re.compile(r"Requested shape: (\(.*?\)) is not compatible with the stored shape: "
                     r"(\(.*?\))")


_READING = re.compile(r'Error reading "([^"/]+)')


def describe_failure(exc: BaseException) -> str:
    """Why Orbax could not restore a step, in words (its own messages run to pages)."""
    text = str(exc)
    shapes = _SHAPES.search(text)
    if shapes:
        return (f"it holds arrays of another shape than this run's model: {shapes.group(2)} "
                f"where the model has {shapes.group(1)}")
    if "tree structures do not match" in text:
        return "it holds another model's arrays (their names and nesting differ)"
    if text.startswith("Encountered error while reading array"):
        return "its array data are truncated or unreadable"
    reading = _READING.search(text)  # tensorstore's: which array's file it could not read
    if reading:
        return (f"its array data are truncated or unreadable: {reading.group(1)} could not "
                "be read")
    first = (text.strip().splitlines() or [type(exc).__name__])[0]
    if len(first) > 120:  # cut between words, never inside a quotation
        first = first[:120].rsplit(" ", 1)[0].replace('"', "") + " ..."
    return f"its files are truncated or unreadable: {first}"


class UnreadableStep(Exception):
    """A step Orbax could not restore, and why in words."""


# How long a failed restore waits for the reads it left in flight (tensorstore's, each bounded
# by its file's size) before it lets their event loop go.
DRAIN_S = 30.0


class _DrainingLoop(asyncio.SelectorEventLoop):
    """An event loop that, closed while tasks of its own are pending, first lets them finish
    (at most DRAIN_S): a restore whose first read failed leaves the others in flight on
    tensorstore's threads, and each one that completes into a closed loop is reported from C
    as a traceback ending in "RuntimeError: Event loop is closed"."""

    def close(self) -> None:
        if not self.is_running() and not self.is_closed():
            pending = [t for t in asyncio.all_tasks(self) if not t.done()]
            if pending:
                self.run_until_complete(asyncio.wait(pending, timeout=DRAIN_S))
        super().close()


class _DrainingPolicy(asyncio.DefaultEventLoopPolicy):
    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return _DrainingLoop()


@contextlib.contextmanager
def _loops_that_drain():
    """While a restore runs, the event loops Orbax makes for it (asyncio_utils.run_sync: a
    fresh loop per call, closed when its coroutine ends) wait for their pending reads."""
    policy = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(_DrainingPolicy())
    try:
        yield
    finally:
        asyncio.set_event_loop_policy(policy)


def read_step(restore: Callable[[], T]) -> T:
    """`restore()`, with Orbax's failure turned into UnreadableStep. A failed restore leaves
    Orbax's other reads unfinished: its event loop waits for them before it closes
    (_DrainingLoop), and Python's reports of the ones whose results nobody retrieves ("Task
    exception was never retrieved", with tracebacks) are silenced while the error that holds
    them is dropped here; only its description goes on."""
    hook, asyncio_log = sys.unraisablehook, logging.getLogger("asyncio")
    level = asyncio_log.level
    sys.unraisablehook, asyncio_log.level = (lambda _: None), logging.CRITICAL
    try:
        try:
            with _loops_that_drain():
                return restore()
        except MemoryError:
            raise
        except Exception as exc:  # Orbax and tensorstore raise bare Exceptions too
            why = describe_failure(exc)
        gc.collect()  # the dropped error's unfinished reads, reported to no one
    finally:
        sys.unraisablehook = hook
        asyncio_log.setLevel(level)
    raise UnreadableStep(why)


class Checkpoints:
    def __init__(self, directory: str, *, keep: int = 3):
        self.directory = directory
        # Saving synchronously: a training loop that checkpoints then stops (a budget, a
        # preemption notice) must know the checkpoint is on disk before it exits.
        # A save cut short (a crash, a kill) leaves its temporary folder: the next run's
        # manager removes it, so a resumed run ends with the files an uninterrupted one has.
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                               enable_async_checkpointing=False,
                                               cleanup_tmp_directories=True)
        self.manager = ocp.CheckpointManager(directory, options=options)

    @property
    def latest(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        return self.manager.latest_step()

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, state) -> int:
        """Write `state` under its own step (the optimizer's update count); returns the step."""
        step = int(state.step)
        self.manager.save(step, args=ocp.args.StandardSave(state))
        self.manager.wait_until_finished()
        return step

    def restore_latest(self, abstract_state, *, doing: str = "--resume"):
        """The newest complete checkpoint, placed as `abstract_state` (the program's
        `abstract_state()`: shapes, dtypes and shardings) says. One that cannot be restored
        (truncated, another model's) is one line naming it and the newest intact one
        (payload.training.checkpoints.restore_newest)."""
        steps = self.steps()
        if not steps:
            raise UserError(f"there is no checkpoint to resume from in {self.directory}",
                            hint="start without --resume")
        _, state = restore_newest(
            steps[::-1], lambda step: self._restore(step, abstract_state),
            directory=self.directory, doing=doing, describe=str,
            files=lambda step: storage.join(self.directory, str(step)),
            label=lambda step: f"step {step}")
        return state

    def _restore(self, step: int, abstract_state):
        state = read_step(lambda: self.manager.restore(
            step, args=ocp.args.StandardRestore(abstract_state)))
        if int(state.step) != step:
            raise UnreadableStep(f"it holds the state after {int(state.step)} updates, not "
                                 f"{step}: not a checkpoint of tpuctl's JAX engine")
        return state

    def close(self) -> None:
        self.manager.close()
