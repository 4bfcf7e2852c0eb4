"""The JAX engine's weights for the export stage: the newest Orbax checkpoint, restored on this
host's CPU, written under PyTorch transformers' names.

    weights = trained_weights(config, hf_config)   # restored; UserError without a checkpoint
    weights.write(staging)                         # model.safetensors (+ tf_model.h5)

The models' parameter paths are the PyTorch names, so `model.safetensors` is `state_dict` plus
the tied copies (payload.core.pytorch_weights). `tf_model.h5` is made from those same arrays by
the TF engine's PyTorch-name rule (the one `model.init_from` uses) wherever transformers' TF
classes import, so the folder loads in TensorFlow as a TF-engine export does; where they do not
(a JAX-only environment), the folder holds model.safetensors alone and says so in the log.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import jax

from payload.core import folders, layout, storage
from payload.core.errors import UserError
from payload.core.pytorch_weights import with_tied_copies
from payload.engines.jax import step as jax_step
from payload.engines.jax.checkpoints import Checkpoints, read_step
from payload.engines.jax.models import state_dict
from payload.training import checkpoints

WEIGHTS = "model.safetensors"
log = logging.getLogger(__name__)


def one_cpu_mesh() -> jax.sharding.Mesh:
    """A mesh of this host's first CPU device: a checkpoint of any sharding restores into it."""
    plan = jax_step.ShardingPlan(data=1, fsdp=1, state_bytes_per_chip=0, hbm_bytes_per_chip=0)
    return jax_step.make_mesh(plan, devices=jax.local_devices(backend="cpu")[:1])


@dataclass(frozen=True)
class TrainedWeights:
    """The parameters of a checkpoint as numpy arrays under their PyTorch names."""

    state: dict
    hf_config: object
    checkpoint: str

    def write(self, folder: str) -> None:
        from safetensors.numpy import save_file

        family = self.hf_config.model_type
        tensors = with_tied_copies(self.state, family)
        save_file(tensors, os.path.join(folder, WEIGHTS), metadata={"format": "pt"})
        if tf_classes_import():
            from payload.engines.tensorflow.export import write_tf_model

            write_tf_model(self.hf_config, tensors, folder)
        else:
            log.info("transformers' TensorFlow classes do not import here: the model folder "
                     "holds %s only (PyTorch)", WEIGHTS)


def tf_classes_import() -> bool:
    """Whether transformers' TF model classes can be built in this environment."""
    import importlib.util

    if not all(importlib.util.find_spec(name) for name in ("tensorflow", "tf_keras")):
        return False
    from transformers.utils import is_tf_available

    return is_tf_available()


def trained_weights(config, hf_config) -> TrainedWeights:
    """The newest complete checkpoint in output_dir/checkpoints/ (Orbax step folders), its
    parameters restored on one CPU device, whatever mesh and optimizer trained them."""
    # The export runs on one host of the slice (worker 0) after training: it must not claim the
    # TPU, which on a multi-host slice waits for the other hosts. Effective only before JAX
    # first touches a device (a fresh `python -m payload export`; in-process, as tests run it,
    # the backends are already up and this changes nothing).
    jax.config.update("jax_platforms", "cpu")
    directory = layout.checkpoints_dir(config.output_dir)
    nothing = UserError(f"nothing to export: no checkpoint in {directory}",
                        hint="run the train stage first")
    # A folder, not an object: on gs:// only a listing shows it (exists() asks for an
    # object of that name, which Orbax never writes).
    if not storage.is_dir(directory):
        raise nothing
    ckpts = Checkpoints(directory)
    try:
        steps = ckpts.steps()
        if not steps:
            raise nothing
        if not folders.is_complete(directory):
            raise checkpoints.incomplete(directory, "nothing to export")
    finally:
        ckpts.close()
    program = jax_step.TrainProgram(hf_config.to_dict(), family=config.model.family,
                                    train_cfg=config.train, mesh=one_cpu_mesh())
    # The newest step; one that cannot be restored is one line naming the newest intact one.
    step, params = checkpoints.restore_newest(
        steps[::-1], lambda step: _restore_params(storage.join(directory, str(step)), program),
        directory=directory, doing="export", describe=str,
        files=lambda step: storage.join(directory, str(step)), label=lambda step: f"step {step}")
    return TrainedWeights(state=state_dict(params), hf_config=hf_config,
                          checkpoint=storage.join(directory, str(step)))


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
