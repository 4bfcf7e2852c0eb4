"""What is wrong between the run config's sections, every problem at once, and what a valid
config gives that its run will not use.

    problems = cross_problems(name="run", cluster=cluster, data=data, tokenizer=tokenizer,
                              model=model, train=train)   # a section may be None (invalid)
    ignored_settings(config)   # ["tokenizer.vocab_size is ignored: model.init_from ... "]
"""

from __future__ import annotations

from payload.config.base import BYTE_ALPHABET, MIN_LEARNED_PIECES, problems_of
from payload.config.clusters import TPU_NAME, GceCluster, GcpCluster, GoogleCloud, gce_name_problems
from payload.core.engines import JAX, engine_spec
from payload.core.families import FAMILIES


def cross_problems(*, name: str | None, cluster, data, tokenizer, model, train) -> list[str]:
    """What is wrong between sections. Each section is None when it is itself invalid (its own
    problems are reported): the checks that need it are left out, the others still run."""
    problems = []
    if (name is not None and isinstance(cluster, GcpCluster) and cluster.tpu_name is None
            and not TPU_NAME.match(name)):
        problems.append(f"name: '{name}' also names the TPU, and TPU names start with a "
                        "letter; rename the run or set cluster.tpu_name")
    if name is not None and isinstance(cluster, GceCluster):
        problems += gce_name_problems(name)
    if train is not None and isinstance(cluster, GceCluster) and train.engine != JAX:
        # Google documents JAX and PyTorch on TPU7x, and no TensorFlow route reaches v6e.
        problems.append(f"train.engine: {train.engine} does not run on provider gce (Compute "
                        "Engine TPU VMs run JAX only); set train.engine: jax")
    family = FAMILIES[model.family] if model is not None else None
    if family is not None and data is not None and data.seq_len > family.max_positions:
        problems.append(f"data.seq_len={data.seq_len} is over what {family.name} allows "
                        f"({family.max_positions}); lower data.seq_len")
    if model is not None and tokenizer is not None:
        if model.init_from and tokenizer.path:
            problems.append("model.init_from brings its own tokenizer: remove tokenizer.path")
        if tokenizer.path is None and model.init_from is None:  # the tokenizer stage trains
            minimum = len(family.special_tokens) + (
                BYTE_ALPHABET if tokenizer.kind == "bpe" else MIN_LEARNED_PIECES)
            if tokenizer.vocab_size < minimum:
                problems.append(
                    f"tokenizer.vocab_size={tokenizer.vocab_size} is too small for "
                    f"{tokenizer.kind} with {family.name}'s {len(family.special_tokens)} "
                    f"special tokens; use at least {minimum}")
    if train is not None and cluster is not None and train.max_cost is not None and (
            cluster.hourly_usd() is None):
        problems.append("train.max_cost needs a price per hour, and tpuctl's price table has "
                        "none for this cluster (only cloud TPUs are priced, and not every "
                        "type or provisioning); use train.max_hours instead")
    if train is not None and train.engine != JAX and train.remat != "auto":
        problems.append(f"train.remat: {train.remat} rematerialises the JAX engine's layers; "
                        f"the {train.engine} engine has no such setting: remove it or set "
                        "train.engine: jax")
    if (model is not None and model.family == "t5" and model.attention_dropout is not None
            and model.attention_dropout != model.dropout):
        problems.append("model.attention_dropout: T5 has one dropout rate for all its layers "
                        "(transformers' dropout_rate); set model.dropout instead")
    if train is not None and train.warmup_steps > train.steps:
        problems.append(f"train.warmup_steps={train.warmup_steps} is more than train.steps="
                        f"{train.steps}")
    problems += _state_problems(cluster=cluster, data=data, tokenizer=tokenizer, model=model,
                                train=train)
    return problems


def _state_problems(*, cluster, data, tokenizer, model, train) -> list[str]:
    """A model whose training state the TPU's chips cannot hold, as the engine would lay it
    out (payload.core.engines: its spec's plan_sharding), refused with the engine and the type: here when the
    config alone gives the shape and vocabulary; a model read from files is checked by the run
    plan (`train --dry-run`) and the train stage."""
    if not (isinstance(cluster, GoogleCloud) and None not in (data, tokenizer, model, train)):
        return []
    if model.init_from or model.config or tokenizer.path:
        return []
    from payload.cloud.accelerators import larger_slices
    from payload.core.fit.workload import Workload
    from payload.core.sizes import parameter_count, transformers_config

    acc = cluster.tpu
    architecture = transformers_config(model, vocab_size=tokenizer.vocab_size,
                                       seq_len=data.seq_len)
    params = parameter_count(architecture)
    workload = Workload.of(architecture, model=model, data=data, train=train, platform="tpu",
                           generation=acc.generation)
    key = f"model.size {model.size}" if model.size else "model"
    return problems_of(key, lambda: engine_spec(train.engine).plan_sharding(
        params, num_devices=acc.jax_devices, hbm_bytes_per_chip=acc.hbm_bytes_per_device,
        optimizer=train.optimizer, where=acc.name, workload=workload,
        larger=larger_slices(acc.name)))


# What only the tokenizer stage reads when it trains a tokenizer.
_TRAINING_TOKENIZER_KEYS = ("kind", "vocab_size", "sample_mb", "min_frequency")


def ignored_settings(config) -> list[str]:
    """One line per setting the file gives that this run will not use (the run still goes):
    the tokenizer training keys when tokenizer.path or model.init_from brings the tokenizer.
    Only what the file itself set counts (a config loaded from a file, not a resolved dump)."""
    lines = []
    reused = (f"model.init_from {config.model.init_from}" if config.model.init_from
              else f"tokenizer.path {config.tokenizer.path}" if config.tokenizer.path else None)
    given = [f"tokenizer.{key}" for key in _TRAINING_TOKENIZER_KEYS
             if key in config.tokenizer.model_fields_set]
    if reused and given:
        lines.append(f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} ignored: "
                     f"{reused} brings its own tokenizer, vocabulary and all; remove "
                     f"{'it' if len(given) == 1 else 'them'} from the config")
    return lines
