"""The reference run for the multi-process JAX tests: the train stage in one process over all of
its CPU devices. The reader (payload.data.stream) gives every layout the same global batches, so
this process reads what N worker processes read together.

    XLA_FLAGS=--xla_force_host_platform_device_count=2 \\
        python tests/support/scripts/jax_reference.py --config run.yaml
"""

from __future__ import annotations

import argparse
import logging
import sys


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")

    from payload.config import load_config
    from payload.stages.train import run_train

    run_train(load_config(args.config), overwrite=True)


if __name__ == "__main__":
    main()
