"""The reference run for the multi-process JAX tests: the train stage in one process over all of
its CPU devices, fed the global batches that N worker processes feed together (the rows of
input pipeline i after those of pipeline i - 1, as TrainProgram.global_batch joins them).

    XLA_FLAGS=--xla_force_host_platform_device_count=2 \\
        python tests/support/scripts/jax_reference.py --config run.yaml --pipelines 2
"""

from __future__ import annotations

import argparse
import logging
import sys

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--pipelines", type=int, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")

    from payload.config import load_config
    from payload.engines.jax.trainer import JaxTrainer
    from payload.stages.train import run_train

    def host_batches(self, files, *, shuffle: bool, start_batch: int):
        batch_size = self.config.train.batch_size // args.pipelines
        shares = [self.inputs.pipeline(self.config, files, shuffle=shuffle,
                                       start_batch=start_batch, batch_size=batch_size,
                                       pipeline_id=i, num_pipelines=args.pipelines
                                       ).as_numpy_iterator()
                  for i in range(args.pipelines)]
        for parts in zip(*shares, strict=True):
            yield {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}

    JaxTrainer._host_batches = host_batches
    run_train(load_config(args.config), overwrite=True)


if __name__ == "__main__":
    main()
