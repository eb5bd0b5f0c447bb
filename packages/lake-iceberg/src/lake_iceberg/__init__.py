"""Lake's Iceberg plug-in: read-only federation and the registrar service."""

__all__: list[str] = []
