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

Only those files are read (config.json, the weights, the tokenizer's files by name), and none
of them may be a symbolic link out of the folder: nothing from outside it reaches output_dir,
model/ or the Hub.
"""

from __future__ import annotations

from payload.core import ownership, storage
from payload.core.errors import UserError
from payload.core.pytorch_weights import TF_WEIGHTS
from payload.core.pytorch_weights import WEIGHTS as PT_WEIGHTS

CONFIG = "config.json"
# What tpuctl reads of a model folder, beside the tokenizer's files (payload.data.tokenizer).
MODEL_FILES = (CONFIG, PT_WEIGHTS, TF_WEIGHTS)


def init_from_label(folder: str) -> str:
    return f"model.init_from {folder}"


def check_folder(config) -> None:
    """The folder holds a config of the run's family and weights the run's engine reads, whose
    family and shape agree with that config (no framework: what the launcher checks before
    starting anything)."""
    from payload.core.engines import engine_spec
    from payload.core.pytorch_weights import check_fits, read_header
    from payload.core.sizes import read_config_json

    folder, family = config.model.init_from, config.model.family
    label = init_from_label(folder)
    check_inside(folder)
    if not storage.exists(storage.join(folder, CONFIG)):
        raise UserError(f"{label} {storage.not_a_folder(folder) or 'has no ' + CONFIG}",
                        hint="point it at a Hugging Face model folder (save_pretrained output)")
    settings = read_config_json(folder, source=label)
    _check_family(folder, settings, family)
    present = [name for name in (PT_WEIGHTS, TF_WEIGHTS)
               if storage.exists(storage.join(folder, name))]
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
        header = read_header(storage.join(folder, PT_WEIGHTS))
        check_fits(header, family, settings, source=label)


def check_inside(folder: str) -> None:
    """None of the files tpuctl reads from the folder (MODEL_FILES and the tokenizer's) is a
    symbolic link out of it; nothing else in the folder is ever read."""
    from payload.data.tokenizer import TOKENIZER_FILES

    for name in (*MODEL_FILES, *TOKENIZER_FILES):
        ownership.inside_path(folder, name, source=init_from_label(folder))


def weights_path(folder: str, name: str) -> str:
    """The path of one of the folder's weight files, refused when it is a link out of it."""
    return ownership.inside_path(folder, name, source=init_from_label(folder))


def _check_family(folder: str, settings: dict, family: str) -> None:
    found = settings["model_type"]  # read_config_json made sure there is one
    if found != family:
        raise UserError(f"{init_from_label(folder)} is a {found} model but model.family is "
                        f"{family}", hint="make them agree")


def pretrained_config(folder: str, *, family: str, vocab_size: int):
    """The folder's transformers config; refuses a tokenizer with more ids than the model's
    embeddings have rows (fewer is fine: checkpoints often pad the matrix, as T5's do)."""
    import transformers

    from payload.core.sizes import read_config_json

    settings = read_config_json(folder, source=init_from_label(folder))
    _check_family(folder, settings, family)
    found = settings.pop("model_type")
    hf = transformers.AutoConfig.for_model(found, **settings)
    if vocab_size > hf.vocab_size:
        raise UserError(
            f"{init_from_label(folder)}: its tokenizer has {vocab_size} tokens but the model's "
            f"embeddings hold {hf.vocab_size}",
            hint="use the tokenizer the model was trained with (the folder's own)",
        )
    return hf
