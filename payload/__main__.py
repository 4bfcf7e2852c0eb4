"""Run one pipeline stage on this machine: what the launcher runs on every worker.

    python -m payload tokenizer --config run.yaml
    python -m payload prepare --config run.yaml --worker-index 1 --num-workers 3
    python -m payload train --config run.yaml --hardware tpu/v4-32/my-run --num-workers 4

`--hardware` says what the fleet is made of (`cpu`, the default, or `tpu/TYPE/NODE`); the
launcher passes what its provider found, and the training stage's strategy decides from it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

# Transformers' TF models need tf-keras; touching Keras 3 first breaks their optimizers.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from payload.errors import UserError, one_line
from payload.stages import STAGE_NAMES, Stage, check_share


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m payload", description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=STAGE_NAMES)
    parser.add_argument("--config", "-c", required=True, help="run config (tpuctl.yaml)")
    parser.add_argument("--worker-index", type=int, default=0)
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--overwrite", action="store_true",
                        help="prepare: replace shards made with another tokenizer or layout; "
                        "train: start again over an earlier run's checkpoints")
    parser.add_argument("--resume", action="store_true", help="train: continue from a checkpoint")
    parser.add_argument("--hardware", default="cpu",
                        help="what the fleet is: cpu, or tpu/ACCELERATOR_TYPE/NODE_NAME")
    return parser


def run_stage(args: argparse.Namespace) -> None:
    from payload.config import load_config
    from payload.strategy import Hardware

    check_share(args.worker_index, args.num_workers)
    hardware = Hardware.parse(args.hardware)
    config = load_config(args.config)
    stage = Stage(args.stage)
    if stage is Stage.TOKENIZER:
        from payload.tokenizer import run_tokenizer

        run_tokenizer(config)
    elif stage is Stage.PREPARE:
        from payload.prepare import run_prepare

        run_prepare(config, worker_index=args.worker_index, num_workers=args.num_workers,
                    overwrite=args.overwrite)
    elif stage is Stage.TRAIN:
        from payload.train import run_train

        run_train(config, worker_index=args.worker_index, num_workers=args.num_workers,
                  resume=args.resume, overwrite=args.overwrite, hardware=hardware)
    elif stage is Stage.EXPORT:
        from payload.export import run_export

        run_export(config)
    elif stage is Stage.PUBLISH:
        from payload.publish import run_publish

        run_publish(config)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stdout,
        format=f"%(asctime)s w{args.worker_index} {args.stage} %(message)s", datefmt="%H:%M:%S",
    )
    try:
        run_stage(args)
    except UserError as exc:
        if os.environ.get("TPUCTL_DEBUG"):
            raise
        print(f"error: {one_line(str(exc))}", file=sys.stderr, flush=True)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
