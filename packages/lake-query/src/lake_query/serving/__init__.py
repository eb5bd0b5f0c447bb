"""What keeps one Query replica serving under load: limits, watchdogs and its health.

Parts, one concern each:

- :mod:`~lake_query.serving.admission`: the per-tenant gate and global FIFO a
  statement waits in, and the permit a DoGet stream holds;
- :mod:`~lake_query.serving.stall`: ending a DoGet whose client stopped reading;
- :mod:`~lake_query.serving.planning_threads`: the bounded, per-tenant-fair threads
  DataFusion plans on, watched for loss;
- :mod:`~lake_query.serving.readiness`: whether the replica serves statements now,
  and why not;
- :mod:`~lake_query.serving.health`: what gRPC Health reports from readiness and
  the planning threads;
- :mod:`~lake_query.serving.memory`: allocator and collector settings for a process
  that streams multi-megabyte messages.

This layer imports nothing else of ``lake_query``: the Flight SQL service, the
data plane and the CLI use it (``tests/packaging/test_dependency_rule.py``).
"""
