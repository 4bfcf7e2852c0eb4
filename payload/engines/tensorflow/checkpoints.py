"""The TensorFlow engine's checkpoints: tf.train.CheckpointManager files in output_dir/checkpoints/.

    ckpts = Checkpoints(output_dir, model=model, optimizer=optimizer, keep=3, is_chief=True,
                        resume=True)
    ckpts.restore_latest(); ...; ckpts.save(step)
    path = restore_newest(output_dir, lambda path: checkpoint.restore(path), doing="export")

TensorFlow's CheckpointManager writes a checkpoint's files first and only then replaces the
small `checkpoint` index file (atomically): a crash mid-save leaves the index pointing at the
previous checkpoint, which stays intact (payload.core.engines reads the index without
TensorFlow). The step is the optimizer's own update counter, saved with it, so the learning-rate schedule resumes exactly where it stopped. Under several workers
every worker takes part in a save (the variables may need a collective read) but only the chief
writes to the shared folder; the others write to a scratch folder and delete it.

The newest checkpoint is the one the index names, unless its files were moved away and an older
one it lists still has its own (how a user sets aside a checkpoint that cannot be restored, as
the one line about it says: payload.training.checkpoints.restore_newest); a resume never starts
from step 0 because a checkpoint's files are missing.
"""

from __future__ import annotations

import re
import shutil
import tempfile

from payload.core import layout, storage
from payload.core.engines import ENGINES, TENSORFLOW

SPEC = ENGINES[TENSORFLOW]  # the index, its parse and the file names (payload.core.engines)
# What TensorFlow says when a checkpoint's variable has another shape than the model's.
_SHAPES = re.compile(r"incompatible tensor with shape (\(.*?\)) when attempting to restore "
                     r"variable with shape (\(.*?\))")


def describe_failure(exc: BaseException) -> str:
    """Why TensorFlow could not restore a checkpoint, in words."""
    text = str(exc)
    shapes = _SHAPES.search(text)
    if shapes:
        return (f"it holds arrays of another shape than this run's model: {shapes.group(1)} "
                f"where the model has {shapes.group(2)}")
    first = (text.strip().splitlines() or [type(exc).__name__])[0]
    return f"its files are missing, truncated or unreadable: {first[:120]}"


def restore_newest(output_dir: str, restore, *, doing: str) -> str:
    """Restore the newest checkpoint with `restore(path)`; returns its path. One that cannot be
    restored is one line naming it and the newest older one that can
    (payload.training.checkpoints.restore_newest)."""
    from payload.training.checkpoints import restore_newest as restore_steps

    directory = layout.checkpoints_dir(output_dir)
    newest = SPEC.newest_step(output_dir)
    steps = [newest, *(s for s in SPEC.listed_steps(output_dir)
                       if s < newest and SPEC.has_files(output_dir, s))]
    step, _ = restore_steps(
        steps, lambda step: restore(SPEC.checkpoint_path(output_dir, step)),
        directory=directory, doing=doing, describe=describe_failure,
        files=lambda step: f"ckpt-{step}.index and ckpt-{step}.data-*",
        label=SPEC.checkpoint_label)
    return SPEC.checkpoint_path(output_dir, step)


class Checkpoints:
    def __init__(
        self, output_dir: str, *, model, optimizer, keep: int, is_chief: bool, resume: bool
    ):
        import tensorflow as tf

        self.output_dir, self.directory = output_dir, layout.checkpoints_dir(output_dir)
        self._scratch = None if is_chief else tempfile.mkdtemp(prefix="tpuctl-ckpt-")
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint,
            self._scratch or self.directory,
            max_to_keep=keep,
            checkpoint_name="ckpt",
        )
        # A fresh run's chief may be clearing the folder right now: only a resume looks.
        self.latest = SPEC.latest_checkpoint(output_dir) if resume else None

    def restore_latest(self) -> bool:
        """Restore the newest checkpoint (resume); one that cannot be restored is one line."""
        if self.latest is None:
            return False
        self.latest = restore_newest(
            self.output_dir,
            lambda path: self.checkpoint.restore(path).assert_existing_objects_matched(),
            doing="--resume")
        return True

    def save(self, step: int) -> None:
        storage.note_change("checkpoint", SPEC.checkpoint_path(self.output_dir, step))
        self.manager.save(checkpoint_number=step)
        self.latest = self.manager.latest_checkpoint

    def close(self) -> None:
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)
