"""Run in the separate PyTorch transformers 5.x environment: a causal LM folder's loss on the
given rows, as a user computes it (`labels=input_ids`, padding at -100), token-weighted over
every row; prints one JSON line with the loss, the transformers version and the weights that
were missing, unexpected or mismatched (exits 3 if any).

    .venv-torch/bin/python tests/support/scripts/torch_eval_loss.py MODEL_DIR ROWS.npz

ROWS.npz holds input_ids and attention_mask [N, T], right-padded.
"""

import json
import sys

import numpy as np
import torch
import transformers


def main() -> int:
    folder, rows = sys.argv[1:3]
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        folder, output_loading_info=True, dtype=torch.float32)
    model.eval()
    with np.load(rows) as data:
        ids = torch.from_numpy(data["input_ids"]).long()
        mask = torch.from_numpy(data["attention_mask"]).long()
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids), 8):
            batch_ids, batch_mask = ids[start:start + 8], mask[start:start + 8]
            labels = batch_ids.masked_fill(batch_mask == 0, -100)
            tokens = int((labels[:, 1:] != -100).sum())
            loss = model(input_ids=batch_ids, attention_mask=batch_mask, labels=labels).loss
            total, count = total + float(loss) * tokens, count + tokens
    problems = {k: sorted(map(str, v)) for k, v in info.items() if v}
    print(json.dumps({"transformers": transformers.__version__, "problems": problems,
                      "loss": total / count, "tokens": count}))
    return 3 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
