"""Run in the separate PyTorch transformers 5.x environment: load model folders and write their
logits for the given inputs, so a test can compare them with another framework's.

    .venv-torch/bin/python tests/support/scripts/torch_forward.py JOBS.json

JOBS.json is a list of {"folder", "family", "inputs" (an .npz of the model call's integer
arguments: input_ids, attention_mask, decoder_input_ids, ...), "output" (.npy)}: one process
for all of them, since loading torch and transformers is most of the cost. Prints one JSON line,
the transformers version and the weights each folder had missing, unexpected or mismatched;
exits 3 if any (freshly initialised weights would still give logits, just wrong ones).
"""

import json
import sys

import numpy as np
import torch
import transformers
from torch_logits import AUTO  # its neighbour in this folder (the script's folder is on the path)


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as fh:
        jobs = json.load(fh)
    problems = {}
    for job in jobs:
        model, info = AUTO[job["family"]].from_pretrained(
            job["folder"], output_loading_info=True, dtype=torch.float32)
        model.eval()
        with np.load(job["inputs"]) as inputs:
            kwargs = {name: torch.from_numpy(inputs[name]).long() for name in inputs.files}
        with torch.no_grad():
            logits = model(**kwargs).logits
        np.save(job["output"], logits.float().numpy())
        found = {k: sorted(map(str, v)) for k, v in info.items() if v}
        if found:
            problems[job["folder"]] = found
    print(json.dumps({"transformers": transformers.__version__, "problems": problems}))
    return 3 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
