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


def test_an_editable_install_has_no_warning_to_print(tmp_path, monkeypatch):
    """Issue 38, item 8: `pip install -e .` printed setuptools' 10-line "Editable installation"
    warning on every fresh set-up (the import finder it installs for packages in a project's
    root); with the packages' folder said outright it writes a plain .pth file instead."""
    import shutil
    import zipfile

    pytest.importorskip("setuptools")
    from setuptools import build_meta

    project = tmp_path / "project"
    for name in ("pyproject.toml", "README.md"):
        project.mkdir(exist_ok=True)
        shutil.copy(REPO / name, project / name)
    for package in ("launcher", "payload"):
        shutil.copytree(REPO / package, project / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.gz"))
    monkeypatch.chdir(project)  # the build runs in this process, from the project's folder
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wheel = build_meta.build_editable(str(tmp_path / "wheels"))
    said = [str(w.message) for w in caught if "ditable" in str(w.message)]
    assert said == [], said
    names = zipfile.ZipFile(tmp_path / "wheels" / wheel).namelist()
    assert not [n for n in names if n.endswith("finder.py")], names
