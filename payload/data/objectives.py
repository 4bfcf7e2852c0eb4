"""Training objectives as vectorized tf.data transforms on whole batches, with static shapes.

    masker = MaskedLM(seq_len=128, vocab_size=8000, special_ids=(0, 1, 2, 3, 4), mask_id=4,
                      pad_id=1)
    ds = ds.map(lambda ids, seed: masker(ids, seed))   # [B, 128] int32 -> features dict
    objective = objective_for(config, vocab)          # the run's family's, over its tokenizer

Every function takes a `[B, L]` int32 batch of token ids and a stateless seed (shape [2]) and
returns tensors whose shapes depend only on the config, never on the data or the random draw: a
TPU compiles the step once. Special tokens are looked up in a vocabulary-sized table: the
tokenizer stage gives them ids 0..n-1, but a reused tokenizer may have them anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from payload.core.errors import UserError
from payload.core.families import FAMILIES, max_predictions, span_corruption_lengths, span_counts

IGNORE_INDEX = -100


@dataclass(frozen=True, kw_only=True)
class MaskedLM:
    """BERT's masking: mlm_probability of each row's non-special tokens are chosen (exactly
    round(n * p) of them, as the original BERT data code does); of those, 80% become the mask
    token, 10% a random token and 10% stay. Returns `input_ids`, `attention_mask`, the chosen
    `masked_positions`/`masked_ids`/`masked_weights` ([B, P], padded with weight 0) and, with
    `dense_labels`, `labels` ([B, L], -100 where nothing is predicted; training does not need
    them: the head only looks at the masked positions)."""

    seq_len: int
    vocab_size: int
    special_ids: tuple[int, ...]
    mask_id: int
    pad_id: int
    mlm_probability: float = 0.15
    dense_labels: bool = False

    @property
    def num_predictions(self) -> int:
        return max_predictions(self.seq_len, self.mlm_probability)

    def __call__(self, ids, seed):
        import tensorflow as tf

        # Few, whole-batch ops: in tf.data the per-op overhead, not the arithmetic, is the cost.
        p, length = self.num_predictions, self.seq_len
        batch = ids.shape[0]
        # One draw: [0, L) ranks the candidates, [L, L+P) picks the action, the rest the
        # random replacement token.
        draw = tf.random.stateless_uniform([batch, length + 2 * p], seed)
        is_special = np.zeros(self.vocab_size, dtype=bool)
        is_special[list(self.special_ids)] = True
        ordinary = np.flatnonzero(~is_special).astype(np.int32)
        candidate = ~tf.gather(tf.constant(is_special), ids)
        num_candidates = tf.reduce_sum(tf.cast(candidate, tf.float32), axis=1)
        num_to_mask = tf.clip_by_value(
            tf.round(num_candidates * self.mlm_probability), tf.minimum(num_candidates, 1.0), p
        )
        # A random order of the candidates, specials last: the first `num_to_mask` are chosen.
        _, positions = tf.math.top_k(tf.where(candidate, draw[:, :length], -1.0), k=p)
        chosen = tf.range(p, dtype=tf.float32)[None, :] < num_to_mask[:, None]
        original = tf.gather(ids, positions, batch_dims=1)
        action = draw[:, length : length + p]
        random_ids = tf.gather(
            tf.constant(ordinary), tf.cast(draw[:, length + p :] * len(ordinary), tf.int32)
        )
        # top_k positions are distinct, and unused slots write their own token back, so the
        # scatter changes only the chosen positions.
        replacement = tf.where(
            chosen & (action < 0.8),
            self.mask_id,
            tf.where(chosen & (action < 0.9), random_ids, original),
        )
        rows = tf.constant(np.repeat(np.arange(batch, dtype=np.int32)[:, None], p, axis=1))
        index = tf.stack([rows, positions], axis=-1)
        features = {
            "input_ids": tf.tensor_scatter_nd_update(ids, index, replacement),
            "attention_mask": tf.cast(ids != self.pad_id, tf.int32),
            "masked_positions": positions,
            "masked_ids": original,
            "masked_weights": tf.cast(chosen, tf.float32),
        }
        if self.dense_labels:
            features["labels"] = tf.tensor_scatter_nd_update(
                tf.fill(tf.shape(ids), IGNORE_INDEX),
                index,
                tf.where(chosen, original, IGNORE_INDEX),
            )
        return features


@dataclass(frozen=True, kw_only=True)
class CausalLM:
    """Next-token prediction: labels are the ids themselves (the loss shifts), -100 on padding."""

    pad_id: int

    def __call__(self, ids, seed):
        import tensorflow as tf

        del seed
        real = ids != self.pad_id
        return {
            "input_ids": ids,
            "attention_mask": tf.cast(real, tf.int32),
            "labels": tf.where(real, ids, IGNORE_INDEX),
        }


@dataclass(frozen=True, kw_only=True)
class SpanCorruption:
    """T5's span corruption, as in the Flax T5 pretraining example but for a whole batch at once.

    Each row of `expanded_len` raw tokens gets exactly `num_noise` noise tokens in `num_spans`
    spans of random lengths (≥ 1), noise and non-noise spans alternating, non-noise first. Inputs
    keep the non-noise tokens with one sentinel per noise span, then EOS, padded to `seq_len`;
    labels hold the noise spans each after its sentinel, then EOS (`target_len`, no padding).
    Sentinel k (k = 0, 1, ...) is `sentinel_ids[k]`.
    """

    expanded_len: int
    seq_len: int
    noise_density: float
    mean_noise_span_length: float
    eos_id: int
    pad_id: int
    sentinel_ids: tuple[int, ...]
    decoder_start_id: int = 0

    @property
    def lengths(self) -> tuple[int, int]:
        return span_corruption_lengths(
            self.expanded_len, self.noise_density, self.mean_noise_span_length
        )

    @property
    def target_len(self) -> int:
        return self.lengths[1]

    @property
    def num_noise(self) -> int:
        return span_counts(self.expanded_len, self.noise_density, self.mean_noise_span_length)[0]

    @property
    def num_spans(self) -> int:
        return span_counts(self.expanded_len, self.noise_density, self.mean_noise_span_length)[1]

    def noise_mask(self, batch, seed):
        """[B, expanded_len] bool: True on noise tokens."""
        import tensorflow as tf

        length, num_noise, num_spans = self.expanded_len, self.num_noise, self.num_spans
        seeds = tf.random.experimental.stateless_split(seed, 2)
        noise_lengths = _random_segmentation(batch, num_noise, num_spans, seeds[0])
        nonnoise_lengths = _random_segmentation(batch, length - num_noise, num_spans, seeds[1])
        interleaved = tf.reshape(
            tf.stack([nonnoise_lengths, noise_lengths], axis=2), [batch, 2 * num_spans]
        )
        span_starts = tf.cumsum(interleaved, axis=1)[:, :-1]
        starts = tf.reduce_max(tf.one_hot(span_starts, length, dtype=tf.int32), axis=1)
        span_num = tf.cumsum(starts, axis=1)
        return tf.equal(span_num % 2, 1)

    def __call__(self, ids, seed):
        import tensorflow as tf

        batch = tf.shape(ids)[0]
        noise = self.noise_mask(batch, seed)
        input_len, target_len = self.lengths
        inputs = self._filter(ids, noise, input_len - 1)
        labels = self._filter(ids, ~noise, target_len - 1)
        eos = tf.fill([batch, 1], self.eos_id)
        inputs = tf.concat([inputs, eos], axis=1)
        labels = tf.concat([labels, eos], axis=1)
        pad = self.seq_len - input_len
        inputs = tf.pad(inputs, [[0, 0], [0, pad]], constant_values=self.pad_id)
        decoder_inputs = tf.concat(
            [tf.fill([batch, 1], self.decoder_start_id), labels[:, :-1]], axis=1
        )
        return {
            "input_ids": inputs,
            "attention_mask": tf.cast(inputs != self.pad_id, tf.int32),
            "decoder_input_ids": decoder_inputs,
            "labels": labels,
        }

    def _filter(self, ids, drop_mask, out_len: int):
        """Replace each run of `drop_mask` tokens by one sentinel, keep the rest, compact to
        `out_len` (the count is the same in every row, so the shape is static)."""
        import tensorflow as tf

        dropped = tf.cast(drop_mask, tf.int32)
        previous = tf.pad(dropped[:, :-1], [[0, 0], [1, 0]])
        run_start = dropped * (1 - previous)
        sentinel_index = tf.cumsum(run_start, axis=1) - 1
        sentinel = tf.gather(
            tf.constant(self.sentinel_ids, tf.int32), tf.maximum(sentinel_index, 0)
        )
        marked = tf.where(run_start > 0, sentinel, ids)
        keep = (run_start > 0) | ~drop_mask
        length = tf.shape(ids)[1]
        # Stable compaction: kept tokens in order first, then the rest.
        key = tf.where(keep, tf.range(length)[None, :], length + tf.range(length)[None, :])
        order = tf.argsort(key, axis=1)[:, :out_len]
        return tf.gather(marked, order, batch_dims=1)


def _random_segmentation(batch, num_items: int, num_segments: int, seed):
    """[B, num_segments] int32: random positive lengths summing to num_items in every row."""
    import tensorflow as tf

    if num_segments == 1:
        return tf.fill([batch, 1], num_items)
    # Choose num_segments - 1 distinct cut points among the num_items - 1 gaps.
    scores = tf.random.stateless_uniform([batch, num_items - 1], seed)
    _, cuts = tf.math.top_k(scores, k=num_segments - 1)
    cuts = tf.sort(cuts + 1, axis=1)
    bounds = tf.concat(
        [tf.zeros([batch, 1], tf.int32), cuts, tf.fill([batch, 1], num_items)], axis=1
    )
    return bounds[:, 1:] - bounds[:, :-1]


def objective_for(config, vocab):
    """The run's objective (its model family's) over the tokenizer's ids (TokenIds): a UserError
    when the tokenizer cannot serve it (too few sentinels for the spans a row makes)."""
    family = FAMILIES[config.model.family]
    if family.objective == "mlm":
        return MaskedLM(
            seq_len=config.data.seq_len,
            vocab_size=vocab.vocab_size,
            special_ids=vocab.special,
            mask_id=vocab.mask,
            pad_id=vocab.pad,
            mlm_probability=config.model.mlm_probability,
        )
    if family.objective == "clm":
        return CausalLM(pad_id=vocab.pad)
    corruption = SpanCorruption(
        expanded_len=config.record_len,
        seq_len=config.data.seq_len,
        noise_density=config.model.noise_density,
        mean_noise_span_length=config.model.mean_noise_span_length,
        eos_id=vocab.eos,
        pad_id=vocab.pad,
        sentinel_ids=vocab.sentinels,
        decoder_start_id=vocab.pad,
    )
    if corruption.num_spans > len(vocab.sentinels):
        raise UserError(
            f"span corruption makes {corruption.num_spans} spans per row but the tokenizer has "
            f"{len(vocab.sentinels)} sentinel tokens",
            hint="lower data.seq_len or model.noise_density, or raise model.mean_noise_span_length",
        )
    return corruption
