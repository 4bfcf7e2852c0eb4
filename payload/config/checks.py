"""What is wrong between the run config's sections, every problem at once, and what a valid
config gives that its run will not use.

    problems = [line for check in CROSS_CHECKS for line in check(config)]   # RunConfig's
    ignored_settings(config)   # ["tokenizer.vocab_size is ignored: model.init_from ... "]

Each check takes the whole config and returns its problems. On a config some of whose keys did
not parse (payload.config.base.partial), a check that reads one of them is left out and the
others still run, so a file's problems come in one round.
"""

from __future__ import annotations

from payload.config.base import BYTE_ALPHABET, MIN_LEARNED_PIECES, problems_of
from payload.config.clusters import (
    TPU_NAME,
    GceCluster,
    GcpCluster,
    GoogleCloud,
    LocalCluster,
    SshCluster,
    gce_name_problems,
)
from payload.core.engines import JAX, engine_spec
from payload.core.families import FAMILIES


def _tpu_name(config) -> list[str]:
    if (isinstance(config.cluster, GcpCluster) and config.cluster.tpu_name is None
            and not TPU_NAME.match(config.name)):
        return [f"name: '{config.name}' also names the TPU, and TPU names start with a letter; "
                "rename the run or set cluster.tpu_name"]
    return []


def _gce_names(config) -> list[str]:
    return (gce_name_problems(config.name, config.cluster.slices)
            if isinstance(config.cluster, GceCluster) else [])


def _gce_engine(config) -> list[str]:
    if isinstance(config.cluster, GceCluster) and config.train.engine != JAX:
        # Google documents JAX and PyTorch on TPU7x, and no TensorFlow route reaches v6e.
        return [f"train.engine: {config.train.engine} does not run on provider gce (Compute "
                "Engine TPU VMs run JAX only); set train.engine: jax"]
    return []


def _slices(config) -> list[str]:
    """cluster.slices against the engine, the generation and the workers that make them."""
    from payload.cloud import accelerators

    cluster = config.cluster
    if cluster.slices == 1:
        return []
    if isinstance(cluster, GoogleCloud):
        problems = problems_of("cluster.slices", accelerators.topology_of, cluster.tpu,
                               cluster.slices)
        hosts = cluster.tpu.hosts * cluster.slices
    else:
        problems = []
        hosts = (cluster.workers if isinstance(cluster, LocalCluster)
                 else len(cluster.hosts) if isinstance(cluster, SshCluster) else cluster.slices)
    return problems or problems_of("cluster.slices", lambda: accelerators.check_slices(
        cluster.slices, engine=config.train.engine, hosts=hosts))


def _positions(config) -> list[str]:
    family = FAMILIES[config.model.family]
    if config.data.seq_len > family.max_positions:
        return [f"data.seq_len={config.data.seq_len} is over what {family.name} allows "
                f"({family.max_positions}); lower data.seq_len"]
    return []


def _one_tokenizer(config) -> list[str]:
    if config.model.init_from and config.tokenizer.path:
        return ["model.init_from brings its own tokenizer: remove tokenizer.path"]
    return []


def _vocabulary(config) -> list[str]:
    model, tokenizer = config.model, config.tokenizer
    if tokenizer.path is not None or model.init_from is not None:
        return []  # the tokenizer stage trains none
    family = FAMILIES[model.family]
    minimum = len(family.special_tokens) + (
        BYTE_ALPHABET if tokenizer.kind == "bpe" else MIN_LEARNED_PIECES)
    if tokenizer.vocab_size < minimum:
        return [f"tokenizer.vocab_size={tokenizer.vocab_size} is too small for "
                f"{tokenizer.kind} with {family.name}'s {len(family.special_tokens)} special "
                f"tokens; use at least {minimum}"]
    return []


def _priced(config) -> list[str]:
    if config.train.max_cost is not None and config.cluster.hourly_usd() is None:
        return ["train.max_cost needs a price per hour, and tpuctl's price table has none for "
                "this cluster (only cloud TPUs are priced, and not every type or provisioning); "
                "use train.max_hours instead"]
    return []


def _remat(config) -> list[str]:
    train = config.train
    if train.engine != JAX and train.remat != "auto":
        return [f"train.remat: {train.remat} rematerialises the JAX engine's layers; the "
                f"{train.engine} engine has no such setting: remove it or set train.engine: jax"]
    return []


def _one_dropout(config) -> list[str]:
    model = config.model
    family = FAMILIES[model.family]
    if (family.one_dropout and model.attention_dropout is not None
            and model.attention_dropout != model.dropout):
        return [f"model.attention_dropout: {family.title} has one dropout rate for all its "
                "layers (transformers' dropout_rate); set model.dropout instead"]
    return []


def _family_engine(config) -> list[str]:
    family, engine = FAMILIES[config.model.family], config.train.engine
    if engine not in family.engines:
        return [f"model.family: {family.name} trains on the {' or '.join(family.engines)} "
                f"engine only (the {engine} engine has no {family.title} model); set "
                f"train.engine: {family.engines[0]}"]
    return []


def _grouped_attention(config) -> list[str]:
    model = config.model
    family = FAMILIES[model.family]
    given = [key for key in ("num_kv_heads", "tie_embeddings") if getattr(model, key) is not None]
    if given and not family.grouped_attention:
        grouped = ", ".join(name for name, spec in FAMILIES.items() if spec.grouped_attention)
        return [f"model.{given[0]} is a setting of family {grouped}, not {family.name}; "
                "remove it"]
    return []


def _warmup(config) -> list[str]:
    train = config.train
    if train.warmup_steps > train.steps:
        return [f"train.warmup_steps={train.warmup_steps} is more than train.steps={train.steps}"]
    return []


def _state_fits(config) -> list[str]:
    """A model whose training state the TPU's chips cannot hold, as the engine would lay it
    out (payload.core.engines: its spec's plan_sharding), refused with the engine and the type:
    here when the config alone gives the shape and vocabulary; a model read from files is
    checked by the run plan (`train --dry-run`) and the train stage."""
    cluster, data, tokenizer, model, train = (config.cluster, config.data, config.tokenizer,
                                              config.model, config.train)
    if not isinstance(cluster, GoogleCloud):
        return []
    if model.init_from or model.config or tokenizer.path:
        return []
    from payload.cloud.accelerators import larger_slices
    from payload.core.fit.workload import Workload
    from payload.core.sizes import parameter_count, transformers_config

    acc = cluster.tpu_topology
    architecture = transformers_config(model, vocab_size=tokenizer.vocab_size,
                                       seq_len=data.seq_len)
    params = parameter_count(architecture)
    workload = Workload.of(architecture, model=model, data=data, train=train, platform="tpu",
                           generation=acc.generation)
    key = f"model.size {model.size}" if model.size else "model"
    return problems_of(key, lambda: engine_spec(train.engine).plan_sharding(
        params, num_devices=acc.jax_devices, hbm_bytes_per_chip=acc.hbm_bytes_per_device,
        optimizer=train.optimizer, where=acc.name, workload=workload,
        larger=larger_slices(acc.name), num_slices=acc.num_slices))


# In the order their problems are shown.
CROSS_CHECKS = (_family_engine, _tpu_name, _gce_names, _gce_engine, _slices, _positions,
                _grouped_attention, _one_tokenizer, _vocabulary, _priced, _remat, _one_dropout,
                _warmup, _state_fits)


# What only the tokenizer stage reads when it trains a tokenizer.
_TRAINING_TOKENIZER_KEYS = ("kind", "vocab_size", "sample_mb", "min_frequency")


def ignored_settings(config) -> list[str]:
    """One line per setting the file gives that this run will not use (the run still goes):
    the tokenizer training keys when tokenizer.path or model.init_from brings the tokenizer,
    model.dropout above 0 for a family without it (Llama). Only what the file itself set counts
    (a config loaded from a file, not a resolved dump)."""
    lines = []
    model, family = config.model, FAMILIES[config.model.family]
    if not family.residual_dropout and "dropout" in model.model_fields_set and model.dropout:
        lines.append(f"model.dropout is ignored: {family.title} has dropout only on the "
                     "attention weights (model.attention_dropout); remove it from the config")
    reused = (f"model.init_from {config.model.init_from}" if config.model.init_from
              else f"tokenizer.path {config.tokenizer.path}" if config.tokenizer.path else None)
    given = [f"tokenizer.{key}" for key in _TRAINING_TOKENIZER_KEYS
             if key in config.tokenizer.model_fields_set]
    if reused and given:
        lines.append(f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} ignored: "
                     f"{reused} brings its own tokenizer, vocabulary and all; remove "
                     f"{'it' if len(given) == 1 else 'them'} from the config")
    return lines
