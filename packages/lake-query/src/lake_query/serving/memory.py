"""Allocator and collector settings for a process that streams multi-megabyte messages.

Every DoGet message is a fresh 1-4 MB Python ``bytes``, and gRPC copies it
into a fresh slice of the same size. glibc's malloc serves such blocks with
``mmap`` until its dynamic threshold has grown, and trims the top of a heap
once more than twice that threshold is free; with a few messages in flight
both keep happening, so every byte sent is first page-faulted into fresh
memory (measured: ~9,000 page faults and a quarter of Query's CPU per
32 MB DoGet). Fixed thresholds let freed message buffers be reused.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
import platform
from collections.abc import Mapping

__all__ = [
    "COLLECT_INTERVAL_S",
    "MMAP_THRESHOLD_BYTES",
    "TRIM_THRESHOLD_BYTES",
    "collect_cycles",
    "tune_allocator",
]

logger = logging.getLogger(__name__)

#: Blocks up to this size come from malloc's heaps (glibc's own ceiling for
#: its dynamic threshold); larger ones are still mapped and unmapped directly.
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
#: Free memory a heap may keep at its top before it is returned to the OS.
TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024

# <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: glibc's own environment variables; when set, the operator has decided.
_GLIBC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def tune_allocator(env: Mapping[str, str] = os.environ) -> bool:
    """Fix glibc malloc's mmap and trim thresholds; True if they were set.

    A no-op on other C libraries and when ``MALLOC_MMAP_THRESHOLD_`` or
    ``MALLOC_TRIM_THRESHOLD_`` is set in ``env``. Process-wide: call it once
    at startup of a server process, not from a library.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if any(name in env for name in _GLIBC_ENV):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        # Setting either threshold also turns off glibc's dynamic adjustment.
        ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1)
        ok = bool(libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1) and ok
    except (OSError, AttributeError):
        return False
    if not ok:
        logger.warning("could not set malloc thresholds; large results may stream slower")
    return ok


#: How often a replica collects reference cycles, in seconds.
COLLECT_INTERVAL_S = 1.0


async def collect_cycles(interval_s: float = COLLECT_INTERVAL_S) -> None:
    """Run Python's cycle collector on the event loop only, forever (a task).

    DataFusion calls the bounded built-ins (Python functions) on its own
    worker threads. With automatic collection on, such a call can start a
    collection that frees a DataFusion object (a session kept in a cycle by
    a traceback) from inside DataFusion, and the process aborts ("PyThreadState_Get:
    the GIL is released"). So a replica turns automatic collection off at
    start and collects here, where no DataFusion call is on the stack.
    """
    gc.disable()
    try:
        while True:
            await asyncio.sleep(interval_s)
            gc.collect()
    finally:
        gc.enable()
