"""The JAX engine's own models: the same logits as PyTorch transformers 5.x from the same weights,
every published size builds, the first loss is where a fresh model's should be, and neither
engine drags in the other's framework."""

import json
import math
import subprocess

import numpy as np
import pytest

pytest.importorskip("flax")

from payload.core.errors import UserError
from payload.core.sizes import SIZES, parameter_count
from tests.support.jax import SMALL, architecture, model_inputs
from tests.support.paths import SCRIPTS, TORCH_PYTHON, TORCH_READY
from tests.support.runners import run_python

# Shape keys give T5 in its original form (ReLU, tied head, scaled output); the sizes give
# v1.1 (gated GELU, untied head, 64-wide heads): both are checked.
PARITY = {
    "bert": architecture("bert", vocab_size=96, **SMALL),
    "roberta": architecture("roberta", vocab_size=96, **SMALL),
    "gpt2": architecture("gpt2", vocab_size=96, **SMALL),
    "t5": architecture("t5", vocab_size=96, **SMALL),
    "t5-v1.1": {**architecture("t5", vocab_size=96, **SMALL), "d_kv": 16,
                "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False},
    # Grouped-query attention (2 key/value heads for 4), tied; multi-query (1), untied, another
    # rotary base, written as transformers 5.x writes it.
    "llama": architecture("llama", vocab_size=96, **SMALL, num_kv_heads=2),
    "llama-mqa": {**{k: v for k, v in architecture(
        "llama", vocab_size=96, **SMALL, num_kv_heads=1, tie_embeddings=False).items()
        if k != "rope_theta"}, "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}},
}


@pytest.fixture(scope="module")
def jax_and_torch_logits(tmp_path_factory):
    """Per variant: random weights in JAX, saved as a PyTorch-named model folder, and the
    logits of both frameworks for the same padded inputs (one torch process for all)."""
    if not TORCH_READY.exists():
        pytest.skip("no transformers 5.x environment (.venv-torch; `make setup-torch`)")
    from safetensors.numpy import save_file

    from payload.engines.jax.models import build_model, load_state_dict, state_dict

    root = tmp_path_factory.mktemp("parity")
    rng = np.random.default_rng(0)
    jobs, jax_logits = [], {}
    for name, raw in PARITY.items():
        model = build_model(raw, seed=1)
        # Every parameter moved off its initial value (unit norms, zero biases, zero padding
        # rows), so a weight read from the wrong place cannot go unnoticed.
        load_state_dict(model, {k: v + rng.normal(0.0, 0.05, v.shape).astype(np.float32)
                                for k, v in state_dict(model).items()})
        folder = root / name
        folder.mkdir()
        save_file(state_dict(model), str(folder / "model.safetensors"),
                  metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(raw), encoding="utf-8")
        inputs = model_inputs(raw, rng)
        np.savez(root / f"{name}-inputs.npz", **inputs)
        jax_logits[name] = np.asarray(model(**inputs))
        jobs.append({"folder": str(folder), "family": raw["model_type"],
                     "inputs": str(root / f"{name}-inputs.npz"),
                     "output": str(root / f"{name}-torch.npy")})
    (root / "jobs.json").write_text(json.dumps(jobs), encoding="utf-8")
    result = subprocess.run(
        [str(TORCH_PYTHON), str(SCRIPTS / "torch_forward.py"),
         str(root / "jobs.json")],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["transformers"].startswith("5."), report
    torch_logits = {name: np.load(root / f"{name}-torch.npy") for name in PARITY}
    return jax_logits, torch_logits


@pytest.mark.torch
@pytest.mark.parametrize("name", list(PARITY))
def test_logits_match_pytorch_transformers_5_from_the_same_weights(jax_and_torch_logits, name):
    jax_logits, torch_logits = jax_and_torch_logits
    ours, theirs = jax_logits[name], torch_logits[name]
    assert ours.shape == theirs.shape
    assert ours.dtype == np.float32
    assert np.abs(theirs).max() > 0.1  # logits of some size, not a degenerate near-zero model
    # Padded positions too: both frameworks compute them, from the same masks.
    difference = float(np.abs(ours - theirs).max())
    print(f"{name}: max |jax - torch| = {difference:.1e} (logits up to {np.abs(theirs).max():.1f})")
    assert difference <= 1e-4


@pytest.mark.parametrize(("family", "size"),
                         [(f, s) for f, sizes in SIZES.items() for s in sizes])
def test_every_published_size_builds_with_the_parameters_it_should_have(family, size):
    from payload.engines.jax.models import parameter_shapes

    raw = architecture(family, vocab_size=32000, seq_len=512, size=size)
    shapes = parameter_shapes(raw)
    # payload.core.sizes counts what transformers' save_pretrained writes, checked against the
    # real models elsewhere: the same total, and so the same tensors, here.
    assert sum(math.prod(s.shape) for s in shapes.values()) == parameter_count(raw)
    assert all(s.dtype == np.float32 for s in shapes.values())


def _cross_entropy(logits, labels) -> float:
    import jax

    logp = jax.nn.log_softmax(logits, axis=-1)
    return float(-np.take_along_axis(np.asarray(logp), labels[..., None], axis=-1).mean())


@pytest.mark.parametrize("family", ["bert", "roberta", "gpt2", "t5", "llama"])
def test_initial_loss_is_near_ln_vocab(family):
    """A fresh model guesses: its loss on any tokens starts near ln(vocab). T5 v1.1's untied
    head drawn at transformers' std 1.0 would start near 100 here."""
    from payload.engines.jax.models import build_model

    vocab = 8000
    raw = architecture(family, vocab_size=vocab, size="tiny")
    model = build_model(raw, seed=0)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, vocab, (4, 64))
    if family in ("bert", "roberta"):
        positions = np.stack([rng.choice(64, 10, replace=False) for _ in range(4)])
        labels = rng.integers(5, vocab, positions.shape)
        logits = model(ids, np.ones_like(ids), positions=positions)
    elif family in ("gpt2", "llama"):
        logits, labels = model(ids, np.ones_like(ids))[:, :-1], ids[:, 1:]
    else:
        labels = rng.integers(5, vocab, (4, 16))
        decoder_ids = np.concatenate([np.zeros((4, 1), np.int64), labels[:, :-1]], axis=1)
        logits = model(ids, np.ones_like(ids), decoder_ids)
    assert abs(_cross_entropy(logits, labels) - math.log(vocab)) <= 1.5


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_masked_lm_head_at_positions_is_the_full_head_at_those_positions(family):
    from payload.engines.jax.models import build_model

    model = build_model(PARITY[family], seed=0)
    rng = np.random.default_rng(1)
    ids = rng.integers(5, 96, (2, 12))
    positions = np.array([[0, 3, 11], [5, 5, 2]])
    full = np.asarray(model(ids, np.ones_like(ids)))
    picked = np.asarray(model(ids, np.ones_like(ids), positions=positions))
    assert picked.shape == (2, 3, 96)
    np.testing.assert_allclose(picked, np.take_along_axis(full, positions[..., None], axis=1),
                               atol=1e-6)


def test_dropout_only_with_a_key_and_the_same_key_gives_the_same_output():
    import jax

    from payload.engines.jax.models import build_model

    model = build_model(PARITY["gpt2"], seed=0)
    ids = np.random.default_rng(2).integers(5, 96, (2, 12))
    plain = np.asarray(model(ids))
    np.testing.assert_array_equal(plain, np.asarray(model(ids)))
    key = jax.random.key(3)
    dropped = np.asarray(model(ids, dropout_rng=key))
    assert np.abs(dropped - plain).max() > 1e-3
    np.testing.assert_array_equal(dropped, np.asarray(model(ids, dropout_rng=key)))


def test_bfloat16_compute_keeps_float32_parameters_and_logits_close_to_float32():
    import jax.numpy as jnp
    from flax import nnx

    from payload.engines.jax.models import build_model, state_dict

    raw = PARITY["t5-v1.1"]
    exact, fast = build_model(raw, seed=0), build_model(raw, seed=0, dtype=jnp.bfloat16)
    ids = np.random.default_rng(4).integers(5, 96, (2, 12))
    reference, logits = exact(ids, None, ids[:, :5]), fast(ids, None, ids[:, :5])
    assert logits.dtype == jnp.float32
    # bfloat16 keeps ~3 significant digits: close, not equal.
    assert 0 < float(jnp.abs(logits - reference).max()) <= 0.03 * float(jnp.abs(reference).max())
    # A train step holds the parameters split from the model: the same names and values.
    _, params = nnx.split(fast, nnx.Param)
    tensors = state_dict(params)
    assert {t.dtype for t in tensors.values()} == {np.dtype(np.float32)}
    assert all(np.array_equal(tensors[k], v) for k, v in state_dict(exact).items())


def test_state_dict_goes_back_and_a_mismatched_one_is_refused_untouched():
    from payload.engines.jax.models import build_model, load_state_dict, state_dict

    model = build_model(PARITY["bert"], seed=0)
    before = state_dict(model)
    # A checkpoint written with its tied decoder and buffers loads; they are not parameters.
    other = state_dict(build_model(PARITY["bert"], seed=1))
    with_tied = {**other, "cls.predictions.decoder.weight": other[
        "bert.embeddings.word_embeddings.weight"], "bert.embeddings.position_ids": np.arange(64)}
    load_state_dict(model, with_tied)
    assert all(np.array_equal(state_dict(model)[k], other[k]) for k in other)
    load_state_dict(model, before)
    broken = dict(other)
    del broken["cls.predictions.bias"]
    broken["bert.encoder.layer.0.output.dense.weight"] = np.zeros((3, 3), np.float32)
    broken["bert.pooler.typo.weight"] = np.zeros(3, np.float32)
    with pytest.raises(UserError) as caught:
        load_state_dict(model, broken)
    message = str(caught.value)
    assert "missing: cls.predictions.bias" in message
    assert "wrong shape: bert.encoder.layer.0.output.dense.weight (3, 3)" in message
    assert "\n" not in message
    assert all(np.array_equal(state_dict(model)[k], before[k]) for k in before)


def test_the_jax_engine_does_not_import_tensorflow():
    loaded = run_python(
        "import sys\n"
        "import numpy as np\n"
        "from payload.engines.jax.models import build_model\n"
        "import payload.engines.jax.step, payload.engines.jax.checkpoints\n"
        "model = build_model({'model_type': 't5', 'vocab_size': 50, 'd_model': 8, 'd_kv': 4,"
        " 'd_ff': 16, 'num_layers': 1, 'num_heads': 2})\n"
        "model(np.array([[5, 6, 7]]), None, np.array([[0, 5]]))\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'tf_keras',"
        " 'keras', 'torch'}))\n")
    assert loaded == "[]"


def test_the_tensorflow_engine_does_not_import_the_jax_engine_or_start_jax():
    """TensorFlow itself imports `jax` when it is installed (tf.lite's util.py tries
    `from jax import jit`), so jax being in sys.modules says nothing; what must not happen is
    the TF engine loading the JAX models, Flax, or a JAX backend, which on a TPU host would
    take the chips from TensorFlow."""
    loaded = run_python(
        "import sys\n"
        "from payload.config import ModelConfig\n"
        "from payload.engines.tensorflow.model import build_model\n"
        "from payload.training.model import TokenIds, model_config\n"
        "import payload.stages.train\n"
        "cfg = ModelConfig(family='gpt2', hidden_size=16, num_layers=1, num_heads=2,"
        " intermediate_size=32)\n"
        "vocab = TokenIds(vocab_size=64, special=(0, 1, 2), pad=0, unk=1, eos=2)\n"
        "build_model(model_config(cfg, vocab=vocab, seq_len=16))\n"
        "started = 'jax' in sys.modules and"
        " sys.modules['jax._src.xla_bridge'].backends_are_initialized()\n"
        "print(sorted({m for m in sys.modules if m.split('.')[0] in ('flax', 'optax')"
        " or m.startswith('payload.engines.jax')}), started)\n")
    assert loaded == "[] False"
