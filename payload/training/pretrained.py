"""`model.init_from`: continue pretraining from a Hugging Face model folder, local or gs://.

    check_folder(config)          # before a job starts: the folder has what it needs
    hf_config = pretrained_config(config.model.init_from, family="gpt2", vocab_size=600)
    source = load_weights(model, config.model.init_from)   # its weights, into the TF model

The folder is a model this tool exported or any transformers checkpoint of the family with its
fast tokenizer (tokenizer.json). Weights come from `model.safetensors` in PyTorch's names and
layouts (what our exports and the Hub's checkpoints hold), read with numpy and renamed to the
TensorFlow model's weights by the rule the export uses the other way; a folder with only
`tf_model.h5` is read by transformers' own TF loader. No torch needed.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from payload.core import storage
from payload.core.errors import UserError

CONFIG = "config.json"
PT_WEIGHTS = "model.safetensors"
TF_WEIGHTS = "tf_model.h5"
# Where a family's weights live under its task model, so a checkpoint of the bare model
# (GPT-2's own has "h.0..." for "transformer.h.0...") still matches.
BASE_PREFIX = {"bert": "bert.", "roberta": "roberta.", "gpt2": "transformer.", "t5": ""}


def _source(folder: str) -> str:
    return f"model.init_from {folder}"


def check_folder(config) -> None:
    """The folder holds a config of the run's family and weights this tool can read (no
    TensorFlow: what the launcher checks before starting anything)."""
    folder, family = config.model.init_from, config.model.family
    from payload.core.sizes import read_config_json

    if not storage.exists(storage.join(folder, CONFIG)):
        raise UserError(f"{_source(folder)} has no {CONFIG}",
                        hint="point it at a Hugging Face model folder (save_pretrained output)")
    found = read_config_json(folder).get("model_type")
    if found != family:
        raise UserError(f"{_source(folder)} is a {found} model but model.family is {family}",
                        hint="make them agree")
    if not any(storage.exists(storage.join(folder, name)) for name in (PT_WEIGHTS, TF_WEIGHTS)):
        raise UserError(
            f"{_source(folder)} has neither {PT_WEIGHTS} nor {TF_WEIGHTS}",
            hint="save the model with safe_serialization=True (pytorch_model.bin needs torch)",
        )


def pretrained_config(folder: str, *, family: str, vocab_size: int):
    """The folder's transformers config; refuses a tokenizer with more ids than the model's
    embeddings have rows (fewer is fine: checkpoints often pad the matrix, as T5's do)."""
    import transformers

    from payload.core.sizes import read_config_json

    settings = read_config_json(folder)
    found = settings.pop("model_type", None)
    if found != family:
        raise UserError(f"{_source(folder)} is a {found} model but model.family is {family}",
                        hint="make them agree")
    hf = transformers.AutoConfig.for_model(found, **settings)
    if vocab_size > hf.vocab_size:
        raise UserError(
            f"{_source(folder)}: its tokenizer has {vocab_size} tokens but the model's "
            f"embeddings hold {hf.vocab_size}",
            hint="use the tokenizer the model was trained with (the folder's own)",
        )
    return hf


def load_weights(model, folder: str) -> str:
    """Set every weight of the built TF `model` from the folder; returns the file read."""
    local = tempfile.mkdtemp(prefix="tpuctl-init-") if storage.is_gcs(folder) else None
    try:
        for name in (PT_WEIGHTS, TF_WEIGHTS):
            path = storage.join(folder, name)
            if not storage.exists(path):
                continue
            if local:
                copy = os.path.join(local, name)
                with storage.open_read(path) as src, open(copy, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 24)
                path = copy
            if name == PT_WEIGHTS:
                _assign_from_pytorch_layout(model, path, folder)
            else:
                _assign_from_h5(model, path, folder)
            return storage.join(folder, name)
    finally:
        if local:
            shutil.rmtree(local, ignore_errors=True)
    raise UserError(f"{_source(folder)} has neither {PT_WEIGHTS} nor {TF_WEIGHTS}")


def _candidates(name: str, family: str) -> list[str]:
    """PyTorch key spellings a checkpoint may use for one of our weights."""
    prefix = BASE_PREFIX[family]
    names = [name]
    if prefix and name.startswith(prefix):
        names.append(name[len(prefix):])
    for new, old in ((".weight", ".gamma"), (".bias", ".beta")):  # early BERT LayerNorm names
        if "LayerNorm" in name and name.endswith(new):
            names += [n[: -len(new)] + old for n in list(names)]
    return names


def _assign_from_pytorch_layout(model, path: str, folder: str) -> None:
    from safetensors.numpy import load_file
    from transformers.modeling_tf_pytorch_utils import (
        TransposeType,
        convert_tf_weight_name_to_pt_weight_name,
    )

    state = load_file(path)
    family = model.config.model_type
    missing, mismatched = [], []
    for weight in model.weights:
        name, transpose = convert_tf_weight_name_to_pt_weight_name(
            weight.name, tf_weight_shape=weight.shape
        )
        key = next((k for k in _candidates(name, family) if k in state), None)
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
        raise UserError(f"{_source(folder)}: {os.path.basename(path)} {what}"
                        + (f" and {len(missing) - 3} more" if len(missing) > 3 else ""),
                        hint="its config.json must describe the weights beside it")


def _assign_from_h5(model, path: str, folder: str) -> None:
    from transformers.modeling_tf_utils import load_tf_weights

    missing, _, mismatched = load_tf_weights(model, path)
    if missing or mismatched:
        raise UserError(f"{_source(folder)}: {TF_WEIGHTS} does not hold every weight of the "
                        f"model its config.json describes ({(missing + mismatched)[0]})")
