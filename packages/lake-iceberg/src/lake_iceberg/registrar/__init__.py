"""The Iceberg registrar: shipped Parquet segments registered in Iceberg tables, once.

Parts: ``config`` (the ``sinks:`` entry), ``segments`` (the segment catalog
and finalized segments), ``ship`` (the shipper), ``footer`` (ranged footer
reads), ``schema_merge`` (merge by field id), ``tables`` (catalog client,
create, schema commits), ``append`` (data files and fast appends),
``failures`` (what an exception means), ``transport`` (pinned TLS, timeouts),
``service`` (the loop).
"""

from lake_iceberg.registrar.config import RegistrarConfig, load_config, parse_config
from lake_iceberg.registrar.service import Progress, Registrar

__all__ = ["Progress", "Registrar", "RegistrarConfig", "load_config", "parse_config"]
