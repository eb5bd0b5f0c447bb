"""Query's native DoGet data plane (``LAKE_QUERY_DATA_ADDR``).

pyarrow's C++ Flight server, started by the Query process on its own port,
redeems the sealed tickets GetFlightInfo hands out under the main listener's
bearer auth, TLS, ticket checks, admission, stall and execution deadlines and
drain: :mod:`.server` (the server and its DoGet), :mod:`.streams` (one stream's
life and the deadline watchdog), :mod:`.middleware` (auth and telemetry),
:mod:`.statuses` (Lake errors as pyarrow's), :mod:`.settings` (configuration)
and :mod:`.sockets` (ending a write blocked in C++).
"""
