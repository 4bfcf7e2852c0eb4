"""The names a gce slice's resources get from the run's name (issue 27, item 6): used whole, each a
valid Compute Engine name for every run name the config accepts, and a name too long for them
refused at load, in one line. In process: the config parser and the pure request builder."""

from __future__ import annotations

import re

import pytest

from launcher.providers import gce_slice
from payload.config import GCE_MAX_NAME, parse_config
from payload.core.errors import UserError

# Compute Engine's rule for a resource's name (RFC 1035; the API's error quotes it).
COMPUTE_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


def _raw(name: str, **cluster) -> dict:
    return {"name": name,
            "cluster": {"provider": "gce", "project": "my-project", "zone": "us-east5-b",
                        "machine_type": "ct6e-standard-4t", "topology": "2x4", **cluster},
            "data": {"corpus": "gs://b/c.txt"}, "model": {"family": "gpt2"},
            "train": {"steps": 10, "batch_size": 16, "learning_rate": 1e-3, "engine": "jax"}}


@pytest.mark.parametrize("name", [
    "a" * GCE_MAX_NAME,  # the longest accepted
    "a" * 49 + "-bcd",  # 53 characters with a dash where a cut at 50 would have ended
    "t",
])
def test_every_name_of_the_slice_is_a_valid_compute_engine_name(name):
    config = parse_config(_raw(name))
    names = gce_slice.SliceNames.of(config.name)
    # The template's name: its prefix and the shortest unique id the google provider adds.
    derived = [*names.groups, f"{names.template_prefix}{'0' * 9}", *names.policies,
               names.ssh_rule, names.internal_rule, names.tag]
    assert all(COMPUTE_NAME.fullmatch(n) for n in derived), derived
    assert names.groups == (name,)  # whole: two runs never share a slice's names
    assert len(set(derived)) == len(derived)


@pytest.mark.parametrize("slices", [2, 10, 11])
def test_every_slice_has_a_mig_and_policy_of_its_own_with_valid_names(slices):
    """Several slices: NAME-0 .. NAME-(N-1), each with NAME-i-topology; the longest name the
    config accepts for that many slices still gives valid names, one more is refused."""
    longest = 63 - len(f"-{slices - 1}-topology")
    config = parse_config(_raw("a" * longest, slices=slices))
    names = gce_slice.SliceNames.of(config.name, slices)
    assert names.groups == tuple(f"{config.name}-{i}" for i in range(slices))
    assert names.policies == tuple(f"{g}-topology" for g in names.groups)
    derived = [*names.groups, *names.policies, names.ssh_rule, names.internal_rule, names.tag,
               f"{names.template_prefix}{'0' * 9}"]
    assert all(COMPUTE_NAME.fullmatch(n) for n in derived), derived
    assert len(set(derived)) == len(derived)
    with pytest.raises(UserError) as refused:
        parse_config(_raw("a" * (longest + 1), slices=slices))
    assert f"{slices} slices" in str(refused.value) and f"use at most {longest}" in str(
        refused.value) and "\n" not in str(refused.value)


def test_a_run_name_too_long_for_its_slice_is_refused_at_load():
    with pytest.raises(UserError) as refused:
        parse_config(_raw("a" * (GCE_MAX_NAME + 1)))
    assert f"use at most {GCE_MAX_NAME}" in str(refused.value)
    assert "\n" not in str(refused.value)
