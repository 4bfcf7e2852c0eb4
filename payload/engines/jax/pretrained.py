"""`model.init_from` into the JAX engine: a model folder's weights under our models' names.

    tensors = read_pretrained("gs://b/runs/first/model", hf_config)   # {PyTorch name: array}
    models.load_state_dict(model, tensors)     # into a built model, every parameter checked

Reads `model.safetensors` (local or gs://): what either engine's export holds, and what the
Hub's checkpoints of the family hold, in their spellings (GPT-2's bare "h.0..." for
"transformer.h.0...", early BERT's LayerNorm gamma/beta; payload.core.pytorch_weights). Every
parameter of the model `hf_config` describes must be there in its shape; a folder of another
family, or of another width or depth, is one line naming what differs.

A folder with only `tf_model.h5` is refused with a hint rather than converted: its names and
layouts are TensorFlow's, which only transformers' TF classes can read, so converting would
build the TF model inside the JAX worker (TensorFlow's model stack next to JAX, for a file
tpuctl's own exports never hold alone); transformers converts it once for good
(`from_pretrained(folder, from_tf=True)` then `save_pretrained`), and the launcher says so
before anything starts.
"""

from __future__ import annotations

import numpy as np

from payload.core import reading, storage
from payload.core.errors import UserError
from payload.core.pytorch_weights import TF_WEIGHTS, check_fits, load_tensors, spellings
from payload.core.pytorch_weights import WEIGHTS as PT_WEIGHTS
from payload.engines.jax import models
from payload.training.pretrained import opened_weights


def read_pretrained(folder: str, hf_config) -> dict[str, np.ndarray]:
    """Every parameter of the model `hf_config` describes, float32, under its PyTorch name, from
    the folder's model.safetensors."""
    family, source = hf_config.model_type, f"model.init_from {folder}"
    with opened_weights(folder, PT_WEIGHTS) as path:
        if path is None:
            has_h5 = reading.folder_has(folder, TF_WEIGHTS, source=source)
            raise UserError(
                f"{source} has {'only ' + TF_WEIGHTS if has_h5 else 'no ' + PT_WEIGHTS}, and "
                f"the jax engine reads {PT_WEIGHTS}",
                hint="save it with PyTorch transformers: from_pretrained(folder, from_tf=True), "
                     "then save_pretrained" if has_h5 else
                     "save the model with safe_serialization=True")
        tensors = load_tensors(path, what=storage.join(folder, PT_WEIGHTS))
    settings = hf_config.to_dict()
    # Family, embeddings and depth first: their message says what kind of folder it is.
    check_fits({k: (str(v.dtype), tuple(v.shape)) for k, v in tensors.items()}, family,
               settings, source=source)
    state, missing, wrong = {}, [], []
    for name, expected in models.parameter_shapes(hf_config).items():
        key = next((k for k in spellings(name, family) if k in tensors), None)
        if key is None:
            missing.append(name)
        elif tuple(tensors[key].shape) != tuple(expected.shape):
            wrong.append(f"{key} {list(tensors[key].shape)} (the model's is "
                         f"{list(expected.shape)})")
        else:
            state[name] = np.asarray(tensors[key], dtype=np.float32)
    if missing or wrong:
        what = (f"lacks {', '.join(missing[:3])}"
                + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
                if missing else f"has {', '.join(wrong[:2])}")
        raise UserError(f"{source}: {PT_WEIGHTS} {what}",
                        hint="its config.json must describe the weights beside it")
    return state
