"""Stage `tokenizer`: every kind trains, round-trips text, and loads back in transformers."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support.configs import base_config, write_config
from tests.support.paths import TORCH_PYTHON, TORCH_READY
from tests.support.runners import payload_main

KINDS = ["unigram", "bpe", "wordpiece", "sentencepiece"]
FAMILY_FOR_KIND = {"unigram": "roberta", "bpe": "gpt2", "wordpiece": "bert", "sentencepiece": "t5"}


@pytest.fixture(scope="module")
def held_out(documents) -> list[str]:
    return [" ".join(d.split()) for d in documents[3000:3200]]


@pytest.fixture(scope="module", params=KINDS)
def trained(request, tmp_path_factory, small_corpus):
    kind = request.param
    family = FAMILY_FOR_KIND[kind]
    out = tmp_path_factory.mktemp(f"tok-{kind}")
    config = base_config(out / "run", small_corpus, tokenizer={"kind": kind, "vocab_size": 1500},
                         model={"family": family}, data={"seq_len": 64})
    payload_main("tokenizer", "--config", str(write_config(out / "run.yaml", config)), check=True)
    return kind, family, out / "run" / "tokenizer"


@pytest.mark.skipif(not TORCH_READY.exists(),
                    reason="no transformers 5.x environment (.venv-torch; `make setup-torch`)")
def test_transformers_5_encodes_the_same_ids(trained, held_out, tmp_path):
    _kind, _family, folder = trained
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    lines = held_out[:300]
    (tmp_path / "lines.json").write_text(json.dumps(lines))
    script = (
        "import json, sys, transformers\n"
        "from transformers import AutoTokenizer\n"
        "assert transformers.__version__.startswith('5'), transformers.__version__\n"
        "tok = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "lines = json.load(open(sys.argv[2]))\n"
        "print(json.dumps([tok(l)['input_ids'] for l in lines]))\n"
    )
    proc = subprocess.run([str(TORCH_PYTHON), "-c", script, str(folder),
                           str(tmp_path / "lines.json")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    ours = [tok(line)["input_ids"] for line in lines]
    differing = sum(a != b for a, b in zip(ours, theirs, strict=True))
    assert differing == 0, f"{differing} of {len(lines)} lines encode differently in 5.x"


