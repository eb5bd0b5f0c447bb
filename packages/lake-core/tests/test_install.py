"""Install hints name something that installs: a checkout path, or the extra's own libraries."""

from __future__ import annotations

import importlib.metadata

import pytest

from lake_core import install


def test_package_hint_names_checkout_paths_and_wheels() -> None:
    hint = install.package_hint(["lake-metasrv", "lake-query"])
    assert hint.startswith("pip install ./packages/lake-metasrv ./packages/lake-query ")
    assert "lake_metasrv-*.whl lake_query-*.whl" in hint
    assert "pip install lake-metasrv" not in hint


def test_extra_hint_reads_the_extra_from_package_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    requires = [
        "pyarrow<27,>=26",
        "pandas>=2.2; extra == 'pandas'",
        'av<19,>=18 ; extra == "video"',
        "mcap>=1.6; extra == 'mcap'",
        "mcap-ros2-support>=0.6; extra == 'mcap'",
    ]
    monkeypatch.setattr(importlib.metadata, "requires", lambda name: requires)
    assert install.extra_requirements("lake-sdk", "video") == ["av<19,>=18"]
    assert install.extra_requirements("lake-sdk", "mcap") == ["mcap>=1.6", "mcap-ros2-support>=0.6"]
    assert install.extra_hint("lake-sdk", "mcap") == (
        "pip install 'mcap>=1.6' 'mcap-ros2-support>=0.6' (the lake-sdk[mcap] extra; "
        "or pip install './packages/lake-sdk[mcap]' in a Lake checkout)"
    )


def test_extra_hint_without_metadata_names_the_checkout() -> None:
    assert install.extra_hint("not-a-lake-package", "x") == (
        "pip install './packages/not-a-lake-package[x]' in a Lake checkout"
    )


def test_installed_sdk_extras_match_its_pyproject() -> None:
    # The real metadata of the editable SDK install: the hint is derived, never hard-coded.
    assert install.extra_requirements("lake-sdk", "pandas") == ["pandas>=2.2"]
