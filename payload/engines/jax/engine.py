"""The JAX engine behind the seam (payload.engines.Engine): what the stages ask of it.

    from payload.engines import engine_for
    engine = engine_for("jax")
    engine.newest_step(output_dir)            # from the Orbax step folders, no JAX

Orbax writes each checkpoint as a folder named by its step directly in output_dir/checkpoints/
(beside tpuctl's run.json and marker), built under a temporary name and finished by
`commit_success.txt` (payload.engines.jax.checkpoints): a step folder with its commit file is a
checkpoint, anything else of Orbax's is a save cut short.
"""

from __future__ import annotations

import importlib.util
import re

from payload.core import layout, storage
from payload.core.errors import UserError

COMMIT = "commit_success.txt"
_STEP = re.compile(r"^\d+\Z")
# A step folder or the temporary one a save builds it in, and anything inside.
_WRITTEN = re.compile(r"^\d+(?:\.orbax-checkpoint-tmp[^/]*)?/.+\Z")


# What the engine imports, and the extra that installs them (pyproject's `jax`).
FRAMEWORK = ("jax", "flax", "optax", "orbax")


def check_installed() -> None:
    """The engine's packages are in this Python: else one line saying how to get them (a run
    whose checkpoints say jax, exported where only the TensorFlow set is installed)."""
    missing = [name for name in FRAMEWORK if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(
            f"train.engine jax needs {', '.join(missing)}, which this Python does not have",
            hint="pip install 'tpuctl[jax]' (tpuctl train installs it on workers itself)")


class JaxEngine:
    name = "jax"

    def checkpoint_files(self, names: list[str]) -> list[str]:
        found = [n for n in names if _WRITTEN.match(n.replace("\\", "/"))]
        # The commit files first: a step stops counting before its data go.
        return sorted(found, key=lambda n: (n.replace("\\", "/").split("/", 1)[1] != COMMIT, n))

    def newest_step(self, output_dir: str) -> int | None:
        commits = storage.glob(storage.join(layout.checkpoints_dir(output_dir), "*", COMMIT))
        steps = [int(step) for step in (path.replace("\\", "/").split("/")[-2]
                                        for path in commits) if _STEP.match(step)]
        return max(steps) if steps else None

    def plan_lines(self, workload) -> list[str]:
        """Which attention kernel each kind of attention call takes on the workload's platform,
        and why (payload.engines.jax.attention; no JAX imported)."""
        from payload.engines.jax.attention import attention_plan

        return attention_plan(workload.architecture, platform=workload.platform,
                              generation=workload.generation, seq_len=workload.seq_len,
                              target_len=workload.target_len, bf16=workload.bf16)

    def trainer(self, config, inputs, plan):
        check_installed()
        from payload.engines.jax.trainer import JaxTrainer

        return JaxTrainer(config, inputs, plan)

    # --- export and init_from (payload/engines/jax/{export,pretrained}.py) --------------------
    # PyTorch names only: see payload/engines/jax/pretrained.py for why not tf_model.h5.
    init_from_files = ("model.safetensors",)

    def trained_weights(self, config, hf_config):
        check_installed()
        from payload.engines.jax.export import trained_weights

        return trained_weights(config, hf_config)


ENGINE = JaxEngine()
