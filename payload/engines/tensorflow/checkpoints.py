"""The TensorFlow engine's checkpoints: tf.train.CheckpointManager files in output_dir/checkpoints/.

    ckpts = Checkpoints(output_dir, model=model, optimizer=optimizer, keep=3, is_chief=True,
                        resume=True)
    ckpts.restore_latest(); ...; ckpts.save(step)
    newest_step(output_dir)      # from the index file alone, no TensorFlow

TensorFlow's CheckpointManager writes a checkpoint's files first and only then replaces the
small `checkpoint` index file (atomically): a crash mid-save leaves the index pointing at the
previous checkpoint, which stays intact. The step is the optimizer's own update counter, saved
with it, so the learning-rate schedule resumes exactly where it stopped. Under several workers
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

from payload.core import folders, layout, storage

INDEX = "checkpoint"

# What TensorFlow's CheckpointManager ("ckpt" prefix) writes in the folder: the index and its
# atomic-write temporaries, each checkpoint's index and data files and their temporaries, the
# sharded save's `_temp` folder.
_WRITTEN = re.compile(
    r"^(?:checkpoint(?:\.tmp[0-9a-f]{32})?"
    r"|ckpt-\d+(?:_temp/part-\d+-of-\d+)?\.(?:index|data-\d+-of-\d+)(?:\.tempstate\d+)?)\Z"
)
_NAMED = re.compile(r'^model_checkpoint_path: "(?:.*/)?ckpt-(\d+)"', re.MULTILINE)
_LISTED = re.compile(r'^all_model_checkpoint_paths: "(?:.*/)?ckpt-(\d+)"', re.MULTILINE)
# What TensorFlow says when a checkpoint's variable has another shape than the model's.
_SHAPES = re.compile(r"incompatible tensor with shape (\(.*?\)) when attempting to restore "
                     r"variable with shape (\(.*?\))")


def checkpoint_files(names: list[str]) -> list[str]:
    """The TensorFlow checkpoint files among `names`; the index before the files it points to,
    so no reader follows it to a missing file."""
    found = [n for n in names if _WRITTEN.match(n.replace("\\", "/"))]
    return sorted(found, key=lambda n: (n != INDEX, n))


def _index_file(directory: str) -> str:
    return storage.join(directory, INDEX)


def listed_steps(output_dir: str) -> list[int]:
    """The steps of the checkpoints the index names, newest first: the one it calls the newest,
    then the older ones it still lists (whether their files are there or not)."""
    index = _index_file(layout.checkpoints_dir(output_dir))
    if not storage.exists(index):
        return []
    text = storage.read_text(index)
    named = _NAMED.search(text)
    if not named:
        return []
    newest = int(named.group(1))
    older = {int(m.group(1)) for m in _LISTED.finditer(text)} - {newest}
    return [newest, *sorted((s for s in older if s < newest), reverse=True)]


def _has_files(directory: str, step: int) -> bool:
    return storage.exists(storage.join(directory, f"ckpt-{step}.index"))


def newest_step(output_dir: str) -> int | None:
    """The step of the newest checkpoint, from the index alone (no TensorFlow): the one it
    names, unless that one's files were moved away and an older one it lists still has its
    own (how a user sets aside a checkpoint that cannot be restored)."""
    steps = listed_steps(output_dir)
    if not steps:
        return None
    directory = layout.checkpoints_dir(output_dir)
    if len(steps) == 1 or _has_files(directory, steps[0]):
        return steps[0]
    return next((s for s in steps[1:] if _has_files(directory, s)), steps[0])


def latest_checkpoint(output_dir: str) -> str | None:
    """The newest checkpoint's path (its prefix: DIR/ckpt-N) in a complete folder (None
    without one)."""
    directory = layout.checkpoints_dir(output_dir)
    if not (storage.exists(_index_file(directory)) and folders.is_complete(directory)):
        return None
    step = newest_step(output_dir)
    return None if step is None else storage.join(directory, f"ckpt-{step}")


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
    newest = newest_step(output_dir)
    steps = [newest, *(s for s in listed_steps(output_dir)
                       if s < newest and _has_files(directory, s))]
    step, _ = restore_steps(
        steps, lambda step: restore(storage.join(directory, f"ckpt-{step}")),
        directory=directory, doing=doing, describe=describe_failure,
        files=lambda step: f"ckpt-{step}.index and ckpt-{step}.data-*",
        label=lambda step: f"ckpt-{step}")
    return storage.join(directory, f"ckpt-{step}")


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
        self.latest = latest_checkpoint(output_dir) if resume else None

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
        storage.note_change("checkpoint", f"{self.directory}/ckpt-{step}")
        self.manager.save(checkpoint_number=step)
        self.latest = self.manager.latest_checkpoint

    def close(self) -> None:
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)
