"""Runs the train/export stages the way `python -m payload` does, for tests on a checkout whose
payload has no `__main__` yet. Same arguments, same one-line errors and exit status 2.

    python tests/stage_runner.py train --config run.yaml --worker-index 0 --num-workers 2
"""

import argparse
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def main() -> int:
    from payload.config import load_config
    from payload.errors import UserError, one_line

    parser = argparse.ArgumentParser()
    parser.add_argument("stage", choices=["train", "export"])
    parser.add_argument("--config", required=True)
    parser.add_argument("--worker-index", type=int, default=0)
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()
    try:
        config = load_config(args.config)
        if args.stage == "train":
            from payload.train import run_train

            run_train(
                config,
                worker_index=args.worker_index,
                num_workers=args.num_workers,
                resume=args.resume,
                overwrite=args.overwrite,
            )
        else:
            from payload.export import run_export

            run_export(config)
    except UserError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
