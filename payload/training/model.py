"""The transformers TensorFlow model for a run, and the forward pass each objective trains.

    hf_config = model_config(config.model, vocab=TokenIds(...), seq_len=128)
    model = build_model(hf_config)            # inside strategy.scope()
    logits, labels = forward(model, batch, family="roberta", training=True)

The model is the stock `TF*For*` class, so `save_pretrained` and the Hugging Face loaders see
exactly what they expect. Training a masked LM runs the encoder over every position but the
vocabulary projection only at the masked positions (a fixed number per row, as the original
BERT code does): on a small model that projection is most of the step.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from payload.config import check_model_config_file
from payload.core.errors import UserError
from payload.core.families import FAMILIES, ROBERTA_POSITION_PADDING, positions_needed


@dataclass(frozen=True, kw_only=True)
class TokenIds:
    """The ids the model config and the objectives need, read from the tokenizer."""

    vocab_size: int
    special: tuple[int, ...]  # never masked, never a random replacement
    pad: int
    unk: int
    mask: int | None = None
    bos: int | None = None
    eos: int | None = None
    sentinels: tuple[int, ...] = ()  # T5's <extra_id_0>, <extra_id_1>, ...


def token_ids(tokenizer, family: str) -> TokenIds:
    """Look the family's special tokens up in a loaded `PreTrainedTokenizerFast` (trained here,
    with them at ids 0..n-1, or reused through tokenizer.path, wherever they are)."""
    spec = FAMILIES[family]

    def lookup(token: str | None) -> int | None:
        if token is None:
            return None
        found = tokenizer.convert_tokens_to_ids(token)
        if found is None or (found == tokenizer.unk_token_id and token != spec.unk):
            raise UserError(
                f"the tokenizer has no {token} token, which {family} needs",
                hint="retrain the tokenizer for this model family",
            )
        return found

    special = {lookup(t) for t in spec.special_tokens} | set(tokenizer.all_special_ids)
    return TokenIds(
        vocab_size=len(tokenizer),
        special=tuple(sorted(special)),
        pad=lookup(spec.pad),
        unk=lookup(spec.unk),
        mask=lookup(spec.mask),
        bos=lookup(spec.bos),
        eos=lookup(spec.eos or spec.separator),
        sentinels=tuple(lookup(t) for t in spec.extra),
    )


def model_config(model_cfg, *, vocab: TokenIds, seq_len: int):
    """A transformers config from the run config's `model` section (its size or shape keys,
    its config file, or the config of the model folder it continues from)."""
    import transformers

    family = model_cfg.family
    if model_cfg.init_from:
        from payload.training.pretrained import pretrained_config

        hf = pretrained_config(model_cfg.init_from, family=family, vocab_size=vocab.vocab_size)
    elif model_cfg.config:
        check_model_config_file(model_cfg.config, family)
        try:
            hf = transformers.AutoConfig.from_pretrained(model_cfg.config)
        except (OSError, ValueError) as exc:
            raise UserError(
                f"model.config: cannot read {model_cfg.config} ({exc})".split("\n")[0],
                hint="point it at a transformers config.json",
            ) from None
        if hf.model_type != family:  # transformers' model types are the family names
            raise UserError(
                f"model.config is a {hf.model_type} config but model.family is {family}",
                hint="make them agree",
            )
        hidden = getattr(hf, "hidden_size", None) or getattr(hf, "d_model", None)
        heads = getattr(hf, "num_attention_heads", None) or getattr(hf, "num_heads", None)
        if family != "t5" and hidden % heads:
            raise UserError(
                f"{model_cfg.config}: {heads} heads do not divide hidden size {hidden}",
                hint="pick a hidden size that is a multiple of the head count",
            )
        hf.vocab_size = vocab.vocab_size
    else:
        hf = _sized_config(model_cfg, vocab=vocab, seq_len=seq_len)
    hf.pad_token_id = vocab.pad
    if family == "roberta":
        # TF RoBERTa numbers positions from a hard-coded padding index of 1, PyTorch's from
        # config.pad_token_id: say 1 so both frameworks give the same positions (and so the
        # same outputs). Ids equal to 1 then restart no position count in either; the pipeline
        # pads with the tokenizer's own pad id and masks it.
        hf.pad_token_id = ROBERTA_POSITION_PADDING
    if vocab.bos is not None:
        hf.bos_token_id = vocab.bos
    if vocab.eos is not None:
        hf.eos_token_id = vocab.eos
    if family == "t5":
        hf.decoder_start_token_id = vocab.pad
    positions = getattr(hf, "max_position_embeddings", None) or getattr(hf, "n_positions", None)
    needed = positions_needed(family, seq_len)
    if positions is not None and positions < needed:
        raise UserError(
            f"the model has {positions} positions but data.seq_len is {seq_len}",
            hint="lower data.seq_len or raise the model's position count",
        )
    return hf


def _sized_config(m, *, vocab: TokenIds, seq_len: int):
    import transformers

    from payload.core.sizes import transformers_config

    settings = transformers_config(m, vocab_size=vocab.vocab_size, seq_len=seq_len)
    return transformers.AutoConfig.for_model(settings.pop("model_type"), **settings)


def model_class(family: str):
    import transformers

    return {
        "bert": transformers.TFBertForMaskedLM,
        "roberta": transformers.TFRobertaForMaskedLM,
        "gpt2": transformers.TFGPT2LMHeadModel,
        "t5": transformers.TFT5ForConditionalGeneration,
    }[family]


def build_model(hf_config):
    """The TF model with all its weights created (call inside the strategy's scope)."""
    import warnings

    with warnings.catch_warnings():
        # TF T5's untied head (v1.1) takes its initializer from one shared RandomNormal, which
        # tf-keras warns about on every build; the weights are initialised as they should be.
        warnings.filterwarnings("ignore", message="The initializer RandomNormal is unseeded")
        model = model_class(hf_config.model_type)(hf_config)
        if getattr(model, "lm_head", None) is not None and hf_config.model_type == "t5":
            # Before the weights exist, so every replica and worker creates the same ones.
            model.lm_head.kernel_initializer = untied_head_initializer()
        model(model.dummy_inputs, training=False)
    return model


def untied_head_initializer():
    """T5 v1.1's untied output projection as T5's own training code draws it: variance scaling
    by fan-in (std d_model^-0.5, truncated normal). transformers draws it at std 1.0 like the
    tied embedding, but only the tied head scales the decoder output by d_model^-0.5 first; the
    untied one then starts with logits d_model^0.5 too large (eval loss 58 for T5 tiny where a
    uniform guess is ln 8000 = 9.0) and trains no better than a unigram model for hundreds of
    steps."""
    import tf_keras

    return tf_keras.initializers.VarianceScaling(1.0, mode="fan_in",
                                                 distribution="truncated_normal")


def config_fingerprint(hf_config) -> str:
    """What must not change between a checkpoint and a resumed run."""
    raw = hf_config.to_dict()
    for volatile in ("transformers_version", "_name_or_path", "torch_dtype", "dtype"):
        raw.pop(volatile, None)
    return hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()


def forward(model, batch, *, family: str, training: bool):
    """(logits [B, T, V] float32, labels [B, T] with -100 = ignore) for one batch.

    Masked LMs return T = the number of masked slots per row, not the sequence length."""
    import tensorflow as tf

    if family in ("bert", "roberta"):
        encoder = model.bert if family == "bert" else model.roberta
        head = model.mlm if family == "bert" else model.lm_head
        hidden = encoder(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], training=training
        )[0]
        picked = tf.gather(hidden, batch["masked_positions"], batch_dims=1)
        logits = head(picked)
        labels = tf.where(batch["masked_weights"] > 0, batch["masked_ids"], -100)
        return tf.cast(logits, tf.float32), labels
    if family == "gpt2":
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], training=training
        ).logits
        return tf.cast(logits[:, :-1], tf.float32), batch["labels"][:, 1:]
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        decoder_input_ids=batch["decoder_input_ids"],
        training=training,
    ).logits
    return tf.cast(logits, tf.float32), batch["labels"]


def loss_sums(logits, labels):
    """(summed cross-entropy, number of predicted tokens, number predicted correctly)."""
    import tensorflow as tf

    valid = labels != -100
    safe = tf.where(valid, labels, 0)
    xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=safe, logits=logits)
    weight = tf.cast(valid, tf.float32)
    correct = (
        tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), safe), tf.float32)
        * weight
    )
    return tf.reduce_sum(xent * weight), tf.reduce_sum(weight), tf.reduce_sum(correct)


def load_tokenizer(config):
    """The run's tokenizer as a `PreTrainedTokenizerFast` (copied down first from GCS), and the
    fingerprint prepare recorded for it."""
    import tempfile

    from transformers import PreTrainedTokenizerFast

    from payload.core import storage
    from payload.data.tokenizer import copy_tokenizer_files, fingerprint, read_tokenizer_json

    folder, raw = read_tokenizer_json(config)
    if storage.is_gcs(folder):
        folder = tempfile.mkdtemp(prefix="tpuctl-tokenizer-")
        copy_tokenizer_files(config, folder)
    return PreTrainedTokenizerFast.from_pretrained(folder), fingerprint(raw)
