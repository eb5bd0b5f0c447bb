"""Lake's Iceberg plug-in: the registrar service (read-only federation comes later).

``lake_iceberg.registrar`` registers shipped Parquet segments in Iceberg
tables; ``lake_iceberg.errors`` holds its error codes.
"""

__all__: list[str] = []
