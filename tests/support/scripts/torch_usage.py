"""Run in the separate PyTorch transformers 5.x environment: the everyday calls on an exported
model folder, as a user types them, printed as one JSON line for the test to compare with
TensorFlow's.

    .venv-torch/bin/python tests/support/scripts/torch_usage.py MODEL_DIR FAMILY PROMPT [PROMPT ...]

GPT-2, Llama and T5: `model.generate(**tokenizer(prompt, return_tensors="pt"))`, greedy, per prompt:
{"inputs": [names the tokenizer returned], "generated": [[new token ids], ...]}.
BERT and RoBERTa: a `fill-mask` pipeline, per prompt: {"fill_mask": [[[token id, token str,
score], ...top 5], ...]}. Exits 3 if a weight was missing, unexpected or mismatched.
"""

import json
import sys

import torch
import transformers

NEW_TOKENS = 12


def main() -> int:
    folder, family, *prompts = sys.argv[1:]
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    auto = {
        "bert": transformers.AutoModelForMaskedLM,
        "roberta": transformers.AutoModelForMaskedLM,
        "gpt2": transformers.AutoModelForCausalLM,
        "t5": transformers.AutoModelForSeq2SeqLM,
        "llama": transformers.AutoModelForCausalLM,
    }[family]
    model, info = auto.from_pretrained(folder, output_loading_info=True)
    model.eval()
    problems = {k: list(v) for k, v in info.items() if v}
    report = {"transformers": transformers.__version__, "problems": problems}
    if family in ("gpt2", "llama", "t5"):
        report["inputs"] = sorted(tokenizer(prompts[0], return_tensors="pt"))
        generated = []
        for prompt in prompts:
            encoded = tokenizer(prompt, return_tensors="pt")
            with torch.no_grad():
                out = model.generate(**encoded, max_new_tokens=NEW_TOKENS, do_sample=False)
            start = 0 if family == "t5" else encoded["input_ids"].shape[1]
            generated.append(out[0, start:].tolist())
        report["generated"] = generated
    else:
        fill = transformers.pipeline("fill-mask", model=model, tokenizer=tokenizer, top_k=5)
        report["fill_mask"] = [
            [[r["token"], r["token_str"], r["score"]] for r in fill(prompt)] for prompt in prompts
        ]
    print(json.dumps(report))
    return 3 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
