"""The export stage: the newest checkpoint as a Hugging Face model folder, `output_dir/model/`.

    python -m payload export --config run.yaml
    run_export(config)
    write_weights(staging, weights)        # model.safetensors (+ tf_model.h5): the one writer

The one place for the folder, whichever engine trained: `config.json` (with its
`architectures`), the tokenizer files, the model inputs, the export note, and the swap that
replaces model/ whole. The weights come from the engine that wrote the checkpoints
(payload.engines.trained_weights: every parameter under its PyTorch name), and are written
here, twice, the same from either engine:
- `model.safetensors` under PyTorch's names and layouts (tied weights present, metadata format
  "pt"), for PyTorch transformers 5.x, which has no TensorFlow models: TensorFlow's own names
  load there without an error but with every weight freshly initialised;
- `tf_model.h5` for the TF classes of transformers 4.x, where those classes import (the
  TensorFlow engine builds the TF model and sets its weights by the same name rule that
  model.init_from uses): load them with `use_safetensors=False`, since their loader of "pt"
  safetensors fails on every safetensors release ('safe_open' object is not iterable,
  huggingface/transformers#40028, left unfixed since the TF code is deprecated). Where they do
  not import (a JAX-only environment), the folder holds model.safetensors alone and says so.
Written with numpy and `safetensors` only: no torch here.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os

from payload.core import folders, layout, ownership, storage
from payload.core.engines import TENSORFLOW
from payload.core.errors import UserError
from payload.core.families import FAMILIES
from payload.core.pytorch_weights import WEIGHTS, with_tied_copies
from payload.training import checkpoints

log = logging.getLogger(__name__)


def trained_weights(config, tokenizer_files: dict[str, bytes] | None = None):
    """The weights of the newest checkpoint, restored by the engine that wrote it (run.json's
    `engine`; none recorded: TensorFlow, as runs before the JAX engine were), after checking
    they were made with this config's tokenizer (its files as read once, when given) and model
    settings. Nothing is written."""
    from payload.engines import trained_weights as engine_weights
    from payload.training import model as model_lib

    tokenizer, tokenizer_fp = model_lib.load_tokenizer(config, tokenizer_files)
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
    return engine_weights((identity or {}).get("engine"), config, hf_config)


def engine_note(named: str, engine: str, written_by: str | None) -> str | None:
    """The line for an export of checkpoints another engine wrote than the run's engine
    (`named` says how the run names it: "train.engine jax", "--engine jax"): the export reads
    them with the engine that wrote them, whatever the run says; None when they agree."""
    if written_by is None or written_by == engine:
        return None
    return (f"{named} does not apply to this export: the checkpoints were written by the "
            f"{written_by} engine ({layout.CHECKPOINTS_DIR}/{layout.RUN_IDENTITY}), and the "
            "export reads them with it")


def run_export(config) -> None:
    from payload.data.tokenizer import (
        read_tokenizer_files,
        with_model_inputs,
        write_tokenizer_files,
    )

    ownership.check_output_dir(config.output_dir)
    note = engine_note(f"train.engine {config.train.engine}", config.train.engine,
                       checkpoints.recorded_engine(config.output_dir))
    if note:
        log.info(note)
    # Read once: the fingerprint checked against the checkpoints is of the bytes model/ gets.
    tokenizer_files = read_tokenizer_files(config)
    weights = trained_weights(config, tokenizer_files)
    path = weights.checkpoint
    ownership.claim_output_dir(config.output_dir)
    family = config.model.family
    target = layout.model_dir(config.output_dir)
    source = checkpoint_name(config.output_dir, path)
    # Built beside model/ and swapped in whole: a crash or a full disk leaves the old model/
    # or the new one, and on gs:// readers go by the completeness marker.
    with folders.replacing_folder(target, {"stage": "export", "checkpoint": source}) as staging:
        write_weights(staging, weights)
        hf_config = weights.hf_config
        hf_config.architectures = [FAMILIES[family].architecture]
        hf_config.save_pretrained(staging)
        write_tokenizer_files(with_model_inputs(tokenizer_files, FAMILIES[family]), staging)
        _add_export_note(staging, source)
    log.info("exported %s to %s", path, target)


def write_weights(folder: str, weights) -> None:
    """`model.safetensors` from the engine's PyTorch-named state, the tied copies added, and
    `tf_model.h5` from the same arrays wherever transformers' TF classes import."""
    from safetensors.numpy import save_file

    hf_config = weights.hf_config
    tensors = with_tied_copies(weights.state, hf_config.model_type)
    save_file(tensors, os.path.join(folder, WEIGHTS), metadata={"format": "pt"})
    if TENSORFLOW not in FAMILIES[hf_config.model_type].engines:
        log.info("transformers has no TensorFlow %s: the model folder holds %s only (PyTorch)",
                 FAMILIES[hf_config.model_type].title, WEIGHTS)
    elif tf_classes_import():
        from payload.engines.tensorflow.export import write_tf_model

        write_tf_model(hf_config, tensors, folder)
    else:
        log.info("transformers' TensorFlow classes do not import here: the model folder "
                 "holds %s only (PyTorch)", WEIGHTS)


def tf_classes_import() -> bool:
    """Whether transformers' TF model classes can be built in this environment."""
    if not all(importlib.util.find_spec(name) for name in ("tensorflow", "tf_keras")):
        return False
    from transformers.utils import is_tf_available

    return is_tf_available()


def checkpoint_name(output_dir: str, checkpoint: str) -> str:
    """A checkpoint's path relative to output_dir ("checkpoints/30", "checkpoints/ckpt-6"): what
    model/ says it came from. model/ is published and downloaded; the machine's folders and the
    bucket it ran in are not the model's business."""
    prefix = output_dir.rstrip("/") + "/"
    if checkpoint.startswith(prefix):
        return checkpoint[len(prefix):]
    return storage.join(layout.CHECKPOINTS_DIR, checkpoint.rstrip("/").rsplit("/", 1)[-1])


def _add_export_note(folder: str, checkpoint: str) -> None:
    # Which checkpoint the folder came from (relative to output_dir), for the user.
    with open(os.path.join(folder, layout.EXPORT_NOTE), "w", encoding="utf-8") as f:
        json.dump({"checkpoint": checkpoint}, f, indent=1)
        f.write("\n")
