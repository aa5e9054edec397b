"""Layered snapshots (R20): large values are stored apart from the head, once per content.

A snapshot head is written at every step and kept for ``keep_versions`` versions. A
task that carries a document, an image or a base64 payload in its input, scratch or
last tool result would otherwise copy it into every version. Instead, any string
longer than ``Settings.blob_threshold`` is replaced in the stored head by a reference
``{"$tether_blob": "sha256:...", "bytes": n}`` and stored once in the store's blob table
(content-addressed: the same value in a hundred versions or tasks is one row).

Heads stay small, so listing, showing and claiming tasks never read the large values.
The references are resolved when a snapshot is loaded to be used (a runner picking
the task up, a rollback, an export); a reference whose blob is missing makes that
version unreadable by name (:class:`CorruptSnapshot`), and recovery falls back to an
older version, as for any damaged head.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from typing import Any, Protocol

import orjson

from tether.errors import CorruptSnapshot

REF = "$tether_blob"
_MARKER = b'"$tether_blob"'


def split(raw: Any, threshold: int) -> tuple[Any, dict[str, bytes]]:
    """Replace every string longer than *threshold* bytes by a reference; return the blobs."""
    blobs: dict[str, bytes] = {}

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            if len(value) <= threshold // 4:  # at most 4 UTF-8 bytes a character: surely small
                return value
            data = value.encode()
            if len(data) <= threshold:
                return value
            digest = "sha256:" + hashlib.sha256(data).hexdigest()
            blobs[digest] = data
            return {REF: digest, "bytes": len(data)}
        if isinstance(value, dict):
            return {key: walk(item) for key, item in value.items()}
        if isinstance(value, list):
            return [walk(item) for item in value]
        return value

    return walk(raw), blobs


def layered(head: bytes, threshold: int) -> tuple[bytes, dict[str, bytes]]:
    """A head ready to store, and the blobs it refers to. Free for a head below the
    threshold: no string in it can be larger than the whole."""
    if len(head) <= threshold:
        return head, {}
    raw, blobs = split(orjson.loads(head), threshold)
    if not blobs:
        return head, {}
    return orjson.dumps(raw, option=orjson.OPT_NON_STR_KEYS), blobs


def references(head: bytes) -> set[str]:
    """The blob digests a stored head refers to (none, cheaply, for almost every head)."""
    if _MARKER not in head:
        return set()
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if isinstance(value.get(REF), str):
                found.add(value[REF])
                return
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(orjson.loads(head))
    return found


def join(head: bytes, blobs: Mapping[str, bytes], task_id: str, version: int) -> bytes:
    """The head with every reference replaced by its value again."""
    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            digest = value.get(REF)
            if isinstance(digest, str):
                if digest not in blobs:
                    raise CorruptSnapshot(f"task {task_id} version {version}: large value"
                                          f" {digest} is missing from the blob table")
                return blobs[digest].decode()
            return {key: walk(item) for key, item in value.items()}
        if isinstance(value, list):
            return [walk(item) for item in value]
        return value

    return orjson.dumps(walk(orjson.loads(head)), option=orjson.OPT_NON_STR_KEYS)


class HeadSource(Protocol):
    """Where heads and their large values are read from (any store)."""

    async def load_head(self, task_id: str, version: int | None = None) -> tuple[int, bytes]: ...

    async def load_blobs(self, digests: Collection[str]) -> dict[str, bytes]: ...


async def resolve(store: HeadSource, head: bytes, task_id: str, version: int) -> bytes:
    """A stored head made whole: its references replaced by the values from the blob table."""
    digests = references(head)
    if not digests:
        return head
    return join(head, await store.load_blobs(digests), task_id, version)


async def load_head(store: HeadSource, task_id: str, version: int | None = None) -> tuple[int, bytes]:
    """``Store.load_head`` for a head that is going to be used: with its large values."""
    version, head = await store.load_head(task_id, version)
    return version, await resolve(store, head, task_id, version)
