"""The TensorFlow engine's weights for the export stage, and the one rule between the TF model's
weights and PyTorch transformers' names, both ways.

    weights = trained_weights(config, hf_config)   # the newest checkpoint, under PyTorch names
    state = pytorch_state_dict(model)              # TF -> PyTorch names and layouts
    assign_pytorch_state(model, state, source="model.init_from m")   # and back (init_from)
    write_tf_model(hf_config, state, staging)      # tf_model.h5 from PyTorch-named weights

PyTorch's names and layouts: kernels transposed, LayerNorm gamma/beta as weight/bias, GPT-2's
Conv1D bias flat. The export stage (payload.stages.export) writes model.safetensors from them,
and asks `write_tf_model` for tf_model.h5, TensorFlow's own format, from the same arrays
whichever engine trained.
"""

from __future__ import annotations

from payload.core.engines import TENSORFLOW
from payload.core.errors import UserError
from payload.core.pytorch_weights import WEIGHTS, spellings
from payload.engines.tensorflow.checkpoints import restore_newest
from payload.training import checkpoints
from payload.training.trainer import TrainedWeights


def pytorch_state_dict(model) -> dict:
    """The TF model's weights as numpy arrays under the PyTorch model's keys and layouts (no
    tied copies: the model holds each tied weight once)."""
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
    return state


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

    from payload.engines.tensorflow.model import build_model

    tf_keras.mixed_precision.set_global_policy("float32")
    return build_model(hf_config)


def write_tf_model(hf_config, state: dict, folder: str) -> None:
    """`tf_model.h5` in `folder` from PyTorch-named weights, through `assign_pytorch_state`:
    how an export whose engine is not TensorFlow still loads in transformers' TF classes."""
    model = float32_model(hf_config)
    assign_pytorch_state(model, state, source="export")
    model.save_pretrained(folder, safe_serialization=False)


def restored_model(output_dir: str, hf_config):
    """(a float32 model of `hf_config` as the newest complete checkpoint left it, its path)."""
    import tensorflow as tf

    checkpoints.check_exportable(output_dir, TENSORFLOW)
    model = float32_model(hf_config)
    checkpoint = tf.train.Checkpoint(model=model)
    path = restore_newest(
        output_dir,
        lambda path: checkpoint.restore(path).expect_partial().assert_existing_objects_matched(),
        doing="export")
    return model, path


def check_resumable(config, hf_config) -> None:
    """What `--resume` would restore, read once and dropped: the newest checkpoint's model
    variables into a model of this run's shapes, and every tensor it holds (the optimizer's
    slots too) through the checkpoint's reader, which checks each one's size and checksum; one
    that cannot be read is the one line naming the newest intact checkpoint."""
    import tensorflow as tf

    model = float32_model(hf_config)
    checkpoint = tf.train.Checkpoint(model=model)

    def restore(path: str) -> None:
        checkpoint.restore(path).expect_partial().assert_existing_objects_matched()
        reader = tf.train.load_checkpoint(path)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)

    restore_newest(config.output_dir, restore, doing="--resume")


def trained_weights(config, hf_config) -> TrainedWeights:
    """The newest complete checkpoint in output_dir/checkpoints/, its weights under PyTorch's
    names (payload.training.trainer)."""
    model, path = restored_model(config.output_dir, hf_config)
    return TrainedWeights(state=pytorch_state_dict(model), hf_config=hf_config, checkpoint=path)
