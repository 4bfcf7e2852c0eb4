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
"""

from __future__ import annotations

import re
import shutil
import tempfile

from payload.core import layout, storage

INDEX = "checkpoint"

# What TensorFlow's CheckpointManager ("ckpt" prefix) writes in the folder: the index and its
# atomic-write temporaries, each checkpoint's index and data files and their temporaries, the
# sharded save's `_temp` folder.
_WRITTEN = re.compile(
    r"^(?:checkpoint(?:\.tmp[0-9a-f]{32})?"
    r"|ckpt-\d+(?:_temp/part-\d+-of-\d+)?\.(?:index|data-\d+-of-\d+)(?:\.tempstate\d+)?)\Z"
)
_NEWEST = re.compile(r'^model_checkpoint_path: "(?:.*/)?ckpt-(\d+)"', re.MULTILINE)


def checkpoint_files(names: list[str]) -> list[str]:
    """The TensorFlow checkpoint files among `names`; the index before the files it points to,
    so no reader follows it to a missing file."""
    found = [n for n in names if _WRITTEN.match(n.replace("\\", "/"))]
    return sorted(found, key=lambda n: (n != INDEX, n))


def newest_step(output_dir: str) -> int | None:
    index = storage.join(layout.checkpoints_dir(output_dir), INDEX)
    if not storage.exists(index):
        return None
    found = _NEWEST.search(storage.read_text(index))
    return int(found.group(1)) if found else None


def latest_checkpoint(output_dir: str) -> str | None:
    """The newest checkpoint's path in a complete folder (None without one)."""
    import tensorflow as tf

    directory = layout.checkpoints_dir(output_dir)
    if not (storage.exists(storage.join(directory, INDEX)) and storage.is_complete(directory)):
        return None
    return tf.train.latest_checkpoint(directory)


class Checkpoints:
    def __init__(
        self, output_dir: str, *, model, optimizer, keep: int, is_chief: bool, resume: bool
    ):
        import tensorflow as tf

        self.directory = layout.checkpoints_dir(output_dir)
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
        if self.latest is None:
            return False
        self.checkpoint.restore(self.latest).assert_existing_objects_matched()
        return True

    def save(self, step: int) -> None:
        storage.note_change("checkpoint", f"{self.directory}/ckpt-{step}")
        self.manager.save(checkpoint_number=step)
        self.latest = self.manager.latest_checkpoint

    def close(self) -> None:
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)
