"""Arrow Flight on grpc.aio: FlightData encoding and the shared server scaffolding."""
