"""The export stage: the newest checkpoint as a Hugging Face model folder, `output_dir/model/`.

    python -m payload export --config run.yaml
    run_export(config)

The folder holds `config.json`, the tokenizer files, and the weights twice:
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

import json
import logging

from payload.core import layout, storage
from payload.core.errors import UserError
from payload.training import checkpoints

WEIGHTS = "model.safetensors"
TF_WEIGHTS = "tf_model.h5"

# PyTorch keys that share the tensor of another key (tied weights), per family.
TIED = {
    "bert": {
        "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    },
    "roberta": {
        "lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight",
        "lm_head.decoder.bias": "lm_head.bias",
    },
    "gpt2": {"lm_head.weight": "transformer.wte.weight"},
    "t5": {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    },
}

ARCHITECTURES = {
    "bert": "BertForMaskedLM",
    "roberta": "RobertaForMaskedLM",
    "gpt2": "GPT2LMHeadModel",
    "t5": "T5ForConditionalGeneration",
}


def pytorch_state_dict(model, family: str) -> dict:
    """The TF model's weights as numpy arrays under the PyTorch model's keys and layouts."""
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
    tied = dict(TIED[family])
    if family == "t5" and not model.config.tie_word_embeddings:
        tied.pop("lm_head.weight", None)
    elif family == "t5":
        tied["lm_head.weight"] = "shared.weight"
    for alias, source in tied.items():
        if alias not in state:
            state[alias] = state[source]
    # safetensors wants contiguous, separately owned buffers (no shared memory between keys).
    return {key: value.copy(order="C") for key, value in state.items()}


def latest_weights(model, output_dir: str) -> str:
    """Restore the newest checkpoint's weights into `model`; returns its path."""
    import tensorflow as tf

    directory = checkpoints.checkpoint_dir(output_dir)
    if storage.exists(storage.join(directory, checkpoints.INDEX)) and not storage.is_complete(
            directory):
        raise checkpoints.incomplete(directory, "nothing to export")
    path = checkpoints.latest_checkpoint(output_dir)
    if path is None:
        raise UserError(
            f"nothing to export: no checkpoint in {checkpoints.checkpoint_dir(output_dir)}",
            hint="run the train stage first",
        )
    tf.train.Checkpoint(model=model).restore(
        path
    ).expect_partial().assert_existing_objects_matched()
    return path


def trained_model(config):
    """(model, tokenizer, checkpoint path): the model as the newest checkpoint left it."""
    import tf_keras

    from payload.training import model as model_lib

    tokenizer, tokenizer_fp = model_lib.load_tokenizer(config)
    identity = checkpoints.read_identity(config.output_dir)
    if identity and identity.get("tokenizer") not in (None, tokenizer_fp):
        from payload.data.tokenizer import tokenizer_source

        raise UserError(
            f"the tokenizer in {tokenizer_source(config)} (fingerprint {tokenizer_fp}) is not the "
            f"one the checkpoints were trained with ({identity['tokenizer']})",
            hint="put that tokenizer back, or train again with --overwrite",
        )
    vocab = model_lib.token_ids(tokenizer, config.model.family)
    hf_config = model_lib.model_config(config.model, vocab=vocab, seq_len=config.data.seq_len)
    if identity and identity.get("model") != model_lib.config_fingerprint(hf_config):
        raise UserError(
            "the model settings changed since the checkpoints were written",
            hint="export with the config the run was trained with",
        )
    # The checkpoint's variables are float32 whatever the training policy was.
    tf_keras.mixed_precision.set_global_policy("float32")
    model = model_lib.build_model(hf_config)
    path = latest_weights(model, config.output_dir)
    return model, tokenizer, path


def run_export(config) -> None:
    from safetensors.numpy import save_file

    from payload.core.families import FAMILIES
    from payload.data.tokenizer import copy_tokenizer_files, set_model_inputs

    storage.check_output_dir(config.output_dir)
    model, _, path = trained_model(config)
    storage.claim_output_dir(config.output_dir)
    family = config.model.family
    target = layout.model_dir(config.output_dir)
    # Built beside model/ and swapped in whole: a crash or a full disk leaves the old model/
    # or the new one, and on gs:// readers go by the completeness marker.
    with storage.replacing_folder(target, {"stage": "export", "checkpoint": path}) as staging:
        model.save_pretrained(staging, safe_serialization=False)  # tf_model.h5
        save_file(
            pytorch_state_dict(model, family),
            os.path.join(staging, WEIGHTS),
            metadata={"format": "pt"},
        )
        hf_config = model.config
        hf_config.architectures = [ARCHITECTURES[family]]
        hf_config.save_pretrained(staging)
        copy_tokenizer_files(config, staging)
        set_model_inputs(staging, FAMILIES[family])
        _add_export_note(staging, path)
    logging.getLogger(__name__).info("exported %s to %s", path, target)


def _add_export_note(folder: str, checkpoint: str) -> None:
    # Which checkpoint the folder came from, for the user and for `tpuctl status`.
    with open(os.path.join(folder, layout.EXPORT_NOTE), "w", encoding="utf-8") as f:
        json.dump({"checkpoint": checkpoint}, f, indent=1)
        f.write("\n")
