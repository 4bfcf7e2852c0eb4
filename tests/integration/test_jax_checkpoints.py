"""The JAX engine's Orbax checkpoints: the train state with its step inside; a process killed
mid-save leaves the previous checkpoint the latest; restore and continue ends with the weights
of an uninterrupted run, variable for variable."""

import signal
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("orbax.checkpoint")

import jax

from payload.core.errors import UserError
from payload.engines.jax.checkpoints import Checkpoints
from tests.support.jax import JAX_WORKER, tiny_program, worker_env

STEPS = 6


def test_save_and_restore_keep_the_step_and_every_array(tmp_path):
    program = tiny_program()
    state = program.init_state(seed=0)
    ids = np.arange(16, dtype=np.int32).reshape(2, 8) % 32
    for _ in range(3):
        state, _ = program.train_step(state, program.global_batch(
            {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids}))
    ckpts = Checkpoints(str(tmp_path / "ckpt"))
    with pytest.raises(UserError, match="no checkpoint to resume from"):
        ckpts.restore_latest(program.abstract_state())
    assert ckpts.save(state) == 3
    ckpts.close()
    restored = Checkpoints(str(tmp_path / "ckpt")).restore_latest(program.abstract_state())
    assert int(restored.step) == 3  # the optimizer's count came back with it
    saved, back = jax.tree.leaves(state), jax.tree.leaves(restored)
    assert len(saved) == len(back)
    for a, b in zip(saved, back, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert b.sharding == a.sharding


def run_worker(out, ckpt, *extra) -> dict:
    subprocess.run([sys.executable, str(JAX_WORKER), "--out", str(out), "--steps", str(STEPS),
                    "--checkpoints", str(ckpt), "--save-every", "2", *extra],
                   env=worker_env(1), check=True, timeout=240, capture_output=True)
    with np.load(out / "result.npz") as result:
        return dict(result)


# Three worker processes one after another: minutes of wall time on a shared 2-core machine.
@pytest.mark.slow
def test_killed_mid_save_then_resumed_ends_as_an_uninterrupted_run(tmp_path):
    whole = run_worker(tmp_path / "whole", tmp_path / "ckpt-whole")
    assert int(whole["step"]) == STEPS

    crashed, ckpt = tmp_path / "crashed", tmp_path / "ckpt"
    proc = subprocess.Popen([sys.executable, str(JAX_WORKER), "--out", str(crashed), "--steps",
                             str(STEPS), "--checkpoints", str(ckpt), "--save-every", "2",
                             "--hang-in-save", "4"],
                            env=worker_env(1), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not (crashed / "saving").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "never reached the save"
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)  # step 4's data are written, its commit is not
    finally:
        proc.kill()
        proc.wait()
    assert any(".orbax-checkpoint-tmp" in p.name for p in ckpt.iterdir())
    assert Checkpoints(str(ckpt)).steps() == [2]

    resumed = run_worker(tmp_path / "resumed", ckpt, "--resume")
    assert (int(resumed["start"]), int(resumed["step"])) == (2, STEPS)
    np.testing.assert_array_equal(resumed["losses"], whole["losses"][2:])
    names = sorted(k for k in whole if k.startswith("w:"))
    assert names == sorted(k for k in resumed if k.startswith("w:"))
    for name in names:
        np.testing.assert_array_equal(resumed[name], whole[name], err_msg=name)
    assert Checkpoints(str(ckpt)).steps() == [2, 4, 6]
