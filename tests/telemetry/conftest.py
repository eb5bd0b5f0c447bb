"""The cloud-mode Lake of tests/cloud and the Iceberg lane of tests/iceberg, reused here."""

from tests.cloud.conftest import make_cloud_lake
from tests.iceberg.conftest import iceberg_server, lane

__all__ = ["iceberg_server", "lane", "make_cloud_lake"]
