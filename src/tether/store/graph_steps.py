"""The store's LangGraph checkpoints as shared steps (:mod:`tether.store.graph_checkpoints`
says what is kept; :mod:`tether.store.steps` how steps run on each SQL backend)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from tether.errors import GraphBaseGone
from tether.store.graph_checkpoints import GraphBlob, GraphCheckpoint, GraphQuery, GraphWrite
from tether.store.rows import Row
from tether.store.steps import Statement, Steps, change, change_many, every, one

_CHECKPOINT_COLUMNS = ("thread_id, checkpoint_ns, checkpoint_id, parent_id, run_id, kind,"
                       " checkpoint, metadata_kind, metadata, versions, created_at")
PUT_CHECKPOINT = (
    f"INSERT INTO graph_checkpoints ({_CHECKPOINT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET"
    " parent_id = excluded.parent_id, run_id = excluded.run_id, kind = excluded.kind,"
    " checkpoint = excluded.checkpoint, metadata_kind = excluded.metadata_kind,"
    " metadata = excluded.metadata, versions = excluded.versions")
_BLOB_COLUMNS = "thread_id, checkpoint_ns, channel, version, root, base, keep_items, kind, value"
PUT_BLOB = (
    f"INSERT INTO graph_blobs ({_BLOB_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING")
"""A version names one value for good: a blob already stored is never rewritten (a put made
again, a retry, cannot turn it into what it extends, or into a chain that loops)."""
_WRITE_COLUMNS = ("thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, kind, value,"
                  " task_path")
_PUT_WRITE = (f"INSERT INTO graph_writes ({_WRITE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
              " ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)")
KEEP_WRITE = f"{_PUT_WRITE} DO NOTHING"
REPLACE_WRITE = (f"{_PUT_WRITE} DO UPDATE SET channel = excluded.channel, kind = excluded.kind,"
                 " value = excluded.value, task_path = excluded.task_path")
WRITES_OF = ("SELECT task_id, idx, channel, kind, value, task_path FROM graph_writes"
             " WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?")
BLOB_PRESENT = ("SELECT version FROM graph_blobs WHERE thread_id = ? AND checkpoint_ns = ? AND"
                " channel = ? AND version = ?")
BLOBS_OF = ("SELECT channel, version, base FROM graph_blobs WHERE thread_id = ? AND"
            " checkpoint_ns = ? ORDER BY channel, version")
BLOB_AT = (f"SELECT {_BLOB_COLUMNS} FROM graph_blobs"
           " WHERE thread_id = ? AND checkpoint_ns = ? AND channel = ? AND version = ?")
CHAIN = (f"SELECT {_BLOB_COLUMNS} FROM graph_blobs WHERE thread_id = ? AND checkpoint_ns = ?"
         " AND channel = ? AND root = ?")
NAMESPACES = "SELECT DISTINCT checkpoint_ns FROM graph_checkpoints WHERE thread_id = ?"
NEWEST_FIRST = ("SELECT checkpoint_id FROM graph_checkpoints WHERE thread_id = ? AND"
                " checkpoint_ns = ? ORDER BY checkpoint_id DESC")
VERSIONS_OF = ("SELECT versions FROM graph_checkpoints WHERE thread_id = ? AND checkpoint_ns = ?")
DROP_CHECKPOINT = ("DELETE FROM graph_checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND"
                   " checkpoint_id = ?")
DROP_WRITES_OF = ("DELETE FROM graph_writes WHERE thread_id = ? AND checkpoint_ns = ? AND"
                  " checkpoint_id = ?")
DROP_BLOB = ("DELETE FROM graph_blobs WHERE thread_id = ? AND checkpoint_ns = ? AND channel = ?"
             " AND version = ?")
OF_RUN = "SELECT thread_id, checkpoint_ns, checkpoint_id FROM graph_checkpoints WHERE run_id = ?"
DROP_THREAD = tuple(f"DELETE FROM {table} WHERE thread_id = ?"
                    for table in ("graph_writes", "graph_blobs", "graph_checkpoints"))
COPY_THREAD = (
    f"INSERT INTO graph_checkpoints ({_CHECKPOINT_COLUMNS}) SELECT ?, checkpoint_ns,"
    " checkpoint_id, parent_id, run_id, kind, checkpoint, metadata_kind, metadata, versions,"
    " created_at FROM graph_checkpoints WHERE thread_id = ? ON CONFLICT DO NOTHING",
    f"INSERT INTO graph_blobs ({_BLOB_COLUMNS}) SELECT ?, checkpoint_ns, channel, version, root,"
    " base, keep_items, kind, value FROM graph_blobs WHERE thread_id = ? ON CONFLICT DO NOTHING",
    f"INSERT INTO graph_writes ({_WRITE_COLUMNS}) SELECT ?, checkpoint_ns, checkpoint_id,"
    " task_id, idx, channel, kind, value, task_path FROM graph_writes WHERE thread_id = ?"
    " ON CONFLICT DO NOTHING")


def put(checkpoint: GraphCheckpoint, blobs: Sequence[GraphBlob], now: float,
        keep: int | None = None) -> Steps[set[str]]:
    """The checkpoint and its blobs, and with *keep* the namespace pruned to that many
    checkpoints, in the same transaction; returns the channels whose version was stored
    already (kept as it was). A blob adding to a base is written only if the base is there, held
    (PostgreSQL: locked, in the order :func:`_collect_blobs` locks) until the transaction
    ends, so a prune cannot drop it meanwhile."""
    c = checkpoint
    for blob in sorted(blobs, key=lambda b: (b.channel, b.base or "")):
        if blob.base is not None and (yield one(BLOB_PRESENT, c.thread_id, c.namespace,
                                                blob.channel, blob.base, lock=True)) is None:
            raise GraphBaseGone(f"LangGraph thread {c.thread_id!r}: version {blob.base} of"
                                f" channel {blob.channel!r} is gone; nothing was written")
    yield change(PUT_CHECKPOINT, c.thread_id, c.namespace, c.checkpoint_id, c.parent_id,
                 c.run_id, c.checkpoint[0], c.checkpoint[1], c.metadata[0], c.metadata[1],
                 orjson.dumps(c.versions).decode(), now)
    kept: set[str] = set()
    for b in blobs:
        if not (yield change(PUT_BLOB, c.thread_id, c.namespace, b.channel, b.version, b.root,
                             b.base, b.keep, b.value[0], b.value[1])):
            kept.add(b.channel)
    if keep is not None:
        yield from _prune_namespace(c.thread_id, c.namespace, keep)
    return kept


def put_writes(thread_id: str, namespace: str, checkpoint_id: str,
               writes: Sequence[GraphWrite]) -> Steps[None]:
    for sql, chosen in ((KEEP_WRITE, [w for w in writes if w.index >= 0]),
                        (REPLACE_WRITE, [w for w in writes if w.index < 0])):
        if chosen:
            yield change_many(sql, [(thread_id, namespace, checkpoint_id, w.task_id, w.index,
                                     w.channel, w.value[0], w.value[1], w.task_path)
                                    for w in chosen])


def checkpoints(query: GraphQuery) -> Steps[list[GraphCheckpoint]]:
    found: list[Row] = yield _select(query)
    whole = []
    for row in found:
        whole.append((yield from _whole(row)))
    return whole


def _select(query: GraphQuery) -> Statement:
    """The checkpoint rows *query* names, newest first (ids are time-ordered: uuid6)."""
    where, params = [], []
    for clause, value in (("thread_id = ?", query.thread_id),
                          ("checkpoint_ns = ?", query.namespace),
                          ("checkpoint_id = ?", query.checkpoint_id),
                          ("checkpoint_id < ?", query.before)):
        if value is not None:
            where.append(clause)
            params.append(value)
    sql = f"SELECT {_CHECKPOINT_COLUMNS} FROM graph_checkpoints"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY checkpoint_id DESC, thread_id, checkpoint_ns"
    if query.limit is not None:
        sql += f" LIMIT {max(int(query.limit), 0)}"
    return every(sql, *params)


def _whole(row: Row) -> Steps[GraphCheckpoint]:
    """A checkpoint row with its writes and the blobs it reads (whole chains)."""
    thread_id, namespace = row["thread_id"], row["checkpoint_ns"]
    versions: dict[str, str] = orjson.loads(row["versions"])
    writes = yield every(WRITES_OF, thread_id, namespace, row["checkpoint_id"])
    blobs: dict[tuple[str, str], GraphBlob] = {}
    for channel, version in versions.items():
        at = yield one(BLOB_AT, thread_id, namespace, channel, version)
        if at is None:
            continue
        blob = _blob(at)
        blobs[(channel, version)] = blob
        if blob.base is not None:
            chain = yield every(CHAIN, thread_id, namespace, channel, blob.root)
            blobs.update(((channel, b.version), b) for b in map(_blob, chain))
    return GraphCheckpoint(
        thread_id, namespace, row["checkpoint_id"], row["parent_id"],
        (row["kind"], bytes(row["checkpoint"])), (row["metadata_kind"], bytes(row["metadata"])),
        versions, row["run_id"],
        [GraphWrite(w["task_id"], int(w["idx"]), w["channel"], (w["kind"], bytes(w["value"])),
                    w["task_path"]) for w in writes], blobs)


def _blob(row: Row) -> GraphBlob:
    return GraphBlob(row["channel"], row["version"], (row["kind"], bytes(row["value"])),
                     row["root"], row["base"], int(row["keep_items"] or 0))


def delete_threads(thread_ids: Sequence[str]) -> Steps[None]:
    for thread_id in thread_ids:
        for sql in DROP_THREAD:
            yield change(sql, thread_id)


def copy_thread(source: str, target: str) -> Steps[None]:
    for sql in COPY_THREAD:
        yield change(sql, target, source)


def delete_runs(run_ids: Sequence[str]) -> Steps[None]:
    touched: set[tuple[str, str]] = set()
    for run_id in run_ids:
        rows = yield every(OF_RUN, run_id)
        for row in rows:
            key = (row["thread_id"], row["checkpoint_ns"], row["checkpoint_id"])
            yield change(DROP_WRITES_OF, *key)
            yield change(DROP_CHECKPOINT, *key)
            touched.add(key[:2])
    for thread_id, namespace in sorted(touched):
        yield from _collect_blobs(thread_id, namespace)


def prune(thread_ids: Sequence[str], keep: int) -> Steps[None]:
    for thread_id in thread_ids:
        namespaces = yield every(NAMESPACES, thread_id)
        for namespace in sorted(row["checkpoint_ns"] for row in namespaces):
            yield from _prune_namespace(thread_id, namespace, keep)


def _prune_namespace(thread_id: str, namespace: str, keep: int) -> Steps[None]:
    newest = yield every(NEWEST_FIRST, thread_id, namespace)
    for row in newest[max(keep, 0):]:
        yield change(DROP_WRITES_OF, thread_id, namespace, row["checkpoint_id"])
        yield change(DROP_CHECKPOINT, thread_id, namespace, row["checkpoint_id"])
    yield from _collect_blobs(thread_id, namespace)


def _collect_blobs(thread_id: str, namespace: str) -> Steps[None]:
    """Drop the namespace's blobs no checkpoint left reads, directly or as a base. The blobs
    are locked first (PostgreSQL), then the checkpoints read: a put holding a base it adds
    to has committed by then, and its checkpoint is seen. Only blobs that locked read found
    may be dropped: one stored after it belongs to a checkpoint the next read may miss."""
    stored = yield Statement(BLOBS_OF, (thread_id, namespace), "all", lock=True)
    read = yield every(VERSIONS_OF, thread_id, namespace)
    bases = {(row["channel"], row["version"]): row["base"] for row in stored}
    wanted = _reached(bases, ((channel, version) for row in read
                              for channel, version in orjson.loads(row["versions"]).items()))
    dropped = [(thread_id, namespace, *key) for key in bases if key not in wanted]
    if dropped:
        yield change_many(DROP_BLOB, dropped)


def _reached(bases: dict[tuple[str, str], Any], start: Iterable[tuple[str, str]]
             ) -> set[tuple[str, str]]:
    """The blobs *start* names and every blob they extend, transitively."""
    reached: set[tuple[str, str]] = set()
    for key in start:
        while key in bases and key not in reached:
            reached.add(key)
            base = bases[key]
            if base is None:
                break
            key = (key[0], base)
    return reached
