"""tpuctl's worker package: the pipeline stages that run on every worker.

    python -m payload tokenizer --config run.yaml
    python -m payload prepare --config run.yaml --worker-index 0 --num-workers 2
"""

__version__ = "0.1.0"
