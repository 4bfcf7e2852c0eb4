"""`model.init_from` into the TensorFlow engine: a model folder's weights into the built TF model.

    source = load_weights(model, config.model.init_from)   # the file read

`model.safetensors` (PyTorch names and layouts) goes through the export's name rule the other
way (payload/engines/tensorflow/export.py); a folder with only `tf_model.h5` is read by
transformers' own TF loader. The folder's checks and config are the stage's
(payload/training/pretrained.py).
"""

from __future__ import annotations

import os
import shutil
import tempfile

from payload.core import storage
from payload.core.errors import UserError
from payload.core.pytorch_weights import TF_WEIGHTS
from payload.core.pytorch_weights import WEIGHTS as PT_WEIGHTS
from payload.training.pretrained import init_from_label, opened_weights


def load_weights(model, folder: str) -> str:
    """Set every weight of the built TF `model` from the folder; returns the file read."""
    from payload.core.pytorch_weights import load_tensors
    from payload.engines.tensorflow.export import assign_pytorch_state

    named = storage.join(folder, PT_WEIGHTS)
    with opened_weights(folder, PT_WEIGHTS) as path:
        if path is not None:
            assign_pytorch_state(model, load_tensors(path, what=named),
                                 source=init_from_label(folder))
            return named
    named = storage.join(folder, TF_WEIGHTS)
    with opened_weights(folder, TF_WEIGHTS) as path:
        if path is None:
            raise UserError(f"{init_from_label(folder)} has neither {PT_WEIGHTS} nor "
                            f"{TF_WEIGHTS}")
        local = tempfile.mkdtemp(prefix="tpuctl-init-") if storage.is_gcs(folder) else None
        try:
            if local:  # transformers' h5 loader reads a local file
                copy = os.path.join(local, TF_WEIGHTS)
                with storage.open_read(path) as src, open(copy, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 24)
            _assign_from_h5(model, copy if local else path, folder)
        finally:
            if local:
                shutil.rmtree(local, ignore_errors=True)
    return named


def _assign_from_h5(model, path: str, folder: str) -> None:
    from transformers.modeling_tf_utils import load_tf_weights

    try:
        missing, _, mismatched = load_tf_weights(model, path)
    except (OSError, KeyError, ValueError) as exc:  # not HDF5, truncated, or laid out otherwise
        raise UserError(f"{init_from_label(folder)}: {TF_WEIGHTS} cannot be read "
                        f"({str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__})",
                        hint="save the model again with save_pretrained") from exc
    if missing or mismatched:
        raise UserError(f"{init_from_label(folder)}: {TF_WEIGHTS} does not hold every weight of the "
                        f"model its config.json describes ({(missing + mismatched)[0]})")
