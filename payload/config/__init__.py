"""The run config (`tpuctl.yaml`): typed, frozen, validated before anything runs.

    config = load_config("tpuctl.yaml")
    config.data.seq_len, config.cluster.provider

Unknown keys, wrong types and out-of-range values become one `UserError` naming the key and what
is allowed. Relative local paths are resolved against the config file's folder, so a run behaves
the same from any working directory; the resolved config is what gets written next to outputs.

By concern: `clusters` (the cluster sections, one per provider), `sections` (data, tokenizer,
model, train, hub), `run` (the whole config, RunConfig), `checks` (what is wrong between
sections), `loading` (the YAML file, parse_config and how problems are worded), `base` (what
every section shares). Callers import from here.
"""

from payload.config.base import MAX_LOCAL_WORKERS, EngineName
from payload.config.checks import ignored_settings
from payload.config.clusters import (
    CLUSTERS,
    GCE_MAX_NAME,
    TPU_NAME,
    GceCluster,
    GcpCluster,
    LocalCluster,
    SshCluster,
    default_bucket,
)
from payload.config.loading import (
    check_stages,
    dump_config,
    load_config,
    parse_config,
    with_hub_repo,
)
from payload.config.run import RunConfig, check_output_dir_path
from payload.config.sections import (
    HUB_REPO,
    CorpusEntry,
    DataConfig,
    HubConfig,
    ModelConfig,
    TokenizerConfig,
    TrainConfig,
    check_model_config_file,
)

__all__ = [
    "CLUSTERS", "GCE_MAX_NAME", "HUB_REPO", "MAX_LOCAL_WORKERS", "TPU_NAME", "CorpusEntry",
    "DataConfig",
    "EngineName", "GceCluster", "GcpCluster", "HubConfig", "LocalCluster", "ModelConfig",
    "RunConfig", "SshCluster", "TokenizerConfig", "TrainConfig", "check_model_config_file",
    "check_output_dir_path", "check_stages", "default_bucket", "dump_config", "ignored_settings",
    "load_config", "parse_config", "with_hub_repo",
]
