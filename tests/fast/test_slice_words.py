"""One slice, one vocabulary (issue 38, item 7): chips, the TensorCores on each, and the devices
those make (what JAX counts, what holds a replica or a shard) are said by one function
(Accelerator.in_words) and counted the same way by the run plan's replicas, the fit and the
slice's bring-up, for TPU7x (two devices a chip), v5p (two TensorCores as one megacore device)
and v5e (one TensorCore); and the JAX dry run labels worker 0's port as its coordinator's
(issue 38, item 8), not TensorFlow's."""

from __future__ import annotations

import pytest
import yaml

from payload.cloud import accelerators
from tests.support.runners import tpuctl

SLICES = {
    "tpu7x": ({"provider": "gce", "project": "my-project", "zone": "us-central1-c",
               "machine_type": "tpu7x-standard-4t", "topology": "2x2x2",
               "ssh_source_ranges": ["203.0.113.7/32"]},
              "8 chips of TPU tpu7x, 2 TensorCores each, one device per TensorCore: 16 devices",
              16),
    "v5p": ({"provider": "gcp", "project": "my-project", "zone": "us-east5-a",
             "accelerator_type": "v5p-8"},
            "4 chips of TPU v5p, 2 TensorCores each, joined as one device per chip (megacore): "
            "4 devices", 4),
    "v5e": ({"provider": "gcp", "project": "my-project", "zone": "us-central1-a",
             "accelerator_type": "v5litepod-4"},
            "4 chips of TPU v5e, 1 TensorCore each, one device per chip: 4 devices", 4),
}


def _config(folder, cluster: dict, batch_size: int = 64):
    raw = {"name": "words", "output_dir": "gs://b/words", "cluster": cluster,
           "data": {"corpus": "gs://b/c.txt", "seq_len": 128},
           "tokenizer": {"kind": "bpe", "vocab_size": 8000},
           "model": {"family": "gpt2", "hidden_size": 256, "num_layers": 2, "num_heads": 4,
                     "intermediate_size": 1024},
           "train": {"engine": "jax", "steps": 100, "batch_size": batch_size,
                     "learning_rate": 1e-3, "bf16": True}}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("generation", list(SLICES))
def test_the_dry_run_names_the_slice_once_and_counts_devices_everywhere(
        generation, tmp_path, tpuctl_home):
    cluster, words, devices = SLICES[generation]
    out = tpuctl("train", "--dry-run", "-c", _config(tmp_path, cluster))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    (replicas,) = [line for line in lines if line.strip().startswith("replicas:")]
    assert replicas.strip().startswith(f"replicas: {devices} (one per device: {words});")
    assert f"= {64 // devices} per replica" in replicas
    (sharding,) = [line for line in lines if line.strip().startswith("sharding:")]
    assert f"every device holds the whole state, the batch split over {devices})" in sharding
    assert "per device" in sharding and "chip holds" not in sharding
    assert "one per chip" not in out.stdout and "TPU devices" not in out.stdout
    # Worker 0's port is the JAX coordinator's, the others listen on none; a lone worker on
    # none either.
    ports = [line.split("(home)")[-1] for line in lines if line.startswith("  worker-")
             and "(home)" in line]
    assert ports == (["  jax-coordinator=<VM 0 internal address>:8476", ""]
                     if generation == "tpu7x" else [""])
    assert "tf=" not in out.stdout


def test_the_slice_words_are_the_accelerator_tables():
    for generation, (_, words, devices) in SLICES.items():
        acc = (accelerators.compute_slice("tpu7x-standard-4t", "2x2x2") if generation == "tpu7x"
               else accelerators.accelerator(SLICES[generation][0]["accelerator_type"]))
        assert acc.in_words() == words and acc.jax_devices == devices
    # A TPU7x device holds half its chip's memory: what the fit plans each device with.
    tpu7x = accelerators.compute_slice("tpu7x-standard-4t", "2x2x2")
    assert tpu7x.hbm_bytes_per_device == (tpu7x.hbm_gib_per_chip << 30) // 2


def test_the_slice_up_makes_is_said_in_the_same_words(tmp_path, tpuctl_home):
    cluster, words, _ = SLICES["tpu7x"]
    out = tpuctl("up", "--dry-run", "-c", _config(tmp_path, cluster))
    assert out.returncode == 0, out.stderr
    assert (f"slice words: tpu7x-16 = 2x2x2 on 2 x tpu7x-standard-4t ({words}; 4 chips per VM)"
            in out.stdout)
    assert "JAX then sees the 16 devices" in out.stdout


def test_a_batch_that_does_not_split_over_the_devices_is_refused_before_anything(
        tmp_path, tpuctl_home):
    """A TPU7x-16 has 16 devices, so a batch of 8 cannot split: the plan counted 8 replicas
    (one per chip) and let it through to the trainer, which refused it on the TPU."""
    cluster, _, _ = SLICES["tpu7x"]
    out = tpuctl("train", "--dry-run", "-c", _config(tmp_path, cluster, batch_size=8))
    assert out.returncode == 2, out.stdout
    assert "16" in out.stderr and "Traceback" not in out.stderr
