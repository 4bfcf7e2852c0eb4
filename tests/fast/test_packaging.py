"""`make setup` installs this project without setuptools' warnings: pyproject.toml says what
current setuptools wants (the license as an SPDX expression, not a TOML table)."""

from __future__ import annotations

import warnings

import pytest

from tests.support.paths import REPO


def test_setuptools_reads_the_project_without_a_deprecation_warning():
    setuptools = pytest.importorskip("setuptools")
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} predates SPDX license strings (77)")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the deprecation `pip install -e .` printed
        dist = apply_configuration(Distribution(), REPO / "pyproject.toml")
    assert dist.metadata.license_expression == "Apache-2.0"
