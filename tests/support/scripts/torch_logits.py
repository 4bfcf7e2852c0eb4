"""Run in the separate PyTorch transformers 5.x environment: load an exported model folder and
write its logits for the given ids, so the test can compare them with TensorFlow's.

    .venv-torch/bin/python tests/support/scripts/torch_logits.py MODEL_DIR FAMILY IDS.npy OUT.npy

Exits 3 if any weight was missing, unexpected or mismatched (freshly initialised weights would still give
logits, just wrong ones).
"""

import json
import sys

import numpy as np
import torch
import transformers

AUTO = {
    "bert": transformers.AutoModelForMaskedLM,
    "roberta": transformers.AutoModelForMaskedLM,
    "gpt2": transformers.AutoModelForCausalLM,
    "t5": transformers.AutoModelForSeq2SeqLM,
    "llama": transformers.AutoModelForCausalLM,
}


def main() -> int:
    folder, family, ids_path, out_path = sys.argv[1:5]
    model, info = AUTO[family].from_pretrained(folder, output_loading_info=True)
    model.eval()
    ids = torch.from_numpy(np.load(ids_path)).long()
    kwargs = {"decoder_input_ids": ids[:, :5]} if family == "t5" else {}
    with torch.no_grad():
        logits = model(input_ids=ids, **kwargs).logits
    np.save(out_path, logits.float().numpy())
    problems = {k: list(v) for k, v in info.items() if v}
    print(json.dumps({"transformers": transformers.__version__, "problems": problems}))
    return 3 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
