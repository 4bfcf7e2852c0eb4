"""Every name tpuctl gives a file or folder under output_dir and the local state folder, once.

    layout.join(out, layout.MODEL_DIR)        # output_dir/model
    layout.manifest_path(out)                 # output_dir/data/manifest.json
    layout.worker_label(1)                    # "worker-1": its log, its markers, its messages
    layout.state_dir()                        # TPUCTL_HOME, default ~/.tpuctl

The stages, the launcher and the worker's job agent all spell these through this module, so a
name changes here and nowhere else. Pure: no storage client, no I/O but reading the environment.

In output_dir: tokenizer/, data/{train,validation,parts}/, data/manifest.json, checkpoints/,
model/, logs/worker-N.log, logs/tensorboard/, metrics.json, config.yaml; tpuctl's own
.tpuctl/{owner,run.lock,billing.json,ledger/,jobs/JOB/,jax-cache/}; FOLDER/.tpuctl-complete once a folder is whole.
In TPUCTL_HOME (default ~/.tpuctl): jobs/, infra/RUN/, gcp/RUN/, local/RUN/worker-N/, tmp/.
"""

from __future__ import annotations

import os
from pathlib import Path

GCS = "gs://"

# --- output_dir -------------------------------------------------------------------------------
TOKENIZER_DIR = "tokenizer"
DATA_DIR = "data"
MANIFEST = "manifest.json"  # inside DATA_DIR
PARTS_DIR = "parts"  # inside DATA_DIR: each worker's share before the manifest joins them
CHECKPOINTS_DIR = "checkpoints"
RUN_IDENTITY = "run.json"  # inside CHECKPOINTS_DIR: what the checkpoints were made from
SCHEDULE = "schedule.json"  # inside CHECKPOINTS_DIR: the schedule they are trained on
DATA_STREAM = "data.json"  # inside CHECKPOINTS_DIR: the input order they are trained on
VERIFIED = "verified.json"  # inside DATA_DIR: the manifest whose shards were checked in full
TOKENIZER_STAMP = "training.json"  # inside TOKENIZER_DIR: what the tokenizer was trained from
EXPORT_NOTE = "tpuctl_export.json"  # inside MODEL_DIR: its checkpoint, relative to output_dir
RECOVERIES = "recoveries.json"  # the preemptions a run survived
MODEL_DIR = "model"
LOGS_DIR = "logs"
TENSORBOARD_DIR = "tensorboard"  # inside LOGS_DIR
METRICS = "metrics.json"
CONFIG = "config.yaml"  # the resolved config, next to the outputs (and in a job's record)

# tpuctl's own folder, in output_dir and as the default local state folder and worker root.
OWN_DIR = ".tpuctl"
OWNER = "owner"  # OWN_DIR/owner: tpuctl made this output_dir, so it may delete in it
RUN_LOCK = "run.lock"  # OWN_DIR/run.lock: one run at a time per output_dir
BILLING = "billing.json"  # OWN_DIR/billing.json: what a job's TPU has cost so far
WANDB_RUN = "wandb.json"  # OWN_DIR/wandb.json: the Weights & Biases run a resumed run logs to
LEDGER_DIR = "ledger"  # OWN_DIR/ledger/: the run's events, appended (payload.core.ledger)
JOBS_DIR = "jobs"  # OWN_DIR/jobs/JOB in output_dir (barriers); TPUCTL_HOME/jobs/RUN/JOB (records)
COMPLETE = ".tpuctl-complete"  # FOLDER/.tpuctl-complete, written last: the folder is whole
DOWNLOAD_MARKER = ".tpuctl-download"  # in a local copy of model/ that `--download` made
JAX_CACHE = "jax-cache"  # OWN_DIR/jax-cache: the JAX engine's compiled steps, for a resume

# --- the local state folder -----------------------------------------------------------------
STATE_ENV = "TPUCTL_HOME"
INFRA_DIR = "infra"  # TPUCTL_HOME/infra/RUN: the run's Terraform folder
GCP_DIR = "gcp"  # TPUCTL_HOME/gcp/RUN: the key, known_hosts and ownership record
LOCAL_DIR = "local"  # TPUCTL_HOME/local/RUN/worker-N: a local worker's own folder
TMP_DIR = "tmp"  # TPUCTL_HOME/tmp/HOST-PID: a stage's temporary files, also on workers
KERAS_DIR = "keras"  # TPUCTL_HOME/keras: Keras' home (keras.json) for the stages, not ~/.keras
OWNED = "owned.json"  # GCP_DIR/RUN/owned.json: the cloud resources tpuctl recorded making
SITE = "site.json"  # GCP_DIR/RUN/site.json: the zone the run's TPU is in
# A job's record, TPUCTL_HOME/jobs/RUN/JOB/: its plan, how to reach the workers, its outcome,
# the launcher following it now; TPUCTL_HOME/jobs/RUN/current names the newest job.
JOB_PLAN = "plan.json"
JOB_REACH = "reach.json"
JOB_OUTCOME = "outcome.json"
JOB_WATCHER = "watcher.json"
CURRENT_JOB = "current"


def is_gcs(path: str) -> bool:
    return path.startswith(GCS)


def join(base: str, *parts: str) -> str:
    """A path under `base`, local or gs:// (where os.path.join would not do)."""
    if is_gcs(base):
        return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])
    return os.path.join(base, *parts)


def worker_label(index: int) -> str:
    """How every message, log file and marker of tpuctl names a worker."""
    return f"worker-{index}"


def worker_log(index: int) -> str:
    """A worker's log file name, in output_dir/logs and in a job's record."""
    return f"{worker_label(index)}.log"


def own_path(output_dir: str, *parts: str) -> str:
    """A path inside output_dir's own folder (`.tpuctl/...`)."""
    return join(output_dir, OWN_DIR, *parts)


def data_dir(output_dir: str) -> str:
    return join(output_dir, DATA_DIR)


def manifest_path(output_dir: str) -> str:
    return join(output_dir, DATA_DIR, MANIFEST)


def model_dir(output_dir: str) -> str:
    return join(output_dir, MODEL_DIR)


def checkpoints_dir(output_dir: str) -> str:
    return join(output_dir, CHECKPOINTS_DIR)


def run_identity_path(output_dir: str) -> str:
    return join(output_dir, CHECKPOINTS_DIR, RUN_IDENTITY)


def metrics_path(output_dir: str) -> str:
    return join(output_dir, METRICS)


def config_path(output_dir: str) -> str:
    return join(output_dir, CONFIG)


def log_path(output_dir: str, index: int) -> str:
    return join(output_dir, LOGS_DIR, worker_log(index))


def state_dir() -> Path:
    """The launcher's local state folder: TPUCTL_HOME, or ~/.tpuctl."""
    return Path(os.environ.get(STATE_ENV) or Path.home() / OWN_DIR)
