"""The TensorFlow engine's model: transformers' TF class for a run, and the forward pass each
objective trains.

    model = build_model(hf_config)            # inside strategy.scope()
    logits, labels = forward(model, batch, family="roberta", training=True)
    xent, count, correct = loss_sums(logits, labels)

The model is the stock `TF*For*` class, so `save_pretrained` and the Hugging Face loaders see
exactly what they expect. Training a masked LM runs the encoder over every position but the
vocabulary projection only at the masked positions (a fixed number per row, as the original
BERT code does): on a small model that projection is most of the step.
"""

from __future__ import annotations

from payload.core.families import FAMILIES


def model_class(family: str):
    """transformers' TF class of the family's pretraining task (its spec's architecture)."""
    import transformers

    return getattr(transformers, "TF" + FAMILIES[family].architecture)


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


def forward(model, batch, *, family: str, training: bool):
    """(logits [B, T, V] float32, labels [B, T] with -100 = ignore) for one batch.

    Masked LMs return T = the number of masked slots per row, not the sequence length."""
    import tensorflow as tf

    objective = FAMILIES[family].objective
    if objective == "mlm":
        encoder = getattr(model, model.base_model_prefix)  # model.bert, model.roberta
        head = model.mlm if hasattr(model, "mlm") else model.lm_head  # BERT: mlm; RoBERTa
        hidden = encoder(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], training=training
        )[0]
        picked = tf.gather(hidden, batch["masked_positions"], batch_dims=1)
        logits = head(picked)
        labels = tf.where(batch["masked_weights"] > 0, batch["masked_ids"], -100)
        return tf.cast(logits, tf.float32), labels
    if objective == "clm":
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
