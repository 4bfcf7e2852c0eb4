"""Training objectives as vectorized numpy transforms on whole batches, with static shapes.

    masker = MaskedLM(seq_len=128, vocab_size=8000, special_ids=(0, 1, 2, 3, 4), mask_id=4,
                      pad_id=1)
    features = masker(ids, draw)        # [B, 128] int32, [B, masker.draws] uniforms -> dict
    objective = objective_for(config, vocab)          # the run's family's, over its tokenizer

Every objective takes a `[B, L]` int32 batch of token ids and `draw`, `[B, draws]` float32
uniforms in [0, 1) (None when `draws` is 0), and returns arrays whose shapes depend only on the
config, never on the data or the draw: a TPU compiles the step once. The reader
(payload.data.stream) draws each row's uniforms from the seed, the step and the row's place in
the global batch, so a row is masked alike whichever host reads it. No framework: both engines
take these arrays. Special tokens are looked up in a vocabulary-sized table: the tokenizer stage
gives them ids 0..n-1, but a reused tokenizer may have them anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from payload.core.errors import UserError
from payload.core.families import FAMILIES, max_predictions, span_corruption_lengths, span_counts

IGNORE_INDEX = -100


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    """Column indices of each row's k largest scores, largest first, ties to the lower index."""
    return np.argsort(-scores, axis=1, kind="stable")[:, :k].astype(np.int32)


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

    @property
    def draws(self) -> int:
        # [0, L) ranks the candidates, [L, L+P) picks the action, the rest the random token.
        return self.seq_len + 2 * self.num_predictions

    def __call__(self, ids: np.ndarray, draw: np.ndarray) -> dict[str, np.ndarray]:
        p, length = self.num_predictions, self.seq_len
        batch = ids.shape[0]
        is_special = np.zeros(self.vocab_size, dtype=bool)
        is_special[list(self.special_ids)] = True
        ordinary = np.flatnonzero(~is_special).astype(np.int32)
        candidate = ~is_special[ids]
        num_candidates = candidate.sum(axis=1).astype(np.float32)
        num_to_mask = np.clip(np.round(num_candidates * np.float32(self.mlm_probability)),
                              np.minimum(num_candidates, 1.0), p)
        # A random order of the candidates, specials last: the first `num_to_mask` are chosen.
        positions = _top(np.where(candidate, draw[:, :length], -1.0), p)
        chosen = np.arange(p, dtype=np.float32)[None, :] < num_to_mask[:, None]
        original = np.take_along_axis(ids, positions, axis=1)
        action = draw[:, length:length + p]
        random_ids = ordinary[(draw[:, length + p:] * len(ordinary)).astype(np.int32)]
        replacement = np.where(chosen & (action < 0.8), self.mask_id,
                               np.where(chosen & (action < 0.9), random_ids, original))
        rows = np.repeat(np.arange(batch)[:, None], p, axis=1)
        # top positions are distinct, and unused slots write their own token back, so the
        # scatter changes only the chosen positions.
        inputs = ids.copy()
        inputs[rows, positions] = replacement
        features = {
            "input_ids": inputs.astype(np.int32),
            "attention_mask": (ids != self.pad_id).astype(np.int32),
            "masked_positions": positions,
            "masked_ids": original.astype(np.int32),
            "masked_weights": chosen.astype(np.float32),
        }
        if self.dense_labels:
            labels = np.full(ids.shape, IGNORE_INDEX, dtype=np.int32)
            labels[rows, positions] = np.where(chosen, original, IGNORE_INDEX)
            features["labels"] = labels
        return features


@dataclass(frozen=True, kw_only=True)
class CausalLM:
    """Next-token prediction: labels are the ids themselves (the loss shifts), -100 on padding."""

    pad_id: int
    draws: int = 0

    def __call__(self, ids: np.ndarray, draw=None) -> dict[str, np.ndarray]:
        real = ids != self.pad_id
        return {
            "input_ids": ids.astype(np.int32),
            "attention_mask": real.astype(np.int32),
            "labels": np.where(real, ids, IGNORE_INDEX).astype(np.int32),
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

    @property
    def draws(self) -> int:
        # One score per gap between items, for the noise and the non-noise segmentations.
        return (self.num_noise - 1) + (self.expanded_len - self.num_noise - 1)

    def noise_mask(self, draw: np.ndarray) -> np.ndarray:
        """[B, expanded_len] bool: True on noise tokens."""
        length, num_noise, num_spans = self.expanded_len, self.num_noise, self.num_spans
        noise_lengths = _random_segmentation(num_noise, num_spans, draw[:, :num_noise - 1])
        nonnoise_lengths = _random_segmentation(length - num_noise, num_spans,
                                                draw[:, num_noise - 1:])
        batch = draw.shape[0]
        interleaved = np.stack([nonnoise_lengths, noise_lengths], axis=2).reshape(
            batch, 2 * num_spans)
        span_starts = np.cumsum(interleaved, axis=1)[:, :-1]
        starts = np.zeros((batch, length), dtype=np.int32)
        np.put_along_axis(starts, span_starts, 1, axis=1)
        return np.cumsum(starts, axis=1) % 2 == 1

    def __call__(self, ids: np.ndarray, draw: np.ndarray) -> dict[str, np.ndarray]:
        batch = ids.shape[0]
        noise = self.noise_mask(draw)
        input_len, target_len = self.lengths
        eos = np.full((batch, 1), self.eos_id, dtype=np.int32)
        inputs = np.concatenate([self._filter(ids, noise, input_len - 1), eos], axis=1)
        labels = np.concatenate([self._filter(ids, ~noise, target_len - 1), eos], axis=1)
        inputs = np.pad(inputs, [(0, 0), (0, self.seq_len - input_len)],
                        constant_values=self.pad_id)
        decoder_inputs = np.concatenate(
            [np.full((batch, 1), self.decoder_start_id, dtype=np.int32), labels[:, :-1]], axis=1)
        return {
            "input_ids": inputs.astype(np.int32),
            "attention_mask": (inputs != self.pad_id).astype(np.int32),
            "decoder_input_ids": decoder_inputs.astype(np.int32),
            "labels": labels.astype(np.int32),
        }

    def _filter(self, ids: np.ndarray, drop_mask: np.ndarray, out_len: int) -> np.ndarray:
        """Replace each run of `drop_mask` tokens by one sentinel, keep the rest, compact to
        `out_len` (the count is the same in every row, so the shape is static)."""
        dropped = drop_mask.astype(np.int32)
        previous = np.pad(dropped[:, :-1], [(0, 0), (1, 0)])
        run_start = dropped * (1 - previous)
        sentinel_index = np.cumsum(run_start, axis=1) - 1
        sentinel = np.asarray(self.sentinel_ids, np.int32)[np.maximum(sentinel_index, 0)]
        marked = np.where(run_start > 0, sentinel, ids)
        keep = (run_start > 0) | ~drop_mask
        length = ids.shape[1]
        # Stable compaction: kept tokens in order first, then the rest.
        key = np.where(keep, np.arange(length)[None, :], length + np.arange(length)[None, :])
        order = np.argsort(key, axis=1, kind="stable")[:, :out_len]
        return np.take_along_axis(marked, order, axis=1).astype(np.int32)


def _random_segmentation(num_items: int, num_segments: int, scores: np.ndarray) -> np.ndarray:
    """[B, num_segments] int32: random positive lengths summing to num_items in every row, from
    [B, num_items - 1] uniform scores (num_segments - 1 distinct cut points among the gaps)."""
    batch = scores.shape[0]
    if num_segments == 1:
        return np.full((batch, 1), num_items, dtype=np.int32)
    cuts = np.sort(_top(scores[:, :num_items - 1], num_segments - 1) + 1, axis=1)
    bounds = np.concatenate([np.zeros((batch, 1), np.int32), cuts,
                             np.full((batch, 1), num_items, np.int32)], axis=1)
    return (bounds[:, 1:] - bounds[:, :-1]).astype(np.int32)


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
