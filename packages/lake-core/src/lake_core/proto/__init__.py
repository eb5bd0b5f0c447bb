"""Generated Arrow Flight / Flight SQL protobuf and gRPC modules.

Regenerate with ``python tools/codegen/protos.py``; the ``.proto`` sources
sit next to this file and mirror upstream Apache Arrow's wire definitions.
"""

from lake_core.proto import Flight_pb2 as flight_pb2
from lake_core.proto import Flight_pb2_grpc as flight_grpc
from lake_core.proto import FlightSql_pb2 as flight_sql_pb2

__all__ = ["flight_grpc", "flight_pb2", "flight_sql_pb2"]
