"""A missing cloud credential as one typed error, at every ``lake`` command's boundary.

botocore signals a missing or unusable credential chain with its own
exception classes, deep in a stack of 60 frames. :func:`credential_error`
turns those classes (never their text) into a :class:`ConfigError` naming
what to set; the ``lake`` root prints it as one line and exits 2. botocore
is not imported here: only a process that already loaded it can raise its
errors.
"""

from __future__ import annotations

import sys

from lake_core.errors import ConfigError

__all__ = ["credential_error"]

#: botocore's classes for "no usable credentials or region", and what to tell the user.
_HINTS = {
    "NoCredentialsError": "no AWS credentials found",
    "PartialCredentialsError": "the AWS credentials are incomplete",
    "CredentialRetrievalError": "the AWS credentials could not be retrieved",
    "NoRegionError": "no AWS region is set (AWS_REGION)",
}
_SETUP = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, "
    "or run where a workload identity provides them"
)


def credential_error(error: BaseException) -> ConfigError | None:
    """``error`` as a one-line ConfigError if it is botocore's missing-credential error."""
    module = sys.modules.get("botocore.exceptions")
    if module is None:
        return None
    for name, hint in _HINTS.items():
        kind = getattr(module, name, None)
        if isinstance(kind, type) and isinstance(error, kind):
            setup = "" if name == "NoRegionError" else f": {_SETUP}"
            return ConfigError(f"{hint} ({name}){setup}")
    return None
