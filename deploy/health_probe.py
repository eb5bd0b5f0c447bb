#!/usr/bin/env python3
"""Readiness probe: authenticated, TLS-verified standard gRPC Health of a Lake server.

Kubernetes' built-in gRPC probe cannot send a bearer token, and Lake
authenticates every RPC, Health included. This exec probe can:

    LAKE_PROBE_ADDR          host:port to check (default 127.0.0.1:50051)
    LAKE_PROBE_TOKEN_FILE    bearer token file (optional)
    LAKE_PROBE_CA_FILE       CA bundle; set it for a TLS listener
    LAKE_PROBE_SERVER_NAME   name the server certificate carries (optional)
    LAKE_PROBE_TIMEOUT_S     deadline of the check (default 2)
    LAKE_PROBE_SERVICE       the Health service to check (default "": the whole server);
                             Query's liveness probe checks lake.query.Planning, which is
                             NOT_SERVING only when every planning thread is stuck

Exit 0 when the server reports SERVING, 1 otherwise. The token is never printed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main() -> int:
    addr = os.environ.get("LAKE_PROBE_ADDR", "127.0.0.1:50051")
    token_file = os.environ.get("LAKE_PROBE_TOKEN_FILE", "").strip()
    ca_file = os.environ.get("LAKE_PROBE_CA_FILE", "").strip()
    server_name = os.environ.get("LAKE_PROBE_SERVER_NAME", "").strip()
    timeout = float(os.environ.get("LAKE_PROBE_TIMEOUT_S", "2"))
    service = os.environ.get("LAKE_PROBE_SERVICE", "").strip()
    metadata = ()
    if token_file:
        metadata = (("authorization", f"Bearer {Path(token_file).read_text().strip()}"),)
    if ca_file:
        options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
        creds = grpc.ssl_channel_credentials(root_certificates=Path(ca_file).read_bytes())
        channel = grpc.secure_channel(addr, creds, options=options)
    else:
        channel = grpc.insecure_channel(addr)
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout, metadata=metadata
            )
        except grpc.RpcError as exc:
            print(f"not ready: {exc.code().name}", file=sys.stderr)
            return 1
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    if not serving:
        print(
            f"not ready: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}",
            file=sys.stderr,
        )
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
