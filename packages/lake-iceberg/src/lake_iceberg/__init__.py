"""Lake's Iceberg plug-in: read-only federation for Query, and the registrar service.

``lake_iceberg.federation`` serves ``iceberg.<namespace>.<table>`` to Query
(through the ``lake.query.plugins`` entry point); ``lake_iceberg.registrar``
registers shipped Parquet segments in Iceberg tables; ``lake_iceberg.errors``
holds the registrar's error codes.
"""

__all__: list[str] = []
