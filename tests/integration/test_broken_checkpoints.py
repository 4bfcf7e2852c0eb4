"""A checkpoint that cannot be restored (issue 27, item 5): a resume or an export that meets a
broken newest step (truncated files, another model's arrays) says in one line which step is
broken, which older one is intact and how to go back to it, and leaves every file as it was;
moving the broken step away, as the line says, makes the next resume continue from the intact
one. Real Orbax and TensorFlow checkpoints of tiny states."""

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from payload.core import folders
from payload.core.errors import UserError
from tests.support.broken_checkpoints import array_files, tree, truncate

# --- the JAX engine: Orbax step folders ----------------------------------------------------

@pytest.fixture(scope="module")
def jax_parts():
    pytest.importorskip("orbax.checkpoint")
    from payload.engines.jax.checkpoints import Checkpoints
    from tests.support.jax import tiny_program

    return Checkpoints, tiny_program


def trained(program, steps: int):
    state = program.init_state(seed=0)
    ids = np.arange(16, dtype=np.int32).reshape(2, 8) % 32
    for _ in range(steps):
        state, _ = program.train_step(state, program.global_batch(
            {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids}))
    return state


def orbax_steps(jax_parts, directory: Path, programs) -> None:
    """One checkpoint per program, at steps 2, 4, ...: each the state of its own program."""
    checkpoints, _ = jax_parts
    for i, program in enumerate(programs, start=1):
        ckpts = checkpoints(str(directory))
        ckpts.save(trained(program, 2 * i))
        ckpts.close()


def biggest_array_file(step: Path) -> Path:
    return max(array_files(step), key=lambda p: p.stat().st_size)


def restore_error(jax_parts, directory: Path, program) -> str:
    checkpoints, _ = jax_parts
    ckpts = checkpoints(str(directory))
    try:
        with pytest.raises(UserError) as info:
            ckpts.restore_latest(program.abstract_state())
    finally:
        ckpts.close()
    line = str(info.value)
    assert "\n" not in line and "Traceback" not in line
    return line


def test_a_resume_onto_a_truncated_orbax_step_names_it_and_the_intact_one(jax_parts, tmp_path):
    checkpoints, tiny_program = jax_parts
    program = tiny_program()
    ckpt = tmp_path / "checkpoints"
    orbax_steps(jax_parts, ckpt, [program, program])
    truncate(biggest_array_file(ckpt / "4"))
    before = tree(tmp_path)
    line = restore_error(jax_parts, ckpt, program)
    for needle in ("--resume", "step 4", "cannot be restored", "truncated or unreadable",
                   "step 2 is intact", f"move {ckpt / '4'} out of {ckpt}", "--overwrite"):
        assert needle in line, f"{needle!r} not in {line!r}"
    assert tree(tmp_path) == before  # the broken step is the user's: nothing moved or deleted
    # What the line says to do works: with step 4 set aside, the resume continues from step 2.
    shutil.move(ckpt / "4", tmp_path / "broken-step-4")
    ckpts = checkpoints(str(ckpt))
    try:
        assert int(ckpts.restore_latest(program.abstract_state()).step) == 2
    finally:
        ckpts.close()


def test_a_resume_onto_an_orbax_step_of_another_shape_names_both_shapes(jax_parts, tmp_path):
    _, tiny_program = jax_parts
    program = tiny_program()
    ckpt = tmp_path / "checkpoints"
    # Step 4 holds another run's state: the same model twice as wide.
    orbax_steps(jax_parts, ckpt, [program, tiny_program(n_embd=32)])
    before = tree(tmp_path)
    line = restore_error(jax_parts, ckpt, program)
    for needle in ("step 4", "another shape than this run's model", "step 2 is intact"):
        assert needle in line, f"{needle!r} not in {line!r}"
    assert tree(tmp_path) == before


def test_no_intact_orbax_step_says_so(jax_parts, tmp_path):
    _, tiny_program = jax_parts
    program = tiny_program()
    ckpt = tmp_path / "checkpoints"
    orbax_steps(jax_parts, ckpt, [program, program])
    for step in ("2", "4"):
        truncate(biggest_array_file(ckpt / step))
    line = restore_error(jax_parts, ckpt, program)
    assert "step 4" in line and "no older one can" in line and "--overwrite" in line, line
    assert "is intact" not in line


# --- the TensorFlow engine: CheckpointManager files -----------------------------------------

@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


def tf_run(tf, output_dir: Path, shapes: list[tuple[int, int]]) -> None:
    """Checkpoints ckpt-2, ckpt-4, ... of a state holding one variable of each given shape, in a
    complete checkpoints folder, as the TF engine writes them."""
    from payload.engines.tensorflow.checkpoints import Checkpoints

    for i, shape in enumerate(shapes, start=1):
        ckpts = Checkpoints(str(output_dir), model=tf.Module(), optimizer=tf.Module(), keep=3,
                            is_chief=True, resume=False)
        ckpts.checkpoint.model.w = tf.Variable(tf.fill(shape, float(i)))
        ckpts.checkpoint.optimizer.iterations = tf.Variable(2 * i, dtype=tf.int64)
        ckpts.save(2 * i)
        ckpts.close()
    folders.mark_complete(str(output_dir / "checkpoints"), {})


def tf_resume(tf, output_dir: Path, shape=(4, 4)):
    """A resume's restore into a fresh state; returns (restored?, the step it holds)."""
    from payload.engines.tensorflow.checkpoints import Checkpoints

    model, optimizer = tf.Module(), tf.Module()
    model.w = tf.Variable(tf.zeros(shape))
    optimizer.iterations = tf.Variable(0, dtype=tf.int64)
    ckpts = Checkpoints(str(output_dir), model=model, optimizer=optimizer, keep=3,
                        is_chief=True, resume=True)
    try:
        return ckpts.restore_latest(), int(optimizer.iterations.numpy())
    finally:
        ckpts.close()


@pytest.mark.parametrize("damage", ["truncated", "other-shape"])
def test_a_resume_onto_a_broken_tensorflow_checkpoint_names_it_and_the_intact_one(
        tf, tmp_path, damage):
    from payload.core.engines import engine_spec

    out = tmp_path / "out"
    tf_run(tf, out, [(4, 4), (8, 4) if damage == "other-shape" else (4, 4)])
    ckpt = out / "checkpoints"
    if damage == "truncated":
        truncate(next(ckpt.glob("ckpt-4.data-*")))
    before = tree(tmp_path)
    with pytest.raises(UserError) as info:
        tf_resume(tf, out)
    line = str(info.value)
    why = ("truncated or unreadable" if damage == "truncated"
           else "another shape than this run's model: (8, 4) where the model has (4, 4)")
    for needle in ("--resume", "ckpt-4", "cannot be restored", why, "ckpt-2 is intact",
                   "move ckpt-4.index and ckpt-4.data-* out of"):
        assert needle in line, f"{needle!r} not in {line!r}"
    assert tree(tmp_path) == before
    # Moving ckpt-4's files away, as the line says, is enough: the next resume takes ckpt-2.
    aside = tmp_path / "aside"
    aside.mkdir()
    for path in ckpt.glob("ckpt-4.*"):
        shutil.move(path, aside / path.name)
    assert engine_spec("tensorflow").newest_step(str(out)) == 2
    assert tf_resume(tf, out) == (True, 2)


def test_a_tensorflow_resume_whose_files_are_gone_never_starts_from_zero(tf, tmp_path):
    """The index names checkpoints whose files are all gone: a resume used to find none
    (tf.train.latest_checkpoint gives None) and train from step 0 as if fresh."""
    out = tmp_path / "out"
    tf_run(tf, out, [(4, 4), (4, 4)])
    for path in (out / "checkpoints").glob("ckpt-*"):
        os.remove(path)
    with pytest.raises(UserError) as info:
        tf_resume(tf, out)
    line = str(info.value)
    assert "ckpt-4" in line and "missing" in line and "no older one can" in line, line


def stderr_lines(proc) -> list[str]:
    """What the launcher's view shows of a stage's stderr (less the libraries' start-up notes
    of every healthy run: launcher.view.NOISE)."""
    from launcher.view import shown_lines

    return [line for line in shown_lines(proc.stderr.splitlines()) if line.strip()]


# --- through the stages: `python -m payload train --resume` and `export` -------------------

def test_the_stages_meet_a_truncated_step_with_one_line_and_write_nothing(tmp_path):
    """A tiny JAX run with steps 2 and 4, step 4 truncated: the resumed train stage and the
    export each end with the one line (exit 2, no traceback, no teardown noise) and leave
    output_dir as it was (no TensorBoard file of the failed attempt either)."""
    pytest.importorskip("optax")
    pytest.importorskip("tensorflow")

    from tests.support.runners import assert_user_error
    from tests.support.runs import config_beside, run_stage, trained_run

    out = trained_run(tmp_path, "gpt2", engine="jax", steps=4, checkpoint_every=2,
                      eval_every=2)
    config = config_beside(out)
    step = out / "checkpoints" / "4"
    # Every array file of the step: the export restores the weights alone, and the largest
    # file may hold only the optimizer's moments (equal sizes tie in the folder's order).
    for data in array_files(step):
        truncate(data)
    before = tree(tmp_path)
    for stage, args in (("train", ("--resume",)), ("export", ())):
        proc = run_stage(stage, config, *args)
        line = assert_user_error(proc, "step 4", "cannot be restored", "step 2 is intact",
                                 f"move {step} out")
        assert line.startswith("error: --resume" if stage == "train" else "error: export"), line
        assert stderr_lines(proc) == [line], proc.stderr  # nothing of the reads left in flight
        assert tree(tmp_path) == before, f"{stage} changed output_dir"



def test_the_preflight_restores_the_whole_state_and_says_the_one_line(tmp_path):
    """Issue 38 item 4: what the launcher runs on worker 0 before a job (`python -m payload
    check`) meets a truncated newest step with the train stage's one line, exit 2, nothing
    written; truncating only the file of the optimizer's moments (which an export would not
    read) is met too, since a resume restores the whole state."""
    pytest.importorskip("optax")

    from tests.support.runners import assert_user_error
    from tests.support.runs import config_beside, run_stage, trained_run

    out = trained_run(tmp_path, "gpt2", engine="jax", steps=4, checkpoint_every=2,
                      eval_every=2)
    config = config_beside(out)
    assert run_stage("check", config, "--stages", "train,export", "--resume").returncode == 0
    step = out / "checkpoints" / "4"
    for data in array_files(step):
        truncate(data)
    before = tree(tmp_path)
    for stages, flags, doing in (("train,export", ("--resume",), "--resume"),
                                 ("export", (), "export")):
        proc = run_stage("check", config, "--stages", stages, *flags)
        line = assert_user_error(proc, "step 4", "cannot be restored", "step 2 is intact")
        assert line.startswith(f"error: {doing}"), line
        assert stderr_lines(proc) == [line], proc.stderr
        assert tree(tmp_path) == before
