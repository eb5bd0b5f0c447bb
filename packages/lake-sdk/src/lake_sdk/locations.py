"""Deprecated path: this module is now private (``lake_sdk._locations``); import from ``lake_sdk``."""

from lake_sdk._deprecation import moved_module

__getattr__ = moved_module("lake_sdk.locations", "lake_sdk._locations")
