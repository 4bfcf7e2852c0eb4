"""BERT, RoBERTa, GPT-2, T5 and Llama as the project's own Flax NNX modules, whose parameter paths are
the PyTorch transformers state-dict keys, in the same layouts.

    config = payload.core.sizes.transformers_config(model_cfg, vocab_size=32000, seq_len=512)
    model = build_model(config, seed=0)            # or any transformers config dict / object
    logits = model(input_ids, attention_mask)      # float32
    tensors = state_dict(model)                    # {"bert.embeddings.word_embeddings.weight": ...}
    load_state_dict(model, tensors)                # and back, every parameter checked
    shapes = parameter_shapes(config)              # {name: ShapeDtypeStruct}, nothing allocated

`state_dict` holds what transformers' `save_pretrained` writes (tied copies left out), so it
goes into model.safetensors as it is.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from payload.core.errors import UserError
from payload.core.families import FAMILIES
from payload.engines.jax.kernels import Runtime
from payload.engines.jax.models.bert import BertForMaskedLM, RobertaForMaskedLM
from payload.engines.jax.models.gpt2 import GPT2LMHeadModel
from payload.engines.jax.models.llama import LlamaForCausalLM
from payload.engines.jax.models.t5 import T5ForConditionalGeneration

# Each family's model is the class its spec names (payload.core.families: the architecture).
MODEL_CLASSES = {
    name: {cls.__name__: cls for cls in (BertForMaskedLM, RobertaForMaskedLM, GPT2LMHeadModel,
                                         T5ForConditionalGeneration, LlamaForCausalLM)
           }[spec.architecture]
    for name, spec in FAMILIES.items()
}


def _raw_config(config) -> dict:
    raw = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    if raw.get("model_type") not in MODEL_CLASSES:
        raise UserError(
            f"the JAX engine has no model type {raw.get('model_type')!r}",
            hint=f"use one of {', '.join(MODEL_CLASSES)}",
        )
    return raw


def build_model(config, *, seed: int = 0, dtype=jnp.float32, runtime: Runtime | None = None
                ) -> nnx.Module:
    """The family's model for a transformers config (dict, or object with `to_dict`), its
    weights initialised as the original implementation does. Parameters are float32; `dtype`
    is the compute type; `runtime` how it runs (payload.engines.jax.kernels.Runtime: the
    platform its attention kernel is chosen for, the mesh, remat; default the CPU reference)."""
    raw = _raw_config(config)
    cls = MODEL_CLASSES[raw["model_type"]]
    settings = cls.Config.from_transformers(raw)
    if runtime is not None:
        settings = dataclasses.replace(settings, runtime=runtime)
    return cls(settings, rngs=nnx.Rngs(params=seed), dtype=dtype)


def model_shapes(config, *, dtype=jnp.float32, runtime: Runtime | None = None) -> nnx.Module:
    """`build_model` traced abstractly: every parameter a ShapeDtypeStruct, nothing allocated."""
    return nnx.eval_shape(lambda: build_model(config, dtype=dtype, runtime=runtime))


def parameter_shapes(config) -> dict[str, jax.ShapeDtypeStruct]:
    """Each parameter's shape and dtype under its PyTorch name, from an abstract build: what
    memory and sharding plans need, for any size, without allocating it."""
    return {name: variable.get_value() for name, variable in
            _flat_params(model_shapes(config)).items()}


def _flat_params(source: nnx.Module | nnx.State) -> dict[str, nnx.Variable]:
    state = source if isinstance(source, nnx.State) else nnx.state(source, nnx.Param)
    flat = nnx.to_flat_state(state)
    return {".".join(str(part) for part in path): variable for path, variable in flat}


def state_dict(source: nnx.Module | nnx.State) -> dict[str, np.ndarray]:
    """The parameters of a model (or its `nnx.split` parameter state, as a train step holds
    them) as numpy arrays under their PyTorch transformers names."""
    return {name: np.asarray(variable.get_value()) for name, variable in
            _flat_params(source).items()}


def load_state_dict(model: nnx.Module, tensors: dict) -> None:
    """Set every parameter from a PyTorch-named state dict (numpy or anything array-like).
    Tied copies and buffers a checkpoint may also hold are skipped; a missing, unexpected or
    wrongly shaped tensor is an error naming it, and nothing is changed."""
    params = _flat_params(model)
    ignored = re.compile("|".join(f"(?:{p})" for p in type(model).IGNORED_KEYS))
    missing = sorted(set(params) - set(tensors))
    unexpected = sorted(k for k in tensors if k not in params and not ignored.fullmatch(k))
    wrong = sorted(f"{k} {tuple(np.shape(tensors[k]))} (the model has "
                   f"{tuple(params[k].get_value().shape)})"
                   for k in params if k in tensors
                   and tuple(np.shape(tensors[k])) != tuple(params[k].get_value().shape))
    problems = [f"{label}: {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}"
                for label, keys in (("missing", missing), ("unexpected", unexpected),
                                    ("wrong shape", wrong)) if keys]
    if problems:
        raise UserError(
            f"the weights do not fit this {type(model).__name__} ({'; '.join(problems)})",
            hint="use a checkpoint of the same family and shape",
        )
    for name, variable in params.items():
        variable.set_value(jnp.asarray(np.asarray(tensors[name]), jnp.float32))
    nnx.update(model, nnx.from_flat_state(
        [(tuple(_path(name)), variable) for name, variable in params.items()]))


def _path(name: str) -> list:
    return [int(part) if part.isdigit() else part for part in name.split(".")]
