"""The JAX engine's checkpoints: the whole train state in Orbax, one folder per step.

    ckpts = Checkpoints(output_dir + "/checkpoints/jax", keep=3)
    ckpts.save(state)                                   # under the step, the optimizer's count
    state = ckpts.restore_latest(program.abstract_state())   # sharded as the program wants it
    ckpts.close()

Every process calls `save` and `restore_latest` (Orbax writes each array's shards from the
processes that hold them and has process 0 commit). A save is atomic: on a local disk Orbax
writes `<step>.orbax-checkpoint-tmp-*` and renames it to `<step>` when complete; on `gs://`
(where renames are not atomic) it writes `<step>/` and adds a `commit_success.txt` last. A
folder without its commit is never listed as a step, so a crash mid-save leaves the previous
checkpoint the latest. On `gs://` the arrays go through tensorstore's own GCS driver, but the
folders (listing, creating, the commit file) through etils.epath, which picks TensorFlow's
tf.io.gfile whenever TensorFlow is installed (etils 1.x `gpath._backend`), else fsspec's gcsfs
(not installed here); EPATH_USE_TF=false turns that off.
"""

from __future__ import annotations

import orbax.checkpoint as ocp

from payload.core.errors import UserError


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

    def restore_latest(self, abstract_state):
        """The newest complete checkpoint, placed as `abstract_state` (the program's
        `abstract_state()`: shapes, dtypes and shardings) says."""
        step = self.latest
        if step is None:
            raise UserError(f"there is no checkpoint to resume from in {self.directory}",
                            hint="start without --resume")
        state = self.manager.restore(step, args=ocp.args.StandardRestore(abstract_state))
        if int(state.step) != step:
            raise UserError(
                f"the checkpoint {self.directory}/{step} holds the state after "
                f"{int(state.step)} updates, not {step}",
                hint="it was not written by tpuctl's JAX engine: move it away and resume again",
            )
        return state

    def close(self) -> None:
        self.manager.close()
