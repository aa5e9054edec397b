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

User data is never markup (issue 26). A head carries what users sent (an event's
payload in ``frame.last_event``, a tool's result, a task's input, signals, scratch), and
any of it may be an object shaped like a reference. So the key ``$tether_blob`` is
reserved in stored heads: every head is escaped when it is written, whatever its size
(a key made of one or more ``$`` then ``tether_blob`` gets one ``$`` more), and
unescaped when it is resolved (one ``$`` less). In a stored head only a reference has the
key with a single ``$``; payload content cannot forge one. A head that holds no such
key costs one byte search on write and on load, as before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from typing import Any, Protocol

import orjson

from tether.errors import CorruptSnapshot

REF = "$tether_blob"
_NAME = REF[1:]  # "tether_blob"
_REF_MARKER = b'"$tether_blob"'
"""A stored head refers to large values only if it holds these bytes."""
_MARKER = b'tether_blob":'
"""Any key a head must escape (on write) or unescape (on load) ends so: a head without
these bytes is stored and loaded exactly as it is, unparsed. (orjson writes ``$`` and the
name as they are, never as ``\\u`` escapes, a key followed by ``:`` and nothing else, and a
``"`` inside a string as ``\\"``: no string value can hold these bytes.)"""


def _reserved(key: Any) -> bool:
    """Whether *key* is one or more ``$`` then ``tether_blob`` (what escaping shifts)."""
    return isinstance(key, str) and key.endswith(_NAME) and len(key) > len(_NAME) \
        and key[: -len(_NAME)].strip("$") == ""


def escape_key(key: Any) -> Any:
    """A key of user data as it is stored: ``$tether_blob`` -> ``$$tether_blob``, and so on."""
    return "$" + key if _reserved(key) else key


def unescape_key(key: Any) -> Any:
    """A stored key of user data as it was: ``$$tether_blob`` -> ``$tether_blob``, and so
    on (a single-``$`` key is a reference, never user data, and is not passed here)."""
    return key[1:] if _reserved(key) and key != REF else key


def split(raw: Any, threshold: int) -> tuple[Any, dict[str, bytes]]:
    """*raw* (a head as loaded, user data in it) as it is stored: every string longer than
    *threshold* bytes replaced by a reference, and every reserved key escaped; with the
    blobs the references name."""
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
            return {escape_key(key): walk(item) for key, item in value.items()}
        if isinstance(value, list):
            return [walk(item) for item in value]
        return value

    return walk(raw), blobs


def layered(head: bytes, threshold: int) -> tuple[bytes, dict[str, bytes]]:
    """A head ready to store, and the blobs it refers to. Free for a head below the
    threshold that holds no reserved key (no string in it can be larger than the whole);
    one that does is escaped all the same."""
    if len(head) <= threshold:
        if _MARKER not in head:
            return head, {}
        threshold = len(head)  # nothing to store apart: only the keys to escape
    raw, blobs = split(orjson.loads(head), threshold)
    if not blobs and _MARKER not in head:
        return head, {}
    return orjson.dumps(raw, option=orjson.OPT_NON_STR_KEYS), blobs


def references(head: bytes) -> set[str]:
    """The blob digests a stored head refers to (none, cheaply, for almost every head)."""
    if _REF_MARKER not in head:
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
    """The stored head as it was before :func:`layered`: every reference replaced by its
    value again, every escaped key unescaped."""
    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            digest = value.get(REF)
            if isinstance(digest, str):
                if digest not in blobs:
                    raise CorruptSnapshot(f"task {task_id} version {version}: large value"
                                          f" {digest} is missing from the blob table")
                return blobs[digest].decode()
            return {unescape_key(key): walk(item) for key, item in value.items()}
        if isinstance(value, list):
            return [walk(item) for item in value]
        return value

    return orjson.dumps(walk(orjson.loads(head)), option=orjson.OPT_NON_STR_KEYS)


class HeadSource(Protocol):
    """Where heads and their large values are read from (any store)."""

    async def load_head(self, task_id: str, version: int | None = None) -> tuple[int, bytes]: ...

    async def load_blobs(self, digests: Collection[str]) -> dict[str, bytes]: ...


async def resolve(store: HeadSource, head: bytes, task_id: str, version: int) -> bytes:
    """A stored head made whole: its references replaced by the values from the blob table,
    its escaped keys unescaped (a head with neither is returned as it is)."""
    if _MARKER not in head:
        return head
    digests = references(head)
    return join(head, await store.load_blobs(digests) if digests else {}, task_id, version)


async def load_head(store: HeadSource, task_id: str, version: int | None = None) -> tuple[int, bytes]:
    """``Store.load_head`` for a head that is going to be used: with its large values."""
    version, head = await store.load_head(task_id, version)
    return version, await resolve(store, head, task_id, version)
