"""The tasks table's transactions on the lean wire format answer as the SDK's own do:
the same rows written, the same ETags handed back, the same errors for the same failures
(with the failed operation's index), against a real Azurite."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from azure.core import MatchConditions
from azure.data.tables import TableClient, TableServiceClient, TableTransactionError, UpdateMode

from bagpipe.azurite import Azurite
from pipeline.storage.transactions import TransactionTable


@pytest.fixture
def tables(azurite: Azurite) -> tuple[TableClient, TransactionTable]:
    service = TableServiceClient.from_connection_string(azurite.connection_string)
    service.create_table_if_not_exists("txnsdk")
    service.create_table_if_not_exists("txnlean")
    return (service.get_table_client("txnsdk"),
            TransactionTable.from_connection_string(azurite.connection_string, table_name="txnlean"))


def _ops(table: TableClient, pk: str) -> list[tuple]:
    etag = table.create_entity({"PartitionKey": pk, "RowKey": "a", "Old": "x"})["etag"]
    table.create_entity({"PartitionKey": pk, "RowKey": "gone"})
    at = datetime(2026, 11, 23, 6, 0, 1, 250000, tzinfo=UTC)
    return [
        ("update", {"PartitionKey": pk, "RowKey": "a", "S": "é ✓ 'quoted'", "T": at, "N": 7, "F": 1.5, "B": True},
         {"mode": UpdateMode.MERGE, "etag": etag, "match_condition": MatchConditions.IfNotModified}),
        ("upsert", {"PartitionKey": pk, "RowKey": "b", "Params": '{"tile": "h09v05"}'}, {"mode": UpdateMode.REPLACE}),
        ("create", {"PartitionKey": pk, "RowKey": "c", "Seq": 3}),
        ("delete", {"PartitionKey": pk, "RowKey": "gone"}),
    ]


def _rows(table: TableClient, pk: str) -> dict[str, dict]:
    return {r["RowKey"]: {k: v for k, v in r.items()} for r in table.query_entities(
        "PartitionKey eq @p", parameters={"p": pk})}


def test_a_transaction_writes_what_the_sdks_writes_and_returns_the_new_etags(
        tables: tuple[TableClient, TransactionTable]) -> None:
    sdk, lean = tables
    want = sdk.submit_transaction(_ops(sdk, "p1"))
    got = lean.submit_transaction(_ops(lean, "p1"))
    assert [set(m) for m in got] == [set(m) for m in want]  # an ETag for each write, none for the delete
    assert _rows(lean, "p1") == _rows(sdk, "p1")
    assert lean.get_entity("p1", "a").metadata["etag"] == got[0]["etag"]
    assert lean.get_entity("p1", "a")["T"] == datetime(2026, 11, 23, 6, 0, 1, 250000, tzinfo=UTC)


@pytest.mark.parametrize("break_it", ["stale etag", "missing row", "existing row"])
def test_a_failed_transaction_raises_the_sdks_error_and_changes_nothing(
        tables: tuple[TableClient, TransactionTable], break_it: str) -> None:
    errors = []
    for table in tables:
        pk = f"p-{break_it.replace(' ', '-')}"
        ops = _ops(table, pk)
        if break_it == "stale etag":
            table.update_entity({"PartitionKey": pk, "RowKey": "a", "Moved": True})
        elif break_it == "missing row":
            table.delete_entity(pk, "gone")
        else:
            table.create_entity({"PartitionKey": pk, "RowKey": "c"})
        before = _rows(table, pk)
        with pytest.raises(TableTransactionError) as caught:
            table.submit_transaction(ops)
        assert _rows(table, pk) == before, "nothing of a failed transaction is applied"
        errors.append(caught.value)
    sdk, lean = errors
    assert (lean.status_code, lean.error_code, lean.index) == (sdk.status_code, sdk.error_code, sdk.index)
    assert lean.index == {"stale etag": 0, "missing row": 3, "existing row": 2}[break_it]


def test_a_transaction_on_a_missing_table_fails_as_the_sdks_does(azurite: Azurite) -> None:
    service = TableServiceClient.from_connection_string(azurite.connection_string)
    errors = []
    for table in (service.get_table_client("nosuchtable"),
                  TransactionTable.from_connection_string(azurite.connection_string, table_name="nosuchtable")):
        with pytest.raises(TableTransactionError) as caught:
            table.submit_transaction([("upsert", {"PartitionKey": "p", "RowKey": "r"})])
        errors.append(caught.value)
    sdk, lean = errors
    assert (lean.status_code, lean.error_code, lean.index) == (sdk.status_code, sdk.error_code, sdk.index)
    assert lean.error_code == "TableNotFound"
