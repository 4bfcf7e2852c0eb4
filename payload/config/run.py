"""The whole run config: its name, output_dir and sections, checked together.

    config = RunConfig.model_validate(raw, context={"engine": "jax"})
    config.record_len, config.trains_tokenizer
"""

from __future__ import annotations

import os
import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from payload.config.base import UNPARSED, PathText, Section, check, check_scheme, run_checks
from payload.config.checks import CROSS_CHECKS
from payload.config.clusters import Cluster, LocalCluster, default_bucket
from payload.config.sections import (
    DataConfig,
    HubConfig,
    ModelConfig,
    TokenizerConfig,
    TrainConfig,
)
from payload.core.families import FAMILIES

RUN_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
_PROJECT_MARKERS = (".git", "pyproject.toml")


def check_output_dir_path(value: str) -> str:
    """output_dir must be a folder of the run's own: tpuctl writes in it and deletes inside it,
    so a root (of the filesystem, a mount, the home folder, a project) is refused."""
    check_scheme(value, "write to", quote=False)  # the value is shown with the error
    if value.startswith("gs://"):
        bucket, _, prefix = value[len("gs://"):].partition("/")
        if not bucket or not prefix.strip("/"):
            raise ValueError(f"a whole bucket cannot be an output_dir; use gs://"
                             f"{bucket or 'BUCKET'}/NAME")
        return value
    path = os.path.realpath(os.path.expanduser(value))
    home = os.path.realpath(os.path.expanduser("~"))
    what = None
    if path == os.path.dirname(path):
        what = "the filesystem root"
    elif path == home:
        what = "your home folder"
    elif home.startswith(path.rstrip(os.sep) + os.sep):
        what = "a folder that holds your home folder"
    elif os.path.ismount(path):
        what = "the root of a mounted filesystem"
    else:
        found = next((m for m in _PROJECT_MARKERS if os.path.exists(os.path.join(path, m))), None)
        if found:
            what = f"a project's root folder (it holds {found})"
    if what:
        raise ValueError(f"{what} cannot be an output_dir (tpuctl deletes inside it); use a "
                         f"folder of the run's own, such as {os.path.join(path, 'runs', 'NAME')}")
    return value


class RunConfig(Section):
    name: str
    output_dir: PathText  # gcp default: gs://BUCKET/NAME
    cluster: Cluster = Field(default_factory=lambda: LocalCluster(provider="local"))
    data: DataConfig
    tokenizer: TokenizerConfig = Field(default_factory=lambda: TokenizerConfig())
    model: ModelConfig
    train: TrainConfig
    hub: HubConfig = Field(default_factory=lambda: HubConfig())

    @field_validator("output_dir")
    @classmethod
    def _output_dir(cls, value: str) -> str:
        return check_output_dir_path(value)

    @model_validator(mode="before")
    @classmethod
    def _gcp_output_dir(cls, raw: Any) -> Any:
        """On gcp, output_dir defaults to gs://BUCKET/NAME."""
        if isinstance(raw, dict) and raw.get("output_dir") is None:
            cluster, name = raw.get("cluster"), raw.get("name")
            if (isinstance(cluster, dict) and cluster.get("provider") in ("gcp", "gce")
                    and isinstance(name, str) and isinstance(cluster.get("project"), str)):
                bucket = cluster.get("bucket") or default_bucket(cluster["project"])
                raw = {**raw, "output_dir": f"gs://{bucket}/{name}"}
        return raw

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not RUN_NAME.match(value):
            raise ValueError(
                f"'{value}' must be 1-63 lowercase letters, digits and dashes, starting and "
                "ending with a letter or digit (it names the job, the TPU and bucket paths)"
            )
        return value

    @check
    def _across_sections(self) -> list[str]:
        """What is wrong between sections (payload.config.checks), each check on its own: on a
        partial config, those that read nothing unparsed still run."""
        values = [getattr(self, key) for key in type(self).model_fields]
        partial = any(v is UNPARSED or (isinstance(v, Section) and v.is_partial)
                      for v in values)
        return run_checks(CROSS_CHECKS, self, partial=partial)

    @property
    def trains_tokenizer(self) -> bool:
        """Whether the tokenizer stage trains one: not when tokenizer.path or model.init_from
        brings it."""
        return self.tokenizer.path is None and self.model.init_from is None

    @property
    def record_len(self) -> int:
        """Tokens per stored record: `seq_len`, or T5's longer pre-corruption row (the
        family's module says)."""
        return FAMILIES[self.model.family].record_len(self.model, self.data.seq_len)
