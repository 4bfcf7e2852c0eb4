"""Run one pipeline stage on this machine: what the launcher runs on every worker.

    python -m payload tokenizer --config run.yaml
    python -m payload prepare --config run.yaml --worker-index 1 --num-workers 3
    python -m payload train --config run.yaml --hardware tpu/v4-32/my-run --num-workers 4

`--hardware` says what the fleet is made of (`cpu`, the default, or `tpu/TYPE/NODE`); the
launcher passes what its provider found, and the training stage's strategy decides from it.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import shutil
import socket
import sys
import tempfile

# Transformers' TF models need tf-keras; touching Keras 3 first breaks their optimizers.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from payload.core import layout
from payload.core.errors import UserError, error_lines
from payload.core.stages import PREFLIGHT, STAGE_NAMES, Stage, check_share

# Libraries whose Python loggers narrate their own work on every healthy run (Orbax's checkpoint
# manager through absl: about 20 INFO lines per restore, one of 1,300 characters; JAX,
# TensorFlow's Python side, tensorstore, etils): a stage's log keeps their warnings and errors
# only. What libraries print past Python's logging (C++ logs, Gloo) is for the launcher's view
# to leave out (launcher.view.NOISE).
QUIET_LIBRARIES = ("absl", "jax", "orbax", "tensorflow", "tensorstore", "etils")


class _Parser(argparse.ArgumentParser):
    """Usage mistakes end like every other user error: one `error:` line, exit status 2."""

    def error(self, message: str):
        raise UserError(message, hint="see python -m payload --help")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m payload", description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=(*STAGE_NAMES, PREFLIGHT))
    parser.add_argument("--config", "-c", required=True, help="run config (tpuctl.yaml)")
    parser.add_argument("--worker-index", type=int, default=0)
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--overwrite", action="store_true",
                        help="do the stage again over its earlier outputs, removing only what "
                        "tpuctl wrote: tokenizer: train it again (also one that shards or "
                        "checkpoints were made with); prepare: make this worker's share again; "
                        "train: start again over an earlier run's checkpoints")
    parser.add_argument("--resume", action="store_true", help="train: continue from a checkpoint")
    parser.add_argument("--new-data-order", action="store_true",
                        help="train --resume: continue although train.seed or the prepared data "
                        "changed, in their new order from the same example offset")
    parser.add_argument("--stages", default=",".join(STAGE_NAMES),
                        help=f"{PREFLIGHT}: the job's stages (comma-separated)")
    parser.add_argument("--hardware", default="cpu",
                        help="what the fleet is: cpu, or tpu/ACCELERATOR_TYPE/NODE_NAME")
    return parser


def run_stage(args: argparse.Namespace) -> None:
    from payload.config import load_config
    from payload.training.strategy import Hardware

    check_share(args.worker_index, args.num_workers)
    hardware = Hardware.parse(args.hardware)
    config = load_config(args.config)
    use_private_tempdir()
    use_own_keras_home()
    if args.stage == PREFLIGHT:
        from payload.stages.preflight import run_preflight

        run_preflight(config, stages=[Stage(s) for s in args.stages.split(",") if s],
                      resume=args.resume)
        return
    stage = Stage(args.stage)
    if stage is Stage.TOKENIZER:
        from payload.data.tokenizer import run_tokenizer

        run_tokenizer(config, overwrite=args.overwrite)
    elif stage is Stage.PREPARE:
        from payload.data.prepare import run_prepare

        run_prepare(config, worker_index=args.worker_index, num_workers=args.num_workers,
                    overwrite=args.overwrite)
    elif stage is Stage.TRAIN:
        from payload.stages.train import run_train

        run_train(config, worker_index=args.worker_index, num_workers=args.num_workers,
                  resume=args.resume, overwrite=args.overwrite, hardware=hardware,
                  new_data_order=args.new_data_order)
    elif stage is Stage.EXPORT:
        from payload.stages.export import run_export

        run_export(config)
    elif stage is Stage.PUBLISH:
        from payload.stages.publish import run_publish

        run_publish(config)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def use_private_tempdir() -> None:
    """This stage's temporary files (its own, TensorFlow's autograph modules, ...) go to a
    folder of this process under tpuctl's local state (TPUCTL_HOME, default ~/.tpuctl), removed
    at exit; a killed stage's folder is removed by the next stage on the same host, so a crash
    leaves nothing behind in the system's temporary folder."""
    root = layout.state_dir() / layout.TMP_DIR
    host = socket.gethostname()
    try:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(f"{host}-*"):
            pid = stale.name.rsplit("-", 1)[-1]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(stale, ignore_errors=True)
        mine = root / f"{host}-{os.getpid()}"
        mine.mkdir(exist_ok=True)
    except OSError:
        return  # no writable home: the system's temporary folder will do
    os.environ["TMPDIR"] = str(mine)  # before TensorFlow reads it
    tempfile.tempdir = str(mine)
    atexit.register(shutil.rmtree, mine, True)


def use_own_keras_home() -> None:
    """Keras (and tf-keras) write keras.json into their home when they load, ~/.keras unless
    KERAS_HOME says otherwise: a stage's Keras home is tpuctl's local state
    (TPUCTL_HOME/keras), so nothing of a run lands outside output_dir and ~/.tpuctl, and a
    keras.json of the user's (floatx, ...) does not change what trains. A KERAS_HOME the user
    set is kept."""
    os.environ.setdefault("KERAS_HOME", str(layout.state_dir() / layout.KERAS_DIR))


def _name_the_library(record: logging.LogRecord) -> bool:
    """A library's record says whose it is ("[absl] ..."): the stage's own lines and what a
    library says read apart, in the log and in the launcher's view."""
    top = record.name.split(".", 1)[0]
    record.origin = "" if top in ("payload", "root", "__main__") else f"[{top}] "
    return True


def _fail(exc: UserError) -> int:
    if os.environ.get("TPUCTL_DEBUG"):
        raise exc
    for line in error_lines(exc):  # several problems (a config's): one line each
        print(f"error: {line}", file=sys.stderr, flush=True)
    return exc.exit_code


# What is left of a stage cut short by Ctrl-C, and how to go on (each stage writes so that a
# crash leaves the old result or the new one).
INTERRUPTED = {
    "tokenizer": "the earlier tokenizer, if any, is as it was; run it again",
    "prepare": "the shards finished so far stay; run it again to continue after the last one",
    "train": "the newest checkpoint stays; --resume continues from it",
    "export": "an earlier model/, if any, is as it was; run it again",
}
INTERRUPTED_RC = 130  # 128 + SIGINT, as a shell reports a process Ctrl-C ended


def _interrupted(stage: str) -> int:
    print(f"error: {stage} interrupted (Ctrl-C): "
          f"{INTERRUPTED.get(stage, 'run it again')}", file=sys.stderr, flush=True)
    return INTERRUPTED_RC


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except UserError as exc:
        return _fail(exc)
    root = logging.getLogger()
    present = list(root.handlers)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stdout,
        format=f"%(asctime)s w{args.worker_index} {args.stage} %(origin)s%(message)s",
        datefmt="%H:%M:%S",
    )
    for handler in root.handlers:
        if handler not in present:  # the stage's own handler, not one a caller had set up
            handler.addFilter(_name_the_library)
    for library in QUIET_LIBRARIES:
        logging.getLogger(library).setLevel(logging.WARNING)
    try:
        run_stage(args)
    except UserError as exc:
        return _fail(exc)
    except KeyboardInterrupt:
        if os.environ.get("TPUCTL_DEBUG"):
            raise
        return _interrupted(args.stage)
    return 0


if __name__ == "__main__":
    sys.exit(main())
