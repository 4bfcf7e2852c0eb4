"""The objectives as numpy batch transforms: exact counts, static shapes, nothing lost; the draws
(payload.data.reader.uniform) decide."""

import numpy as np
import pytest

from payload.core.families import span_corruption_lengths, t5_expanded_length
from payload.data.objectives import IGNORE_INDEX, CausalLM, MaskedLM, SpanCorruption
from payload.data.reader import uniform


def draws(objective, rows: int, key: int) -> np.ndarray:
    return uniform(key, np.arange(rows), objective.draws)

NUM_SPECIAL, VOCAB, MASK, PAD = 5, 1000, 4, 0


def batch_of_ids(rows: int, length: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ids = rng.integers(NUM_SPECIAL, VOCAB, size=(rows, length), dtype=np.int32)
    ids[:, 0] = 2  # a row-start token
    ids[:, length // 2] = 3  # a document separator
    return ids


def test_masked_lm_picks_exactly_fifteen_percent_of_ordinary_tokens_with_80_10_10():
    seq_len, rows = 64, 512
    ids = batch_of_ids(rows, seq_len)
    masker = MaskedLM(
        seq_len=seq_len,
        vocab_size=VOCAB,
        special_ids=tuple(range(NUM_SPECIAL)),
        mask_id=MASK,
        pad_id=PAD,
        dense_labels=True,
    )
    out = masker(ids, draws(masker, rows, 1))
    p = masker.num_predictions
    assert out["masked_positions"].shape == (rows, p) and out["input_ids"].shape == ids.shape
    chosen = out["labels"] != IGNORE_INDEX
    assert (chosen.sum(axis=1) == round((seq_len - 2) * 0.15)).all()
    assert not chosen[:, 0].any() and not chosen[:, seq_len // 2].any()  # specials never
    assert (out["labels"][chosen] == ids[chosen]).all()
    assert (out["input_ids"][~chosen] == ids[~chosen]).all()
    # The sparse view names the same positions and tokens as the dense labels.
    weights = out["masked_weights"] > 0
    rows_idx = np.repeat(np.arange(rows)[:, None], p, axis=1)
    assert (chosen[rows_idx[weights], out["masked_positions"][weights]]).all()
    assert (
        out["masked_ids"][weights] == ids[rows_idx[weights], out["masked_positions"][weights]]
    ).all()
    became = out["input_ids"][chosen]
    masked, kept = (became == MASK).mean(), (became == ids[chosen]).mean()
    assert 0.77 < masked < 0.83
    assert 0.08 < kept < 0.13  # 10% kept, plus the odd random token equal to the original
    assert ((became != MASK) & (became != ids[chosen])).mean() > 0.07
    assert (became >= NUM_SPECIAL).sum() + (became == MASK).sum() == became.size


def test_masked_lm_is_deterministic_in_its_seed():
    ids = batch_of_ids(8, 32)
    masker = MaskedLM(
        seq_len=32,
        vocab_size=VOCAB,
        special_ids=tuple(range(NUM_SPECIAL)),
        mask_id=MASK,
        pad_id=PAD,
    )
    a, b = masker(ids, draws(masker, 8, 3)), masker(ids, draws(masker, 8, 3))
    c = masker(ids, draws(masker, 8, 4))
    assert (a["input_ids"] == b["input_ids"]).all()
    assert (a["input_ids"] != c["input_ids"]).any()


def test_causal_lm_ignores_padding():
    ids = batch_of_ids(2, 16)
    ids[1, 10:] = PAD
    out = CausalLM(pad_id=PAD)(ids, None)
    labels = out["labels"]
    assert (labels[1, 10:] == IGNORE_INDEX).all() and (labels[0] == ids[0]).all()
    assert out["attention_mask"][1].sum() == 10


@pytest.mark.parametrize(("seq_len", "density", "span"), [(32, 0.15, 3.0), (128, 0.3, 5.0)])
def test_span_corruption_keeps_every_token_once_with_fixed_lengths(seq_len, density, span):
    expanded = t5_expanded_length(seq_len, density, span)
    first_sentinel = VOCAB
    corrupt = SpanCorruption(
        expanded_len=expanded,
        seq_len=seq_len,
        noise_density=density,
        mean_noise_span_length=span,
        eos_id=2,
        pad_id=PAD,
        sentinel_ids=tuple(range(first_sentinel, first_sentinel + 100)),
    )
    ids = batch_of_ids(64, expanded, seed=1)
    out = corrupt(ids, draws(corrupt, 64, 7))
    input_len, target_len = span_corruption_lengths(expanded, density, span)
    assert out["input_ids"].shape == (64, seq_len)
    assert out["labels"].shape == out["decoder_input_ids"].shape == (64, target_len)
    assert (out["decoder_input_ids"][:, 1:] == out["labels"][:, :-1]).all()
    for row, inputs, labels in zip(ids, out["input_ids"], out["labels"], strict=True):
        inputs = inputs[:input_len]
        assert inputs[-1] == 2 and labels[-1] == 2
        # Fill each sentinel in the inputs with what follows the same sentinel in the labels.
        spans, current = {}, None
        for token in labels[:-1]:
            if token >= first_sentinel:
                current = token
                spans[current] = []
            else:
                spans[current].append(token)
        rebuilt = []
        for token in inputs[:-1]:
            rebuilt.extend(spans[token] if token >= first_sentinel else [token])
        assert rebuilt == list(row)
        assert sum(len(v) for v in spans.values()) == corrupt.num_noise
        assert all(len(v) >= 1 for v in spans.values()) and len(spans) == corrupt.num_spans


def test_masked_lm_with_special_tokens_anywhere_in_the_vocabulary():
    # A reused tokenizer (tokenizer.path) may put its mask token last, like RoBERTa's.
    special = (0, 1, 2, 3, VOCAB - 1)
    ids = batch_of_ids(256, 32)
    ids[:, 5] = VOCAB - 1
    masker = MaskedLM(
        seq_len=32,
        vocab_size=VOCAB,
        special_ids=special,
        mask_id=VOCAB - 1,
        pad_id=1,
        dense_labels=True,
    )
    out = masker(ids, draws(masker, 256, 5))
    chosen = out["labels"] != IGNORE_INDEX
    assert not chosen[:, [0, 5, 16]].any()
    replaced = out["input_ids"][chosen]
    randoms = replaced[(replaced != VOCAB - 1) & (replaced != ids[chosen])]
    assert len(randoms) and not np.isin(randoms, special).any()
