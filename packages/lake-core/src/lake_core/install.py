"""What to run to install a missing Lake package or optional library.

Lake's own packages are not on a package index yet, so a hint such as
``pip install lake-metasrv`` or ``pip install 'lake-sdk[video]'`` finds
nothing. Every "not installed" message is built here instead, naming what
does install:

- a Lake package: its folder in a checkout of the Lake repository (a built
  wheel of the same package works too);
- an optional library behind an extra (pandas, PyAV, mcap ...): the library
  itself from PyPI, with the version range the extra pins, read from the
  installed package's own metadata so the hint never drifts from it.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Sequence

__all__ = ["extra_hint", "extra_requirements", "package_hint"]

_EXTRA_MARKER = re.compile(
    r"""^\s*(?P<req>[^;]+?)\s*;\s*extra\s*==\s*["'](?P<extra>[^"']+)["']\s*$"""
)


def package_hint(distributions: Sequence[str]) -> str:
    """The command that installs Lake's ``distributions`` (``lake-metasrv``, ...) from a checkout."""
    paths = " ".join(f"./packages/{name}" for name in distributions)
    wheels = " ".join(f"{name.replace('-', '_')}-*.whl" for name in distributions)
    return (
        f"pip install {paths} (run in a checkout of the Lake repository; "
        f"Lake is not on a package index yet; built wheels work too: pip install {wheels})"
    )


def extra_requirements(distribution: str, extra: str) -> list[str]:
    """The requirements ``distribution``'s ``extra`` adds, as its installed metadata lists them."""
    try:
        requires = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    found = []
    for line in requires:
        match = _EXTRA_MARKER.match(line)
        if match is not None and match["extra"] == extra:
            found.append(match["req"].replace(" ", ""))
    return found


def extra_hint(distribution: str, extra: str) -> str:
    """The command that adds ``distribution[extra]``'s libraries (they are on PyPI)."""
    requirements = extra_requirements(distribution, extra)
    libraries = " ".join(f"'{r}'" for r in requirements) if requirements else None
    checkout = f"pip install './packages/{distribution}[{extra}]' in a Lake checkout"
    if libraries is None:
        return checkout
    return f"pip install {libraries} (the {distribution}[{extra}] extra; or {checkout})"
