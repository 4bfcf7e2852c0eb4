"""The PyTorch half of the accelerator bench: what a user would pick instead, Hugging Face
transformers' BertForMaskedLM / GPT2LMHeadModel trained with bf16 autocast and AdamW (fused on
CUDA), eager or under torch.compile, SDPA attention. Needs only torch, transformers and numpy,
so it runs in any Python that has them (`--torch-python`), without this project installed.

    python -m bench.accel_torch eager CASE.json      # one JSON line: first step, steps/s
    python -m bench.accel_torch compile CASE.json
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()

import json  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402


def random_batch(case: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The JAX half's random tokens (bench.accel_jax.random_batch) as transformers takes them:
    a masked LM's labels are -100 but at its masked positions."""
    batch, length, vocab = case["batch"], case["seq_len"], case["architecture"]["vocab_size"]
    ids = rng.integers(5, vocab, (batch, length)).astype(np.int64)
    rows = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    if case["family"] in ("bert", "roberta"):
        k = case["predicted"]
        positions = np.sort(np.stack([rng.choice(length, k, replace=False)
                                      for _ in range(batch)]), axis=1)
        labels = np.full_like(ids, -100)
        np.put_along_axis(labels, positions, rng.integers(5, vocab, (batch, k)), axis=1)
        return rows | {"labels": labels}
    return rows | {"labels": ids}


def measure(mode: str, case: dict) -> dict:
    import torch
    import transformers

    imported = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    arch = dict(case["architecture"])
    config = transformers.AutoConfig.for_model(arch.pop("model_type"), **arch)
    auto = (transformers.AutoModelForCausalLM if case["family"] == "gpt2"
            else transformers.AutoModelForMaskedLM)
    began = time.perf_counter()
    model = auto.from_config(config, attn_implementation="sdpa").to(device)
    model.train()
    fused = device == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=fused)
    init_s = time.perf_counter() - began
    forward = torch.compile(model) if mode == "compile" else model
    batch = {k: torch.as_tensor(v, device=device)
             for k, v in random_batch(case, np.random.default_rng(0)).items()}
    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=case["bf16"])

    def train_step():
        with autocast:
            loss = forward(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    began = time.perf_counter()
    loss = train_step()
    sync()
    first_step_s = time.perf_counter() - began
    first_step_since_start_s = time.perf_counter() - STARTED
    for _ in range(case["warmup"]):
        loss = train_step()
    sync()
    began = time.perf_counter()
    for _ in range(case["steps"]):
        loss = train_step()
    sync()
    elapsed = time.perf_counter() - began
    return {
        "side": f"torch {mode}", "platform": device,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "import_s": imported - STARTED, "init_s": init_s, "fused_adamw": fused,
        "first_step_s": first_step_s, "first_step_since_start_s": first_step_since_start_s,
        "steps_per_s": case["steps"] / elapsed, "loss": float(loss.detach().float()),
    }


if __name__ == "__main__":
    with open(sys.argv[2], encoding="utf-8") as f:
        print(json.dumps(measure(sys.argv[1], json.load(f))))
