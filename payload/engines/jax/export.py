"""The JAX engine's weights for the export stage: the newest Orbax checkpoint, restored on this
host's CPU, under PyTorch transformers' names.

    weights = trained_weights(config, hf_config)   # restored; UserError without a checkpoint
    weights.state                                  # {PyTorch name: float32 array}

The models' parameter paths are the PyTorch names, so the state is `state_dict` of the restored
parameters; the export stage (payload.stages.export) writes model/ from it, as from the
TensorFlow engine's.
"""

from __future__ import annotations

import jax

from payload.core import layout, storage
from payload.core.engines import ENGINES, JAX
from payload.core.fit.sharding import ShardingPlan
from payload.engines.jax import step as jax_step
from payload.engines.jax.checkpoints import Checkpoints, read_step
from payload.engines.jax.models import state_dict
from payload.training import checkpoints
from payload.training.trainer import TrainedWeights


def one_cpu_mesh() -> jax.sharding.Mesh:
    """A mesh of this host's first CPU device: a checkpoint of any sharding restores into it."""
    plan = ShardingPlan(data=1, fsdp=1, state_bytes_per_chip=0, hbm_bytes_per_chip=0)
    return jax_step.make_mesh(plan, devices=jax.local_devices(backend="cpu")[:1])


def trained_weights(config, hf_config) -> TrainedWeights:
    """The newest complete checkpoint in output_dir/checkpoints/ (Orbax step folders), its
    parameters restored on one CPU device, whatever mesh and optimizer trained them."""
    # The export runs on one host of the slice (worker 0) after training: it must not claim the
    # TPU, which on a multi-host slice waits for the other hosts. Effective only before JAX
    # first touches a device (a fresh `python -m payload export`; in-process, as tests run it,
    # the backends are already up and this changes nothing).
    jax.config.update("jax_platforms", "cpu")
    directory = layout.checkpoints_dir(config.output_dir)
    checkpoints.check_exportable(config.output_dir, JAX)
    ckpts = Checkpoints(directory)
    try:
        steps = ckpts.steps()
    finally:
        ckpts.close()
    program = jax_step.TrainProgram(hf_config.to_dict(), family=config.model.family,
                                    train_cfg=config.train, mesh=one_cpu_mesh())
    # The newest step; one that cannot be restored is one line naming the newest intact one.
    step, params = checkpoints.restore_newest(
        steps[::-1], lambda step: _restore_params(storage.join(directory, str(step)), program),
        directory=directory, doing="export", describe=str,
        files=lambda step: storage.join(directory, str(step)),
        label=ENGINES[JAX].checkpoint_label)
    return TrainedWeights(state=state_dict(params), hf_config=hf_config,
                          checkpoint=storage.join(directory, str(step)))


def check_resumable(config, hf_config) -> None:
    """What `--resume` would restore, restored once on this host's CPU and dropped: the whole
    newest train state (parameters and optimizer moments), placed as the train stage's program
    has it; one that cannot be restored is the one line naming the newest intact step."""
    jax.config.update("jax_platforms", "cpu")  # as the export: never the TPU (see above)
    program = jax_step.TrainProgram(hf_config.to_dict(), family=config.model.family,
                                    train_cfg=config.train, mesh=one_cpu_mesh())
    ckpts = Checkpoints(layout.checkpoints_dir(config.output_dir))
    try:
        ckpts.restore_latest(program.abstract_state(), doing="--resume")
    finally:
        ckpts.close()


def _restore_params(step_dir: str, program: jax_step.TrainProgram):
    """The parameters alone of a train state Orbax saved in `step_dir`: a third of the state's
    memory (no optimizer moments), and an export that does not care which optimizer trained."""
    import orbax.checkpoint as ocp

    target = {"params": program.abstract_state().params}
    # Checkpoints saves the state as the manager's single item, under Orbax's default name.
    item = storage.join(step_dir, ocp.checkpoint_manager.DEFAULT_ITEM_NAME)
    args = ocp.args.PyTreeRestore(
        item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
        partial_restore=True)
    restored = read_step(lambda: ocp.PyTreeCheckpointer().restore(item, args=args))
    return restored["params"]
