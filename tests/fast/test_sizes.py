"""Named sizes: one description of the architecture per config, parameter counts from the shapes
that agree with the real models (TensorFlow's and PyTorch's) for every family and size, and the
T5 v1.1 shape (gated-GELU, untied head, 64-wide heads) trained, exported and loaded in PyTorch."""

import json
import re

import pytest

from payload.config import dump_config, parse_config
from payload.core.errors import UserError
from payload.core.sizes import architecture, count_parameters, parameter_count
from payload.training.runplan import describe_model
from tests.support.configs import write_config
from tests.support.runners import assert_user_error, payload_main
from tests.support.sizes import PUBLISHED_VOCAB, run_config

# --- one description of the architecture ---------------------------------------------------


def test_nothing_set_keeps_the_default_shape_and_a_size_fills_none_of_the_shape_keys():
    model = run_config({"family": "roberta"}).model
    assert (model.size, model.hidden_size, model.num_layers, model.num_heads,
            model.intermediate_size) == (None, 256, 4, 4, 1024)
    partial = run_config({"family": "gpt2", "hidden_size": 512, "num_heads": 8}).model
    assert (partial.hidden_size, partial.num_layers, partial.num_heads) == (512, 4, 8)
    sized = run_config({"family": "roberta", "size": "base"}).model
    assert sized.size == "base" and sized.hidden_size is None


@pytest.mark.parametrize("model", [{"family": "t5", "size": "small"}, {"family": "bert"},
                                   {"family": "gpt2", "init_from": "/models/gpt2"}])
def test_the_resolved_config_loads_again(model):
    # The launcher ships dump_config's YAML to the workers, which load it.
    import yaml

    config = run_config(model)
    assert parse_config(yaml.safe_load(dump_config(config))) == config


@pytest.mark.parametrize(
    ("model", "named"),
    [
        ({"size": "base", "hidden_size": 768}, "model.size and model.hidden_size"),
        ({"num_layers": 2, "config": "c.json"}, "model.num_layers and model.config"),
        ({"size": "base", "init_from": "gs://b/m"}, "model.size and model.init_from"),
        ({"config": "c.json", "init_from": "/m"}, "model.config and model.init_from"),
    ],
)
def test_two_descriptions_of_the_architecture_are_refused(model, named):
    with pytest.raises(UserError, match=re.escape(f"{named} both describe the architecture: "
                                                  "set only one")):
        run_config({"family": "roberta", **model})


def test_an_unknown_size_lists_the_family_s_sizes():
    with pytest.raises(UserError, match=r"model\.size 'xl' is not a bert size; choose one of "
                                        r"tiny, small, base, large"):
        run_config({"family": "bert", "size": "xl"})
    assert run_config({"family": "gpt2", "size": "xl"}).model.size == "xl"


def test_the_stage_refuses_two_descriptions_in_one_line(tmp_path):
    config = write_config(tmp_path / "run.yaml", {
        "name": "t", "output_dir": str(tmp_path / "out"), "data": {"corpus": ["a.txt"]},
        "model": {"family": "gpt2", "size": "small", "num_layers": 6},
        "train": {"steps": 1, "batch_size": 8, "learning_rate": 1e-3},
    })
    proc = payload_main("tokenizer", "--config", config)
    assert_user_error(proc, "model.size and model.num_layers both describe the architecture")
    assert not (tmp_path / "out").exists()


# --- parameter counts ------------------------------------------------------------------------


def test_published_sizes_have_their_published_parameter_counts():
    def count(family, size):
        return parameter_count(run_config({"family": family, "size": size}),
                               PUBLISHED_VOCAB[family])

    assert count("gpt2", "small") == 124_439_808  # GPT-2's "124M", exactly
    expected_millions = {
        ("roberta", "base"): 125, ("roberta", "large"): 355, ("bert", "base"): 110,
        ("bert", "large"): 335, ("gpt2", "medium"): 355, ("gpt2", "large"): 774,
        ("gpt2", "xl"): 1558, ("t5", "small"): 77, ("t5", "base"): 248, ("t5", "large"): 783,
    }
    for (family, size), millions in expected_millions.items():
        assert count(family, size) / 1e6 == pytest.approx(millions, rel=0.01), (family, size)


def test_the_plan_line_names_the_shape_the_count_and_the_vocabulary(tmp_path):
    config = run_config({"family": "roberta", "size": "base"})
    assert describe_model(config) == ("roberta base (12 layers, hidden 768, 12 heads): 110.7M "
                                      "parameters, vocabulary 32,000")  # tokenizer.vocab_size
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(architecture(
        run_config({"family": "gpt2", "size": "small"}), 50257)))
    continued = run_config({"family": "gpt2", "init_from": str(folder)})
    assert describe_model(continued) == (f"gpt2 from model.init_from {folder}: 124.4M "
                                         "parameters, vocabulary 50,257")


def test_a_config_json_and_a_transformers_config_count_the_same():
    settings = architecture(run_config({"family": "t5", "size": "base"}), 1000)
    counted = parameter_count(settings)
    assert parameter_count(run_config({"family": "t5", "size": "base"}), 1000) == counted
    assert parameter_count(settings, vocab_size=2000) == counted + 2 * 1000 * 768  # untied head
    split = count_parameters(settings)
    assert split.non_embedding == counted - 2 * 1000 * 768


# --- T5 v1.1 end to end ------------------------------------------------------------------------


