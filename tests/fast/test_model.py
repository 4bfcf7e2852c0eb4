"""Model configs from the run config or a config.json; vocabulary size from the tokenizer."""

import json

import pytest

pytest.importorskip("transformers")

from payload.core.errors import UserError
from payload.training.model import TokenIds, model_config
from tests.support.model_sections import model_section

VOCAB = TokenIds(vocab_size=777, special=(0, 1, 2, 3, 4), pad=1, unk=3, mask=4, bos=0, eos=2)




@pytest.mark.parametrize("family", ["bert", "roberta", "gpt2", "t5"])
def test_sizes_come_from_the_config_and_the_vocabulary_from_the_tokenizer(family):
    hf = model_config(
        model_section(
            family=family, hidden_size=48, num_layers=3, num_heads=4, intermediate_size=96
        ),
        vocab=VOCAB,
        seq_len=64,
    )
    assert hf.vocab_size == 777 and hf.pad_token_id == 1
    hidden = getattr(hf, "hidden_size", None) or getattr(hf, "n_embd", None) or hf.d_model
    layers = getattr(hf, "num_hidden_layers", None) or getattr(hf, "n_layer", None)
    assert hidden == 48 and (layers or hf.num_layers) == 3


def test_a_config_json_sets_the_architecture(tmp_path):
    import transformers

    path = tmp_path / "config.json"
    transformers.RobertaConfig(
        hidden_size=40,
        num_hidden_layers=1,
        num_attention_heads=5,
        intermediate_size=80,
        vocab_size=5,
    ).to_json_file(str(path))
    hf = model_config(model_section(family="roberta", config=str(path)), vocab=VOCAB, seq_len=64)
    assert (hf.hidden_size, hf.num_attention_heads, hf.vocab_size) == (40, 5, 777)
    with pytest.raises(UserError, match=r"is a roberta config but model\.family is gpt2"):
        model_config(model_section(family="gpt2", config=str(path)), vocab=VOCAB, seq_len=64)
    raw = json.loads(path.read_text())
    raw["num_attention_heads"] = 3
    path.write_text(json.dumps(raw))
    with pytest.raises(UserError, match="3 heads do not divide hidden size 40"):
        model_config(model_section(family="roberta", config=str(path)), vocab=VOCAB, seq_len=64)
    with pytest.raises(UserError, match=r"model\.config .*missing\.json does not exist"):
        model_config(
            model_section(family="roberta", config=str(tmp_path / "missing.json")),
            vocab=VOCAB,
            seq_len=64,
        )


