"""The cloud-mode Lake of tests/cloud, for the trace and status tests."""

from tests.cloud.conftest import make_cloud_lake

__all__ = ["make_cloud_lake"]
