"""One process of a tiny JAX training run, for the multi-process and checkpoint tests.

    python tests/support/scripts/jax_worker.py --out DIR --steps 20 [--process-id I --num-processes N --port P]
                               [--checkpoints DIR --save-every K [--resume]]

A tiny GPT-2 trains on global batches drawn from the step number, so every process layout sees
the same global batch at the same step; each process feeds only its own rows. Process 0 writes
DIR/result.npz: the losses of the steps it ran, the step reached and every weight.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

GLOBAL_BATCH, SEQ_LEN, VOCAB = 8, 16, 64
MODEL = {"model_type": "gpt2", "vocab_size": VOCAB, "n_embd": 32, "n_layer": 2, "n_head": 2,
         "n_positions": SEQ_LEN, "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}


def train_cfg(steps: int):
    return SimpleNamespace(learning_rate=1e-2, warmup_steps=3, steps=steps, weight_decay=0.01,
                           max_grad_norm=1.0, optimizer="adamw", bf16=False, seed=7)


def global_rows(step: int) -> np.ndarray:
    """Counting sequences from random starts: something a tiny model learns in a few steps."""
    starts = np.random.default_rng(1000 + step).integers(0, VOCAB, (GLOBAL_BATCH, 1))
    return ((starts + np.arange(SEQ_LEN)) % VOCAB).astype(np.int32)


def local_batch(step: int, process_id: int, num_processes: int) -> dict[str, np.ndarray]:
    rows = GLOBAL_BATCH // num_processes
    ids = global_rows(step)[process_id * rows:(process_id + 1) * rows]
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids}


def hang_before_commit(step: int, marker: Path) -> None:
    """Make the save of `step` stop when its data are written but not committed (Orbax renames
    the temporary folder last): the worst moment for a crash. Says so in `marker`."""
    import time

    from orbax.checkpoint._src.path import atomicity

    commit = atomicity.AtomicRenameTemporaryPath.finalize

    async def finalize(self):
        if self._final_path.name == str(step):
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(str(self.get()))
            time.sleep(3600)
        await commit(self)

    atomicity.AtomicRenameTemporaryPath.finalize = finalize


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--num-processes", type=int, default=1)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--fsdp", type=int, default=1)
    parser.add_argument("--checkpoints", type=str)
    parser.add_argument("--save-every", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--stop-after", type=int, default=0, help="leave after this many steps")
    parser.add_argument("--hang-in-save", type=int, default=0,
                        help="at this step's save, stop just before its commit (to be killed)")
    parser.add_argument("--late", type=float, default=0,
                        help="process 1 reaches the first step this many seconds late")
    args = parser.parse_args()

    from payload.engines.jax.distributed import join, meet

    join(coordinator=f"127.0.0.1:{args.port}", num_processes=args.num_processes,
         process_id=args.process_id)

    import jax
    from jax.experimental import multihost_utils

    from payload.core.fit.sharding import ShardingPlan
    from payload.engines.jax import step as jax_step
    from payload.engines.jax.models import state_dict

    if args.hang_in_save:
        hang_before_commit(args.hang_in_save, args.out / "saving")
    devices = len(jax.devices())
    plan = ShardingPlan(data=devices // args.fsdp, fsdp=args.fsdp,
                                 state_bytes_per_chip=0, hbm_bytes_per_chip=0)
    cfg = train_cfg(args.steps)
    # Under FSDP every parameter the group divides is split, however small, so that a tiny
    # model exercises the sharded path.
    program = jax_step.TrainProgram(MODEL, family="gpt2", train_cfg=cfg,
                                    mesh=jax_step.make_mesh(plan), min_sharded_elements=1)
    sharded = sum(s.spec != jax_step.P() for s in jax.tree.leaves(program.param_sharding))
    state = program.init_state(seed=cfg.seed)
    manager = None
    meet("start")  # before a restore's first collective
    if args.checkpoints:
        from payload.engines.jax.checkpoints import Checkpoints

        manager = Checkpoints(args.checkpoints)
        if args.resume:
            state = manager.restore_latest(program.abstract_state())
    losses = []
    start = int(state.step)
    # Compiled ahead, then met: the processes' first collective starts together however long
    # each compiled (payload.engines.jax.distributed.meet).
    first = program.global_batch(local_batch(start, args.process_id, args.num_processes))
    train_step = program.train_step.lower(state, first).compile()
    if args.process_id == 1:
        time.sleep(args.late)
    meet("first-step")
    for step in range(start, args.steps):
        batch = program.global_batch(local_batch(step, args.process_id, args.num_processes))
        state, metrics = train_step(state, batch)
        losses.append(float(metrics["loss"]))
        done = step + 1
        if manager and args.save_every and done % args.save_every == 0:
            manager.save(state)
        if args.stop_after and done - start >= args.stop_after:
            break
    if manager:
        manager.close()
    params = multihost_utils.process_allgather(state.params, tiled=True)
    if args.process_id == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        weights = {f"w:{k}": v for k, v in state_dict(params).items()}
        np.savez(args.out / "result.npz", losses=np.array(losses), step=int(state.step),
                 start=start, sharded=sharded, **weights)


if __name__ == "__main__":
    main()
