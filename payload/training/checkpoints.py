"""Training checkpoints under `output_dir/checkpoints/`, local or `gs://`, and the resume guard.

    check_resume(output_dir, identity, resume=True, overwrite=False)  # refuses a changed model
    ckpts = Checkpoints(output_dir, model=model, optimizer=optimizer, keep=3, is_chief=True,
                        resume=True)
    ckpts.restore_latest(); ...; ckpts.save(step)

TensorFlow's CheckpointManager writes a checkpoint's files first and only then replaces the
small `checkpoint` index file (atomically): a crash mid-save leaves the index pointing at the
previous checkpoint, which stays intact. The step is the optimizer's own update counter, saved
with it, so the learning-rate schedule resumes exactly where it stopped. Under several workers
every worker takes part in a save (the variables may need a collective read) but only the chief
writes to the shared folder; the others write to a scratch folder and delete it.

The folder itself is complete (storage's `.tpuctl-complete` marker) once a fresh run has
cleared an earlier run's files and recorded what its checkpoints are made from (`run.json`);
resume and export require the marker, so a clearing cut short is never mistaken for a run.
A fresh start removes only the files TensorFlow's checkpoints and tpuctl write there, and
names them first.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile

from payload.core import layout, storage
from payload.core.errors import UserError

IDENTITY = layout.RUN_IDENTITY
INDEX = "checkpoint"
log = logging.getLogger(__name__)

# What TensorFlow's CheckpointManager ("ckpt" prefix) and this module write in the folder:
# the index and its atomic-write temporaries, each checkpoint's index and data files and
# their temporaries, the sharded save's `_temp` folder, run.json, the training schedule
# (train.py), the marker, storage temps.
_WRITTEN = re.compile(
    r"^(?:checkpoint(?:\.tmp[0-9a-f]{32})?"
    r"|ckpt-\d+(?:_temp/part-\d+-of-\d+)?\.(?:index|data-\d+-of-\d+)(?:\.tempstate\d+)?"
    r"|(?:run|schedule)\.json|" + re.escape(layout.COMPLETE)
    + r"|\.tmp-[^/]+-(?:run\.json|schedule\.json|" + re.escape(layout.COMPLETE) + r"))$"
)


def written_by_training(relative: str) -> bool:
    """Whether a path under checkpoints/ is one that training writes (the only files a fresh
    start may remove there)."""
    return bool(_WRITTEN.match(relative.replace("\\", "/")))


def checkpoint_dir(output_dir: str) -> str:
    return layout.checkpoints_dir(output_dir)


def latest_checkpoint(output_dir: str) -> str | None:
    """The newest checkpoint of a complete folder (None without one)."""
    import tensorflow as tf

    directory = checkpoint_dir(output_dir)
    if not (storage.exists(storage.join(directory, INDEX)) and storage.is_complete(directory)):
        return None
    return tf.train.latest_checkpoint(directory)


def _earlier_run(directory: str) -> UserError:
    return UserError(f"{directory} already holds checkpoints of an earlier run",
                     hint="pass --resume to continue it, or --overwrite to start again")


def _nothing_to_resume(directory: str) -> UserError:
    return UserError(f"--resume: no checkpoint in {directory}",
                     hint="run without --resume to start fresh")


def incomplete(directory: str, doing: str) -> UserError:
    return UserError(
        f"{doing}: the checkpoints in {directory} are incomplete (no {storage.COMPLETE}: a "
        "start that cleared an earlier run's files was cut short)",
        hint="start again with --overwrite",
    )


def check_flags(*, resume: bool, overwrite: bool) -> None:
    if resume and overwrite:
        raise UserError("--resume and --overwrite contradict each other (--resume continues the "
                        "checkpoints, --overwrite removes them)", hint="pass one of them")


def check_start(output_dir: str, *, resume: bool, overwrite: bool) -> None:
    """The same refusals as `check_resume`, from the checkpoint index and marker alone (no
    TensorFlow): what the launcher checks before it starts anything."""
    check_flags(resume=resume, overwrite=overwrite)
    directory = checkpoint_dir(output_dir)
    storage.check_no_link(output_dir, directory)  # training writes and deletes in it
    present = storage.exists(storage.join(directory, INDEX))
    if not resume and present and not overwrite:
        raise _earlier_run(directory)
    if resume and not present:
        raise _nothing_to_resume(directory)
    if resume and not storage.is_complete(directory):
        raise incomplete(directory, "--resume")


def check_resume(output_dir: str, identity: dict, *, resume: bool, overwrite: bool) -> None:
    """Refuse to mix runs: a resume needs a checkpoint made from the same model and tokenizer,
    and a fresh start must not silently bury an earlier run's checkpoints."""
    check_start(output_dir, resume=resume, overwrite=overwrite)
    directory = checkpoint_dir(output_dir)
    if not resume:
        return
    if latest_checkpoint(output_dir) is None:
        raise _nothing_to_resume(directory)
    path = storage.join(directory, IDENTITY)
    if storage.exists(path):
        saved = json.loads(storage.read_text(path))
        changed = [key for key in identity if saved.get(key) != identity[key]]
        if changed:
            raise UserError(
                f"--resume: the {' and '.join(changed)} changed since the checkpoints in "
                f"{directory} were written",
                hint="restore the original settings, or start again with --overwrite",
            )


def start_fresh(output_dir: str, identity: dict) -> None:
    """Clear an earlier run's checkpoint files (named first; nothing else in the folder is
    touched) and record what this run's are made from; the folder is then complete."""
    directory = checkpoint_dir(output_dir)
    storage.check_no_link(output_dir, directory)
    names = [n for n in storage.list_tree(directory) if written_by_training(n)]
    storage.clear_complete(directory)  # first: readers stop trusting the folder
    if names:
        # The index before the files it points to, so no reader follows it to a missing file.
        names.sort(key=lambda n: (n != INDEX, n))
        log.info("removing an earlier run's checkpoint files from %s: %s", directory,
                 ", ".join(names))
        storage.remove_owned(output_dir, [storage.join(directory, n) for n in names])
    storage.write_text(storage.join(directory, IDENTITY), json.dumps(identity, indent=1) + "\n")
    storage.mark_complete(directory, {"identity": identity})


def read_identity(output_dir: str) -> dict | None:
    path = layout.run_identity_path(output_dir)
    return json.loads(storage.read_text(path)) if storage.exists(path) else None


class Checkpoints:
    def __init__(
        self, output_dir: str, *, model, optimizer, keep: int, is_chief: bool, resume: bool
    ):
        import tensorflow as tf

        self.directory = checkpoint_dir(output_dir)
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
