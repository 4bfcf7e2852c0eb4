"""The JAX engine's start-up: fresh weights drawn on the host and placed (no whole-model
compile), the same for a seed every time, each leaf its own buffer; the training step compiled
ahead through a persistent compilation cache in output_dir, which a resumed run loads from,
with the compile in metrics.json and said when it ends."""

import json

import numpy as np
import pytest

pytest.importorskip("optax")

import jax

from payload.training import progress
from tests.support.jax import startup_program as program


def test_fresh_weights_are_the_models_own_for_the_seed_every_time(tmp_path):
    from payload.engines.jax.models import build_model, state_dict

    raw, prog = program(tmp_path)
    first, again = prog.init_state(seed=3), prog.init_state(seed=3)
    want = state_dict(build_model(raw, seed=3))  # what the model's own init draws
    got = state_dict(first.params)
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(state_dict(prog.init_state(seed=4).params)[name], want[name])
    # Placed where the program's shardings say, every leaf its own buffer (Adam's two zero
    # moments included), so the step can donate the whole state.
    for leaf, sharding in zip(jax.tree.leaves(first), jax.tree.leaves(prog.state_sharding),
                              strict=True):
        assert leaf.sharding == sharding
    pointers = [leaf.unsafe_buffer_pointer() for leaf in jax.tree.leaves(first)
                if leaf.size > 1]
    assert len(set(pointers)) == len(pointers)
    ids = np.random.default_rng(0).integers(0, 64, (4, 16)).astype(np.int32)
    batch = prog.global_batch({"input_ids": ids, "attention_mask": np.ones_like(ids),
                               "labels": ids})
    state, metrics = prog.train_step(first, batch)
    state, metrics = prog.train_step(state, batch)  # the donated state came back usable
    assert int(state.step) == 2 and np.isfinite(float(metrics["loss"]))


def test_compile_ahead_stores_the_step_and_a_fresh_process_loads_it(tmp_path):
    """The cache in two processes: the second compiles nothing, it loads."""
    import subprocess
    import sys

    from tests.support.runners import payload_env

    script = (
        "import json, sys, jax, numpy as np\n"
        "from tests.support.jax import startup_program as program\n"
        "from payload.engines.jax.cache import compile_ahead, use_compilation_cache\n"
        "from pathlib import Path\n"
        "use_compilation_cache(sys.argv[1])\n"
        "_, prog = program(Path(sys.argv[1]))\n"
        "state = prog.init_state(seed=0)\n"
        "ids = np.zeros((4, 16), np.int32)\n"
        "batch = prog.global_batch({'input_ids': ids, 'attention_mask': ids + 1,"
        " 'labels': ids})\n"
        "compiled, report = compile_ahead(prog.train_step, state, batch)\n"
        "state, metrics = compiled(state, batch)\n"
        "print(json.dumps(report))\n")
    cache = tmp_path / "cache"
    reports = []
    for _ in range(2):
        result = subprocess.run([sys.executable, "-c", script, str(cache)], env=payload_env(),
                                capture_output=True, text=True, timeout=300, check=False)
        assert result.returncode == 0, result.stderr[-3000:]
        reports.append(json.loads(result.stdout.strip().splitlines()[-1]))
    assert [r["cache"] for r in reports] == ["miss", "hit"], reports
    assert any(cache.iterdir())


def test_the_environments_cache_wins_over_the_runs_own(monkeypatch):
    from payload.engines.jax.cache import cache_folder

    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    assert cache_folder("gs://b/run") == "gs://b/run/.tpuctl/jax-cache"
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/shared/jax")
    assert cache_folder("gs://b/run") == "/shared/jax"


def test_a_resumed_local_jax_run_loads_its_step_from_the_cache(tmp_path):
    """Stopped after its first step (train.max_hours, a stand-in for a preemption), then
    resumed with the same settings: the step comes from the cache the first run filled. (A
    resume that changes what the step computes, such as train.steps, which the schedule holds,
    compiles anew.)"""
    from payload.core import layout
    from tests.support.jax import jax_config
    from tests.support.jax import train_stage as train
    from tests.support.runners import payload_env
    from tests.support.runs import prepared_run

    out = prepared_run(tmp_path, "gpt2")
    settings = dict(steps=6, checkpoint_every=3, eval_every=3)
    # The run's own cache, not one a test suite may name for all its processes.
    env = {k: v for k, v in payload_env().items() if k != "JAX_COMPILATION_CACHE_DIR"}
    first = train(jax_config(out, "gpt2", max_hours=1e-9, **settings), env=env)
    assert "stopping at step 1 of 6" in first.stdout
    cache = out / layout.OWN_DIR / layout.JAX_CACHE
    stored = {p.name for p in cache.iterdir()}
    assert stored
    resumed = train(jax_config(out, "gpt2", **settings), "--resume", env=env)
    metrics = json.loads((out / "metrics.json").read_text())
    assert [(c["step"], c["cache"]) for c in metrics["compiles"]] == [(0, "miss"), (1, "hit")]
    assert all(c["compile_s"] >= 0 for c in metrics["compiles"])
    assert metrics["final"]["step"] == 6
    assert stored <= {p.name for p in cache.iterdir()}  # what the first run stored is still there
    # The live view's records: when compiling ends, and the first step after it.
    for output, said in ((first.stdout, "compiled and cached for a resume"),
                         (resumed.stdout, "loaded from the compilation cache")):
        records = [r for r in map(progress.parse, output.splitlines()) if r]
        kinds = [r["kind"] for r in records]
        assert kinds.index("start") < kinds.index("compiled") < kinds.index("train")
        compiled = records[kinds.index("compiled")]
        assert said in progress.describe(compiled)
        first_train = records[kinds.index("train")]
        assert first_train["compile_s"] == compiled["compile_s"]
        assert "of compiling" in progress.describe(first_train)
