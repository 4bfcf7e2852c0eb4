"""The accelerator table: shapes consistent with the names, which engine runs where, and the
routes' refusals."""

import re

import pytest

from payload.cloud.accelerators import (
    ACCELERATORS,
    GENERATIONS,
    TENSORFLOW_VERSION,
    accelerator,
    check_engine,
    check_jax_route,
    check_tf_route,
    check_zone,
    default_runtime,
    engines_on,
    host_mismatch,
    region_of,
    runtime_for,
    zones_offering,
)
from payload.core.errors import UserError
from tests.support.paths import REPO

ROOT = REPO


def refusal(call, *args) -> str:
    with pytest.raises(UserError) as info:
        call(*args)
    text = str(info.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("name", sorted(ACCELERATORS))
def test_every_type_is_consistent_with_its_name(name):
    acc = ACCELERATORS[name]
    gen = GENERATIONS[acc.generation]
    prefix, _, size = name.rpartition("-")
    assert prefix == gen.prefix
    # v4/v5p names count TensorCores (2 per chip); v5litepod/v6e names count chips.
    assert acc.chips * acc.cores_per_chip == int(size)
    assert acc.hosts >= 1 and acc.chips_per_host * acc.hosts == acc.chips
    assert acc.chips_per_host in (1, 4, 8)
    assert acc.peak_bf16_flops_per_chip > 0 and acc.hbm_gib_per_chip > 0
    assert acc.peak_bf16_flops == acc.chips * acc.peak_bf16_flops_per_chip
    assert acc.zones and zones_offering(acc) == acc.zones
    assert all(re.fullmatch(r"[a-z]+-[a-z]+\d+-[a-z0-9]+", zone) for zone in acc.zones)
    if acc.tf_supported:
        check_tf_route(acc, default_runtime(acc))  # the default always passes its own check


@pytest.mark.parametrize(
    ("name", "chips", "hosts"),
    [
        ("v4-8", 4, 1),
        ("v4-16", 8, 2),
        ("v4-32", 16, 4),
        ("v4-4096", 2048, 512),
        ("v5litepod-1", 1, 1),
        ("v5litepod-4", 4, 1),
        ("v5litepod-8", 8, 1),
        ("v5litepod-16", 16, 4),
        ("v5litepod-256", 256, 64),
        ("v5p-8", 4, 1),
        ("v5p-32", 16, 4),
        ("v6e-8", 8, 1),
        ("v6e-16", 16, 4),
        ("v6e-256", 256, 64),
    ],
)
def test_host_shapes_from_the_docs(name, chips, hosts):
    acc = accelerator(name)
    assert (acc.chips, acc.hosts) == (chips, hosts)
    assert acc.is_multi_host == (hosts > 1)


def test_peak_flops_and_memory_per_generation():
    expected = {"v4": (275e12, 32, 2), "v5e": (197e12, 16, 1), "v5p": (459e12, 95, 2),
                "v6e": (918e12, 32, 1)}
    for name, (flops, hbm, cores) in expected.items():
        gen = GENERATIONS[name]
        assert (gen.peak_bf16_flops_per_chip, gen.hbm_gib_per_chip, gen.cores_per_chip) == (
            flops, hbm, cores)
    assert accelerator("v5litepod-16").peak_bf16_flops == 16 * 197e12


def test_sizes_offered():
    assert [a for a in ACCELERATORS if a.startswith("v5litepod-")] == [
        f"v5litepod-{n}" for n in (1, 4, 8, 16, 32, 64, 128, 256)]
    assert [a for a in ACCELERATORS if a.startswith("v6e-")] == [
        f"v6e-{n}" for n in (1, 4, 8, 16, 32, 64, 128, 256)]
    assert [a for a in ACCELERATORS if a.startswith("v4-")] == [f"v4-{2**k}" for k in range(3, 13)]
    assert "v5p-8" in ACCELERATORS and "v5p-12288" in ACCELERATORS


def test_pinned_tensorflow_matches_the_project_pin():
    pins = re.findall(r'"tensorflow==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert pins == [TENSORFLOW_VERSION]


def test_unknown_type_lists_the_families():
    text = refusal(accelerator, "v3-8")
    assert "unknown accelerator type 'v3-8'" in text
    for family in ("v4-8..v4-4096", "v5litepod-1..v5litepod-256", "v5p-8..", "v6e-1..v6e-256"):
        assert family in text


def test_the_docs_name_of_v5e_points_to_the_api_spelling():
    text = refusal(accelerator, "v5e-16")
    assert "spells TPU v5e types v5litepod-N; did you mean v5litepod-16?" in text


def test_unknown_size_lists_the_sizes_of_that_family():
    text = refusal(accelerator, "v4-24")
    assert "TPU v4 comes as v4-8, v4-16, v4-32" in text
    assert "v5litepod" not in text
    assert "v5litepod-2" not in ACCELERATORS and "v5litepod-16" in refusal(accelerator, "v5litepod-2")


def test_default_runtimes_single_host_and_pod():
    # v4 on the image Google's TF release CI runs it on (issue 17, defect 4).
    assert default_runtime(accelerator("v4-8")) == "v2-alpha-tpuv5"
    assert default_runtime(accelerator("v4-32")) == "v2-alpha-tpuv5"
    assert default_runtime(accelerator("v5litepod-8")) == "v2-alpha-tpuv5-lite"
    assert default_runtime(accelerator("v5litepod-16")) == "v2-alpha-tpuv5-lite"
    assert default_runtime(accelerator("v5p-32")) == "v2-alpha-tpuv5"
    # The docs' v4 base image: accepted, not the default.
    check_tf_route(accelerator("v4-32"), "tpu-ubuntu2204-base")


@pytest.mark.parametrize("name", ["v6e-1", "v6e-8", "v6e-16"])
def test_v6e_is_refused_naming_what_works(name):
    acc = accelerator(name)
    assert not acc.tf_supported and acc.tf_runtime_pod is None
    for call, args in ((default_runtime, (acc,)), (check_tf_route, (acc, "v2-alpha-tpuv6e"))):
        text = refusal(call, *args)
        assert f"{name}: TensorFlow has no working route on TPU v6e" in text
        assert f"v5litepod-{acc.chips}" in text
    assert "use v4-32 or v5litepod-16 or v5p-32 (16 chips)" in refusal(
        default_runtime, accelerator("v6e-16"))


def test_tensorflow_images_are_refused_naming_the_base_image():
    pod = accelerator("v5litepod-16")
    text = refusal(check_tf_route, pod, "tpu-vm-tf-2.18.0-pod-pjrt-v5e-and-v6")
    assert "preinstalls TensorFlow 2.18.0, not the pinned 2.20.0" in text
    assert "serve TensorFlow 2.18.0 to a 2.20.0 driver" in text
    assert "runtime_version: v2-alpha-tpuv5-lite" in text
    text = refusal(check_tf_route, accelerator("v4-32"), "tpu-vm-tf-2.16.1-pjrt")
    assert "serves nothing on the other hosts" in text and "v2-alpha-tpuv5" in text
    text = refusal(check_tf_route, accelerator("v4-8"), "tpu-vm-tf-2.17.0-pjrt")
    assert "TensorFlow 2.17.0" in text and "runtime_version: v2-alpha-tpuv5 " in text


def test_base_image_of_another_generation_is_refused():
    text = refusal(check_tf_route, accelerator("v4-8"), "v2-alpha-tpuv5-lite")
    assert "v2-alpha-tpuv5-lite is the TPU v5e image" in text
    assert "v4-8 (TPU v4) needs v2-alpha-tpuv5 or tpu-ubuntu2204-base" in text
    text = refusal(check_tf_route, accelerator("v5litepod-16"), "tpu-ubuntu2204-base")
    assert "is the TPU v4 image" in text and "needs v2-alpha-tpuv5-lite" in text


def test_unknown_runtime_is_refused():
    text = refusal(check_tf_route, accelerator("v5p-8"), "ubuntu-22.04")
    assert "unknown runtime_version 'ubuntu-22.04' for v5p-8" in text
    assert "v2-alpha-tpuv5" in text


def test_zones():
    check_zone(accelerator("v4-8"), "us-central2-b")
    check_zone(accelerator("v5litepod-16"), "us-central1-a")
    # Another zone of a listed region: the table is not exhaustive there, the API decides.
    check_zone(accelerator("v4-8"), "us-central2-a")
    text = refusal(check_zone, accelerator("v4-32"), "europe-west4-a")
    assert "zone europe-west4-a does not offer v4-32 (TPU v4 zones: us-central2-b)" in text
    text = refusal(check_zone, accelerator("v5litepod-16"), "us-central2-b")
    assert "us-central1-a, us-south1-a, us-west1-c, us-west4-a" in text


def test_region_of_zone():
    assert region_of("us-central2-b") == "us-central2"
    assert region_of("us-south1-ai1b") == "us-south1"


def test_host_mismatch_is_worded_only_when_there_is_one():
    acc = accelerator("v5litepod-16")
    assert host_mismatch(acc, 4) is None
    text = host_mismatch(acc, 2)
    assert text is not None and "lists 2 worker(s)" in text and "expects 4" in text


# Google's runtimes page, "PyTorch and JAX" (cloud.google.com/tpu/docs/runtimes).
JAX_IMAGES = {"v4": "tpu-ubuntu2204-base", "v5e": "v2-alpha-tpuv5-lite", "v5p": "v2-alpha-tpuv5",
              "v6e": "v2-alpha-tpuv6e"}


@pytest.mark.parametrize("name", sorted(ACCELERATORS))
def test_jax_runs_on_every_type_on_its_generations_base_image(name):
    acc = ACCELERATORS[name]
    assert "jax" in engines_on(acc)
    assert runtime_for(acc, "jax") == default_runtime(acc, "jax") == JAX_IMAGES[acc.generation]
    assert runtime_for(acc, "jax", JAX_IMAGES[acc.generation]) == JAX_IMAGES[acc.generation]
    assert engines_on(acc) == (("jax",) if acc.generation == "v6e" else ("tensorflow", "jax"))


def test_tensorflow_on_v6e_says_to_set_the_jax_engine():
    text = refusal(runtime_for, accelerator("v6e-8"), "tensorflow")
    assert text.startswith("v6e-8: TensorFlow has no working route on TPU v6e")
    assert "set train.engine: jax" in text and "v5litepod-8" in text
    assert refusal(check_engine, accelerator("v6e-1"), "tensorflow") == refusal(
        default_runtime, accelerator("v6e-1"))


def test_the_jax_route_refuses_images_it_does_not_take():
    text = refusal(runtime_for, accelerator("v6e-8"), "jax", "tpu-vm-tf-2.18.0-pjrt")
    assert "is a TensorFlow image" in text and "runtime_version: v2-alpha-tpuv6e" in text
    text = refusal(runtime_for, accelerator("v5p-8"), "jax", "v2-alpha-tpuv6e")
    assert "v2-alpha-tpuv6e is the TPU v6e image" in text and "needs v2-alpha-tpuv5" in text
    assert "unknown runtime_version 'ubuntu'" in refusal(check_jax_route, accelerator("v4-8"),
                                                         "ubuntu")
    # The image Google's CI boots v4 on is taken as well as the docs' one.
    assert runtime_for(accelerator("v4-32"), "jax", "v2-alpha-tpuv5") == "v2-alpha-tpuv5"
