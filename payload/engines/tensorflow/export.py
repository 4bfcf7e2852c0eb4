"""The TensorFlow engine's weights for the export stage, and the one rule between the TF model's
weights and PyTorch transformers' names, both ways.

    weights = trained_weights(config, hf_config)   # the newest checkpoint, restored
    weights.write(staging)                         # tf_model.h5 and model.safetensors
    state = pytorch_state_dict(model, "gpt2")      # TF -> PyTorch names and layouts
    assign_pytorch_state(model, state, source="model.init_from m")   # and back (init_from)
    write_tf_model(hf_config, state, staging)      # tf_model.h5 from PyTorch-named weights

The folder gets the weights twice:
- `model.safetensors` under PyTorch's names and layouts (kernels transposed, LayerNorm
  gamma/beta as weight/bias, tied weights present, metadata format "pt"), for PyTorch
  transformers 5.x, which has no TensorFlow models; TensorFlow's own names load there without
  an error but with every weight freshly initialised;
- `tf_model.h5`, TensorFlow's own format, for the TF classes of transformers 4.x. Load those with
  `use_safetensors=False`: their loader of "pt" safetensors fails on every safetensors release
  ('safe_open' object is not iterable, huggingface/transformers#40028, left unfixed since the
  TF code is deprecated).
Written with numpy and `safetensors` only: no torch here.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from dataclasses import dataclass

from payload.core import folders, storage
from payload.core.errors import UserError
from payload.core.pytorch_weights import spellings, with_tied_copies
from payload.engines.tensorflow.checkpoints import INDEX, latest_checkpoint, restore_newest
from payload.training import checkpoints

WEIGHTS = "model.safetensors"


def pytorch_state_dict(model, family: str) -> dict:
    """The TF model's weights as numpy arrays under the PyTorch model's keys and layouts, tied
    copies included."""
    from transformers.modeling_tf_pytorch_utils import (
        TransposeType,
        convert_tf_weight_name_to_pt_weight_name,
    )

    state = {}
    for weight in model.weights:
        name, transpose = convert_tf_weight_name_to_pt_weight_name(
            weight.name, tf_weight_shape=weight.shape
        )
        array = weight.numpy()
        if transpose is TransposeType.SIMPLE:
            array = array.T
        elif transpose is not TransposeType.NO:
            raise ValueError(f"unexpected layout for {weight.name}: {transpose}")
        if name.endswith(".bias") and array.ndim == 2 and array.shape[0] == 1:
            array = array.reshape(-1)  # GPT-2's Conv1D keeps its bias as [1, n] in TF
        if name in state:
            raise ValueError(f"two weights map to {name}")
        state[name] = array
    return with_tied_copies(state, family)


def assign_pytorch_state(model, state: dict, *, source: str, file: str = WEIGHTS) -> None:
    """Set every weight of the built TF `model` from PyTorch-named arrays (ours, or a Hub
    checkpoint's spellings); a missing or wrongly sized one is one line naming it."""
    from transformers.modeling_tf_pytorch_utils import (
        TransposeType,
        convert_tf_weight_name_to_pt_weight_name,
    )

    family = model.config.model_type
    missing, mismatched = [], []
    for weight in model.weights:
        name, transpose = convert_tf_weight_name_to_pt_weight_name(
            weight.name, tf_weight_shape=weight.shape
        )
        key = next((k for k in spellings(name, family) if k in state), None)
        if key is None:
            missing.append(name)
            continue
        array = state[key]
        if transpose is TransposeType.SIMPLE:
            array = array.T
        if array.size != weight.shape.num_elements():
            mismatched.append(f"{key} {tuple(array.shape)} (the model's is "
                              f"{tuple(weight.shape)})")
            continue
        weight.assign(array.reshape(weight.shape).astype(weight.dtype.as_numpy_dtype))
    if missing or mismatched:
        what = (f"lacks {', '.join(missing[:3])}" if missing
                else f"has {', '.join(mismatched[:2])}")
        raise UserError(f"{source}: {file} {what}"
                        + (f" and {len(missing) - 3} more" if len(missing) > 3 else ""),
                        hint="its config.json must describe the weights beside it")


def float32_model(hf_config):
    """The TF model for `hf_config`, every weight built, in float32 (what checkpoints and
    exports hold, whatever the training policy was)."""
    import tf_keras

    from payload.training import model as model_lib

    tf_keras.mixed_precision.set_global_policy("float32")
    return model_lib.build_model(hf_config)


def write_tf_model(hf_config, state: dict, folder: str) -> None:
    """`tf_model.h5` in `folder` from PyTorch-named weights, through `assign_pytorch_state`:
    how an export whose engine is not TensorFlow still loads in transformers' TF classes."""
    model = float32_model(hf_config)
    assign_pytorch_state(model, state, source="export")
    model.save_pretrained(folder, safe_serialization=False)


def latest_weights(model, output_dir: str) -> str:
    """Restore the newest checkpoint's weights into `model`; returns its path."""
    import tensorflow as tf

    directory = checkpoints.checkpoint_dir(output_dir)
    if storage.exists(storage.join(directory, INDEX)) and not folders.is_complete(
            directory):
        raise checkpoints.incomplete(directory, "nothing to export")
    path = latest_checkpoint(output_dir)
    if path is None:
        raise UserError(
            f"nothing to export: no checkpoint in {checkpoints.checkpoint_dir(output_dir)}",
            hint="run the train stage first",
        )
    checkpoint = tf.train.Checkpoint(model=model)
    return restore_newest(
        output_dir,
        lambda path: checkpoint.restore(path).expect_partial().assert_existing_objects_matched(),
        doing="export")


@dataclass(frozen=True)
class TrainedWeights:
    """The TF model as the newest checkpoint left it."""

    model: object
    checkpoint: str

    @property
    def hf_config(self):
        return self.model.config

    def write(self, folder: str) -> None:
        from safetensors.numpy import save_file

        self.model.save_pretrained(folder, safe_serialization=False)  # tf_model.h5
        save_file(pytorch_state_dict(self.model, self.model.config.model_type),
                  os.path.join(folder, WEIGHTS), metadata={"format": "pt"})


def trained_weights(config, hf_config) -> TrainedWeights:
    """The newest checkpoint in output_dir/checkpoints/, restored into a model of `hf_config`."""
    model = float32_model(hf_config)
    return TrainedWeights(model=model, checkpoint=latest_weights(model, config.output_dir))
