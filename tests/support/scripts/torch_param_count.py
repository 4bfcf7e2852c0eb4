"""Run in the separate PyTorch transformers 5.x environment: the parameter count of the model
each transformers config describes, built on the meta device (shapes only, no memory), so the
test can compare the largest sizes with the arithmetic without allocating gigabytes.

    .venv-torch/bin/python tests/support/scripts/torch_param_count.py CONFIGS.json
    # CONFIGS.json: [{"model_type": "gpt2", "n_embd": 768, ...}, ...] -> prints [count, ...]
"""

import json
import sys

import torch
import transformers

AUTO = {
    "bert": transformers.AutoModelForMaskedLM,
    "roberta": transformers.AutoModelForMaskedLM,
    "gpt2": transformers.AutoModelForCausalLM,
    "t5": transformers.AutoModelForSeq2SeqLM,
    "llama": transformers.AutoModelForCausalLM,
}


def count(settings: dict) -> int:
    settings = dict(settings)
    model_type = settings.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **settings)
    with torch.device("meta"):
        model = AUTO[model_type].from_config(config)
        head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
        if settings.get("tie_word_embeddings") is False and head.weight is embeddings.weight:
            # transformers 5 builds T5 tied whatever the config says, and unties it when a
            # checkpoint brings its own lm_head (as T5 v1.1's do, and our exports): count that.
            head.weight = torch.nn.Parameter(torch.empty_like(embeddings.weight))
    # parameters() yields a tied tensor once.
    return sum(p.numel() for p in model.parameters())


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as f:
        configs = json.load(f)
    print(json.dumps([count(c) for c in configs]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
