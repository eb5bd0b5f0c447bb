"""Durable async queries: PollFlightInfo jobs that outlive their client and replica.

Parts, one concern each:

- :mod:`~lake_query.jobs.model`: the persisted job record, its sealed body and
  the handle a client keeps (both sealed with the ticket key ring);
- :mod:`~lake_query.jobs.store`: the job store seam (:class:`JobStore`) and its
  local-directory implementation; :mod:`~lake_query.jobs.dynamo` the DynamoDB one;
- :mod:`~lake_query.jobs.results`: the result store seam (local directory, S3);
- :mod:`~lake_query.jobs.framing`: the IPC framing check every served part passes;
- :mod:`~lake_query.jobs.tags`: the keyed tag (Poly1305) that proves a part unchanged;
- :mod:`~lake_query.jobs.parts`: the bounded part writer and the part reader;
- :mod:`~lake_query.jobs.quotas`: outstanding-job slots and the fleet execution lease;
- :mod:`~lake_query.jobs.workers`: the worker pool (leases, fair tenant scheduling);
- :mod:`~lake_query.jobs.service`: submission, polls, cancellation and part tickets;
- :mod:`~lake_query.jobs.settings`: ``LAKE_ASYNC_*`` configuration.
"""

from lake_query.jobs.model import JobSeal
from lake_query.jobs.service import AsyncQueries, open_stores
from lake_query.jobs.settings import AsyncSettings

__all__ = ["AsyncQueries", "AsyncSettings", "JobSeal", "open_stores"]
