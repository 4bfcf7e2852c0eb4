"""The JAX engine's export: checkpoints of tiny models trained with the JAX train program become
the same model/ folder the TF engine writes. In PyTorch transformers 5.x, GPT-2 and T5
`generate(**tokenizer(prompt))` equals a greedy decode with the JAX model, and BERT/RoBERTa
`pipeline("fill-mask")` gives the JAX model's top 5; in TensorFlow (transformers 4.x) the folder
loads with the JAX model's logits. `model.init_from` reads such a folder, and one the TF engine
exported, back into the JAX models with PyTorch's logits."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("orbax.checkpoint")
pytest.importorskip("tensorflow")

import jax
from flax import nnx

from payload.config import parse_config
from payload.core import layout
from payload.core.errors import UserError
from payload.core.fit.sharding import plan_sharding
from payload.engines.jax import step as jax_step
from payload.engines.jax.checkpoints import Checkpoints
from payload.stages.export import run_export
from payload.training import checkpoints
from tests.support.configs import training_config
from tests.support.jax import reader_batches
from tests.support.paths import SCRIPTS, TORCH_PYTHON, TORCH_READY
from tests.support.runs import prepared_run

NEW_TOKENS = 12  # as tests/torch_usage.py generates
PROMPTS = {
    "gpt2": ["The interpreter reads the module and", "Return a list of the"],
    "t5": ["The interpreter <extra_id_0> the module and runs it.",
           "Return a <extra_id_0> of the <extra_id_1> in the dictionary."],
}
MASK_PROMPTS = ["The interpreter reads the {mask} and runs it.", "Return a list of the {mask}."]
TEXT = ["The interpreter reads the module and runs it.", "A list of numbers."]


def train_with_jax(out: Path, raw: dict):
    """What the JAX train stage does, in brief: run.json with engine jax, the train program over
    the TF engine's input pipeline, an Orbax checkpoint in checkpoints/. Returns (config, the
    trained model)."""
    from payload.training.inputs import check_inputs

    raw["train"]["engine"] = "jax"
    config = parse_config(raw)
    inputs = check_inputs(config)
    checkpoints.start_fresh(str(out), {**inputs.identity, "engine": "jax"})
    plan = plan_sharding(1, num_devices=len(jax.devices()), hbm_bytes_per_chip=1 << 30)
    program = jax_step.TrainProgram(inputs.hf_config.to_dict(), family=config.model.family,
                                    train_cfg=config.train, mesh=jax_step.make_mesh(plan))
    state = program.init_state(seed=config.train.seed)
    batches = reader_batches(config, inputs, "train")
    for _ in range(config.train.steps):
        state, metrics = program.train_step(state, program.global_batch(next(batches)))
    assert np.isfinite(float(metrics["loss"]))
    ckpts = Checkpoints(layout.checkpoints_dir(str(out)))
    ckpts.save(state)
    ckpts.close()
    return config, nnx.merge(program.graphdef, state.params)


def exported(tmp_path_factory, variant: str):
    family = variant.split("-")[0]
    out = prepared_run(tmp_path_factory.mktemp("jax-export"), family)
    raw = training_config(out, family, steps=60, batch_size=16, learning_rate=5e-3)
    raw["model"].update(hidden_size=64, intermediate_size=128)
    if variant == "t5-v1.1":  # a published size: gated GELU, the untied head
        raw["model"] = {"family": "t5", "size": "tiny", "dropout": 0.0}
        raw["train"]["steps"] = 30
    config, model = train_with_jax(out, raw)
    run_export(config)
    # The config beside output_dir, for the stage's own command line.
    (out.parent / "run.yaml").write_text(json.dumps(config.model_dump(mode="json")))
    return family, out / "model", model


@pytest.fixture(scope="module", params=["gpt2", "t5", pytest.param("t5-v1.1",
                                                                   marks=pytest.mark.slow)])
def generator(request, tmp_path_factory):
    return exported(tmp_path_factory, request.param)


# RoBERTa's JAX export in the slow tier: BERT's proves the masked-LM folder's point here (both
# families' JAX models are held to PyTorch's logits in test_jax_models.py).
@pytest.fixture(scope="module", params=["bert", pytest.param("roberta", marks=pytest.mark.slow)])
def filler(request, tmp_path_factory):
    return exported(tmp_path_factory, request.param)


def greedy(model, family: str, ids: list[int], *, eos: int, start: int | None) -> list[int]:
    """The JAX model's own greedy continuation: GPT-2's new tokens, or T5's decoded tokens from
    the decoder start on; stops after the end token, as generate does. Rows keep one width
    (right-padded; the models are causal where they grow), so the forward compiles once."""
    forward = nnx.jit(lambda m, *args: m(*args))
    if family == "gpt2":
        width, length, new = len(ids) + NEW_TOKENS, len(ids), []
        row = np.zeros((1, width), np.int32)
        row[0, :length] = ids
        for _ in range(NEW_TOKENS):
            mask = (np.arange(width) < length)[None].astype(np.int32)
            new.append(int(np.argmax(np.asarray(forward(model, row, mask)[0, length - 1]))))
            if new[-1] == eos or length == width:
                break
            row[0, length] = new[-1]
            length += 1
        return new
    encoder_ids = np.array([ids], dtype=np.int32)
    decoded = np.zeros((1, NEW_TOKENS + 1), np.int32)
    decoded[0, 0], length = start, 1
    for _ in range(NEW_TOKENS):
        logits = forward(model, encoder_ids, np.ones_like(encoder_ids), decoded)[0, length - 1]
        decoded[0, length] = int(np.argmax(np.asarray(logits)))
        length += 1
        if decoded[0, length - 1] == eos:
            break
    return decoded[0, :length].tolist()


def in_pytorch(folder: Path, family: str, prompts: list[str]) -> dict:
    if not TORCH_READY.exists():
        pytest.skip("no transformers 5.x environment (.venv-torch; `make setup-torch`)")
    result = subprocess.run(
        [str(TORCH_PYTHON), str(SCRIPTS / "torch_usage.py"), str(folder), family,
         *prompts], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["transformers"].startswith("5.") and not report["problems"], report
    return report


def test_the_folder_is_the_tf_engines(generator):
    from safetensors import safe_open

    family, folder, model = generator
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tf_model.h5", "tokenizer.json",
            layout.EXPORT_NOTE} <= names
    note = Path(json.loads((folder / layout.EXPORT_NOTE).read_text())["checkpoint"])
    assert note.parent == Path("checkpoints") and note.name.isdigit()  # Orbax's step, relative
    with safe_open(str(folder / "model.safetensors"), "np") as f:
        assert f.metadata() == {"format": "pt"}
        keys = set(f.keys())
        if family == "t5":
            assert {"shared.weight", "lm_head.weight", "encoder.embed_tokens.weight",
                    "decoder.embed_tokens.weight"} <= keys
            untied = model.lm_head is not None
            same = np.array_equal(f.get_tensor("lm_head.weight"), f.get_tensor("shared.weight"))
            assert same != untied
        else:
            assert "lm_head.weight" in keys
    assert json.loads((folder / "config.json").read_text())["architectures"] == [
        {"gpt2": "GPT2LMHeadModel", "t5": "T5ForConditionalGeneration"}[family]]


@pytest.mark.torch
def test_generate_in_pytorch_is_the_jax_models_greedy_decode(generator):
    import transformers

    family, folder, model = generator
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    settings = json.loads((folder / "config.json").read_text())
    ours = [greedy(model, family, tokenizer(prompt)["input_ids"], eos=settings["eos_token_id"],
                   start=settings.get("decoder_start_token_id")) for prompt in PROMPTS[family]]
    # A few dozen steps give repetitive continuations (GPT-2: one token over and over): this
    # checks the user's call (tokenizer inputs, end, padding and decoder-start ids) end to end;
    # the logits themselves are compared to 1e-4 by the init_from tests below.
    print(family, "greedy tokens:", ours)
    report = in_pytorch(folder, family, PROMPTS[family])
    assert report["inputs"] == ["attention_mask", "input_ids"]
    assert report["generated"] == ours


@pytest.mark.torch
def test_fill_mask_in_pytorch_gives_the_jax_models_top_5(filler):
    import transformers

    family, folder, model = filler
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    prompts = [p.format(mask=tokenizer.mask_token) for p in MASK_PROMPTS]
    report = in_pytorch(folder, family, prompts)
    for prompt, theirs in zip(prompts, report["fill_mask"], strict=True):
        ids = np.array([tokenizer(prompt)["input_ids"]], dtype=np.int32)
        where = int(np.flatnonzero(ids[0] == tokenizer.mask_token_id)[0])
        logits = np.asarray(model(ids, np.ones_like(ids)))[0, where]
        top = np.argsort(-logits)[:5]
        probabilities = np.asarray(jax.nn.softmax(logits))
        assert [t[0] for t in theirs] == top.tolist()
        np.testing.assert_allclose([t[2] for t in theirs], probabilities[top], atol=1e-4)


def assert_loads_in_tensorflow_with_the_same_logits(family, folder, model):
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    encoded = tokenizer(TEXT, padding="longest", return_tensors="np")
    ids, mask = encoded["input_ids"].astype(np.int32), encoded["attention_mask"]
    auto = {"bert": transformers.TFAutoModelForMaskedLM,
            "roberta": transformers.TFAutoModelForMaskedLM,
            "gpt2": transformers.TFAutoModelForCausalLM,
            "t5": transformers.TFAutoModelForSeq2SeqLM}[family]
    loaded = auto.from_pretrained(str(folder), use_safetensors=False)
    extra = {"decoder_input_ids": ids[:, :5]} if family == "t5" else {}
    theirs = loaded(input_ids=ids, attention_mask=mask, **extra).logits.numpy()
    ours = np.asarray(model(ids, mask, *extra.values()))
    np.testing.assert_allclose(theirs, ours, atol=1e-4, err_msg=family)


def test_a_generators_folder_loads_in_tensorflow_with_the_jax_models_logits(generator):
    assert_loads_in_tensorflow_with_the_same_logits(*generator)


def test_a_fillers_folder_loads_in_tensorflow_with_the_jax_models_logits(filler):
    assert_loads_in_tensorflow_with_the_same_logits(*filler)


@pytest.mark.parametrize("generator", ["gpt2"], indirect=True)  # the same run_export for all
def test_the_stages_command_line_writes_the_same_weights(generator):
    from tests.support.runs import run_stage

    _, folder, _ = generator
    before = (folder / "model.safetensors").read_bytes()
    result = run_stage("export", folder.parent.parent / "run.yaml")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (folder / "model.safetensors").read_bytes() == before


@pytest.mark.parametrize("generator", ["gpt2"], indirect=True)
def test_the_weights_alone_are_restored_whatever_optimizer_the_config_now_names(generator):
    _, folder, _ = generator
    before = (folder / "model.safetensors").read_bytes()
    raw = json.loads((folder.parent.parent / "run.yaml").read_text())
    raw["train"]["optimizer"] = "adafactor"  # trained with adamw: other optimizer state
    run_export(parse_config(raw))
    assert (folder / "model.safetensors").read_bytes() == before


def test_without_a_checkpoint_there_is_nothing_to_export(tmp_path):
    out = prepared_run(tmp_path, "gpt2")
    raw = training_config(out, "gpt2")
    raw["train"]["engine"] = "jax"
    config = parse_config(raw)
    from payload.training.inputs import check_inputs

    checkpoints.start_fresh(str(out), {**check_inputs(config).identity, "engine": "jax"})
    with pytest.raises(UserError, match="nothing to export: no checkpoint in"):
        run_export(config)
    assert not (out / "model").exists()


# --- model.init_from into the JAX engine ---------------------------------------------------


@pytest.fixture(scope="module")
def tf_export(tmp_path_factory):
    """A tiny GPT-2 trained a few steps by the TF engine, exported."""
    from payload.stages.train import run_train

    out = prepared_run(tmp_path_factory.mktemp("tf-export"), "gpt2")
    config = parse_config(training_config(out, "gpt2", steps=6, checkpoint_every=6, eval_every=6))
    run_train(config)
    run_export(config)
    return out / "model"


def read_into_jax(folder: Path, family: str):
    from payload.engines.jax.models import build_model, load_state_dict
    from payload.engines.jax.pretrained import read_pretrained
    from payload.training.pretrained import pretrained_config

    hf_config = pretrained_config(str(folder), family=family, vocab_size=1)
    model = build_model(hf_config, seed=7)
    load_state_dict(model, read_pretrained(str(folder), hf_config))
    return model


def assert_init_from_gives_pytorchs_logits(family: str, folder: Path, tmp_path: Path) -> None:
    """The folder read into a fresh JAX model, and loaded by PyTorch transformers 5.x: the same
    logits for the same padded inputs."""
    from tests.support.jax import model_inputs

    if not TORCH_READY.exists():
        pytest.skip("no transformers 5.x environment (.venv-torch; `make setup-torch`)")
    model = read_into_jax(folder, family)
    raw = json.loads((folder / "config.json").read_text())
    inputs = model_inputs({**raw, "pad_token_id": raw.get("pad_token_id") or 0},
                          np.random.default_rng(0))
    np.savez(tmp_path / "inputs.npz", **inputs)
    ours = np.asarray(model(**inputs))
    jobs = [{"folder": str(folder), "family": family, "inputs": str(tmp_path / "inputs.npz"),
             "output": str(tmp_path / "torch.npy")}]
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    result = subprocess.run([str(TORCH_PYTHON), str(SCRIPTS / "torch_forward.py"),
                             str(tmp_path / "jobs.json")],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    difference = float(np.abs(ours - np.load(tmp_path / "torch.npy")).max())
    print(f"{family} from {folder.parent.name}: max |logit difference| {difference:.2e}")
    assert difference <= 1e-4


@pytest.mark.torch
def test_init_from_reads_a_tf_engine_export_with_pytorchs_logits(tf_export, tmp_path):
    assert_init_from_gives_pytorchs_logits("gpt2", tf_export, tmp_path)


@pytest.mark.torch
def test_init_from_reads_a_jax_generators_export_with_pytorchs_logits(generator, tmp_path):
    assert_init_from_gives_pytorchs_logits(*generator[:2], tmp_path)


@pytest.mark.torch
def test_init_from_reads_a_jax_fillers_export_with_pytorchs_logits(filler, tmp_path):
    assert_init_from_gives_pytorchs_logits(*filler[:2], tmp_path)


def test_init_from_reads_a_hub_checkpoints_bare_names(tf_export, tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "hub"
    shutil.copytree(tf_export, folder)
    state = load_file(str(folder / "model.safetensors"))
    bare = {k.removeprefix("transformer."): v for k, v in state.items() if k != "lm_head.weight"}
    save_file(bare, str(folder / "model.safetensors"), metadata={"format": "pt"})
    ids = np.array([[5, 6, 7, 8]], np.int32)
    np.testing.assert_array_equal(np.asarray(read_into_jax(folder, "gpt2")(ids)),
                                  np.asarray(read_into_jax(tf_export, "gpt2")(ids)))


def test_init_from_a_folder_that_does_not_fit_is_one_line(tf_export, filler, tmp_path):
    from safetensors.numpy import load_file, save_file

    from payload.engines.jax.pretrained import read_pretrained
    from payload.training.pretrained import pretrained_config

    family, folder = filler[:2]
    # Another family's weights beside this family's config.json.
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    shutil.copy(tf_export / "model.safetensors", other / "model.safetensors")
    hf_config = pretrained_config(str(other), family=family, vocab_size=1)
    with pytest.raises(UserError, match=f"holds no {family} weights"):
        read_pretrained(str(other), hf_config)
    # A layer's weight of another width.
    wrong = tmp_path / "wrong"
    shutil.copytree(folder, wrong)
    state = load_file(str(wrong / "model.safetensors"))
    key = next(k for k in state if k.endswith("layer.0.intermediate.dense.weight"))
    state[key] = np.zeros((state[key].shape[0] + 8, state[key].shape[1]), np.float32)
    save_file(state, str(wrong / "model.safetensors"))
    with pytest.raises(UserError, match=re.escape(f"has {key}")) as caught:
        read_pretrained(str(wrong), hf_config)
    assert "\n" not in str(caught.value)
    # TensorFlow's file alone: refused with the way to convert it.
    (wrong / "model.safetensors").unlink()
    with pytest.raises(UserError, match=r"has only tf_model\.h5, and the jax engine reads"):
        read_pretrained(str(wrong), hf_config)


def test_each_engines_export_and_init_from_leave_the_other_framework_alone():
    from tests.support.runners import run_python

    assert run_python(
        "import sys\n"
        "import payload.engines.jax.export, payload.engines.jax.pretrained\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'tf_keras'}))\n"
    ) == "[]"
    assert run_python(
        "import sys\n"
        "import payload.engines.tensorflow.export, payload.training.pretrained\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('flax', 'optax', 'orbax')"
        " or m.startswith('payload.engines.jax')))\n"
    ) == "[]"


@pytest.mark.usefixtures("gcs_emulator")
def test_init_from_reads_a_folder_on_cloud_storage(tf_export):
    from payload.core import storage
    from payload.core.pytorch_weights import check_fits, read_header
    from payload.engines.jax.pretrained import read_pretrained
    from payload.training.pretrained import pretrained_config

    remote = "gs://tpuctl-test/models/first"
    for name in ("config.json", "model.safetensors"):
        storage.write_bytes(f"{remote}/{name}", (tf_export / name).read_bytes())
    header = read_header(f"{remote}/model.safetensors")  # the header alone, as pre-flight reads
    check_fits(header, "gpt2", json.loads((tf_export / "config.json").read_text()),
               source="test")
    hf_config = pretrained_config(remote, family="gpt2", vocab_size=1)
    theirs = read_pretrained(remote, hf_config)
    ours = read_pretrained(str(tf_export), hf_config)
    assert sorted(theirs) == sorted(ours)
    for name, array in ours.items():
        np.testing.assert_array_equal(theirs[name], array, err_msg=name)


def test_a_jax_run_exported_without_jax_installed_is_one_line(monkeypatch):
    """run.json says jax but this Python has only the TensorFlow set: one line saying what to
    install, not an ImportError."""
    import importlib.util

    from payload.core import engines as specs
    from payload.core.errors import UserError
    from payload.engines import trained_weights

    real = importlib.util.find_spec
    monkeypatch.setattr(specs.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("jax", "orbax") else real(name, *a))
    with pytest.raises(UserError, match=r"needs jax, orbax") as caught:
        trained_weights("jax", config=None, hf_config=None)
    assert "tpuctl[jax]" in caught.value.hint
