"""`model.init_from`: continue pretraining from a Hugging Face model folder, local or gs://.

    check_folder(config)          # before a job starts: the folder has what it needs
    hf_config = pretrained_config(config.model.init_from, family="gpt2", vocab_size=600)

The folder is a model this tool exported (with either engine) or any transformers checkpoint of
the family with its fast tokenizer (tokenizer.json). Weights come from `model.safetensors` in
PyTorch's names and layouts (what our exports and the Hub's checkpoints hold), read with numpy
and renamed to the TensorFlow model's weights by the rule the export uses the other way
(payload/engines/tensorflow/pretrained.py); a folder with only `tf_model.h5` is read by
transformers' own TF loader. The JAX engine reads the same file into its models
(payload/engines/jax/pretrained.py). Before a job starts, the file's header is checked against
the folder's config.json (family, embeddings, layer count). No torch needed.

Only those files are read (config.json, the weights, the tokenizer's files by name), each the
folder's own plain file, opened once without following a link (payload.core.reading): nothing
from outside the folder reaches output_dir, model/ or the Hub, and what was checked is what is
read.
"""

from __future__ import annotations

from payload.core import reading, storage
from payload.core.errors import UserError
from payload.core.pytorch_weights import TF_WEIGHTS
from payload.core.pytorch_weights import WEIGHTS as PT_WEIGHTS

CONFIG = "config.json"
# What tpuctl reads of a model folder, beside the tokenizer's files (payload.data.tokenizer).
MODEL_FILES = (CONFIG, PT_WEIGHTS, TF_WEIGHTS)


def init_from_label(folder: str) -> str:
    return f"model.init_from {folder}"


def check_folder(config) -> None:
    """The folder holds a config of the run's family, with a shape the model builds with and
    positions for data.seq_len, and weights the run's engine reads, whose family and shape
    agree with that config (no framework: what the launcher checks before starting
    anything)."""
    from payload.core.engines import engine_spec
    from payload.core.families import check_shape
    from payload.core.pytorch_weights import check_fits, read_header
    from payload.data.tokenizer import TOKENIZER_FILES

    folder, family = config.model.init_from, config.model.family
    label = init_from_label(folder)
    missing = storage.not_a_folder(folder)
    if missing:
        raise UserError(f"{label} {missing}",
                        hint="point it at a Hugging Face model folder (save_pretrained output)")
    # Every file tpuctl would read, whether it is the folder's own (one line if not).
    reading.read_folder(folder, TOKENIZER_FILES, source=label)
    settings = read_settings(folder)
    _check_family(folder, settings, family)
    check_shape(settings, family, seq_len=config.data.seq_len, what=f"{label}: {CONFIG}")
    present = [name for name in (PT_WEIGHTS, TF_WEIGHTS)
               if reading.folder_has(folder, name, source=label)]
    if not present:
        raise UserError(
            f"{init_from_label(folder)} has neither {PT_WEIGHTS} nor {TF_WEIGHTS}",
            hint="save the model with safe_serialization=True (pytorch_model.bin needs torch)",
        )
    engine = engine_spec(config.train.engine)
    if not set(present) & set(engine.init_from_files):
        raise UserError(
            f"{init_from_label(folder)} has only {present[0]}, which the {engine.name} engine does "
            f"not read",
            hint=f"give it {' or '.join(engine.init_from_files)} (PyTorch transformers: "
                 "from_pretrained(folder, from_tf=True), then save_pretrained)",
        )
    if PT_WEIGHTS in present:  # the header alone: family and shape, before anything starts
        with opened_weights(folder, PT_WEIGHTS) as path:
            header = read_header(path, what=storage.join(folder, PT_WEIGHTS))
        check_fits(header, family, settings, source=label)


def read_settings(folder: str) -> dict:
    """The folder's config.json, read once (payload.core.sizes.config_settings' checks)."""
    from payload.core.sizes import read_config_json

    return read_config_json(folder, source=init_from_label(folder))


def opened_weights(folder: str, name: str):
    """`with opened_weights(folder, name) as path:` a path to read the folder's own weights
    file through (None when it has none): the opened file, whatever its name leads to by then
    (payload.core.reading.opened_in_folder)."""
    return reading.opened_in_folder(folder, name, source=init_from_label(folder))


def _check_family(folder: str, settings: dict, family: str) -> None:
    found = settings["model_type"]  # read_config_json made sure there is one
    if found != family:
        raise UserError(f"{init_from_label(folder)} is a {found} model but model.family is "
                        f"{family}", hint="make them agree")


def pretrained_config(folder: str, *, family: str, vocab_size: int):
    """The folder's transformers config; refuses a tokenizer with more ids than the model's
    embeddings have rows (fewer is fine: checkpoints often pad the matrix, as T5's do)."""
    import transformers

    from payload.core.families import check_shape

    settings = read_settings(folder)
    _check_family(folder, settings, family)
    check_shape(settings, family, seq_len=None, what=f"{init_from_label(folder)}: {CONFIG}")
    found = settings.pop("model_type")
    hf = transformers.AutoConfig.for_model(found, **settings)
    if vocab_size > hf.vocab_size:
        raise UserError(
            f"{init_from_label(folder)}: its tokenizer has {vocab_size} tokens but the model's "
            f"embeddings hold {hf.vocab_size}",
            hint="use the tokenizer the model was trained with (the folder's own)",
        )
    return hf
