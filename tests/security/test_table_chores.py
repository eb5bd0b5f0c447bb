"""Table chores through Query, as one tenant among others (the secured fleet of this directory).

Alice (tenant acme, a ``user``) lists and describes only her namespace's tables,
``SHOW TABLES`` and ``information_schema`` name nothing of Bob's, and creating or
dropping a table (admin calls, relayed to Metasrv as the caller) is refused, a
hidden table exactly as an absent one.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

import lake_sdk
from tests.security.cluster import RUNS, SECRETS, SecureCluster


def client(secure: SecureCluster, user: str) -> lake_sdk.Client:
    return lake_sdk.Client(
        secure.query.url.replace("grpc+tls://", "https://"),
        token=secure.tokens[user],
        ca_pem=secure.ca.cert_pem,
    )


def test_listings_show_only_the_callers_tables(secure: SecureCluster) -> None:
    with client(secure, "alice") as alice:
        tables = alice.list_tables()
        assert {t.table.namespace for t in tables} == {RUNS.namespace}
        assert RUNS in [t.table for t in tables]
        shown = alice.query_table("SHOW TABLES").to_pylist()
        schemas = {r["table_schema"] for r in shown} - {"information_schema"}
        assert schemas == {RUNS.namespace}
        columns = alice.query_table("SELECT * FROM information_schema.columns")
        assert set(columns.column("table_schema").to_pylist()) == {RUNS.namespace}
        assert "plan" not in columns.column("column_name").to_pylist()
    with client(secure, "bob") as bob:
        # Other tests of this module's cluster add tables to Bob's namespace; what
        # matters is that he sees his namespace's tables and nothing of Alice's.
        seen = {t.table for t in bob.list_tables()}
        assert SECRETS in seen
        assert {t.namespace for t in seen} == {SECRETS.namespace}


def test_a_hidden_table_is_refused_as_an_absent_one(secure: SecureCluster) -> None:
    absent = lake_sdk.TableRef(SECRETS.namespace, "nothing")
    with client(secure, "alice") as alice:
        errors = []
        for table in (SECRETS, absent):
            with pytest.raises(lake_sdk.PermissionDenied) as described:
                alice.describe_table(table)
            with pytest.raises(lake_sdk.PermissionDenied) as dropped:
                alice.drop_table(table)
            errors.append(str(described.value) + str(dropped.value))
        assert errors[0].replace(SECRETS.name, "<t>") == errors[1].replace(absent.name, "<t>")


def test_a_user_may_not_create_or_drop_tables(secure: SecureCluster) -> None:
    with client(secure, "alice") as alice:
        with pytest.raises(lake_sdk.PermissionDenied):
            alice.create_table("acme_ops.more", pa.schema([("a", pa.int64())]))
        with pytest.raises(lake_sdk.PermissionDenied):
            alice.drop_table(RUNS)
        assert alice.describe_table(RUNS).table == RUNS
        assert "more" not in [t.table.name for t in alice.list_tables()]
