"""Files that hold secrets (tokens, keys): regular files readable by their owner only."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from lake_core.errors import ConfigError

__all__ = ["check_private_file"]


def check_private_file(path: Path, variable: str) -> None:
    """Fail unless ``path`` is a regular file without group/other permissions."""
    try:
        info = path.stat()
    except OSError as exc:
        raise ConfigError(f"{variable}: cannot read {path}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{variable}: {path} is not a regular file")
    if os.name == "posix" and info.st_mode & 0o077:
        raise ConfigError(
            f"{variable}: {path} is readable by group or others "
            f"(mode {stat.S_IMODE(info.st_mode):04o}); run: chmod 600 {path}"
        )
