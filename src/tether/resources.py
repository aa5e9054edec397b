"""External resources a task depends on: how to check they exist and how to clean them up (R8, R16).

A resource kind is a pair of small functions. ``temp_file`` and ``file`` are
built in; register others (an object-store prefix, a sandbox) on the harness
with :meth:`tether.Harness.resource_kind`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass

from tether.errors import ConfigurationError


@dataclass(frozen=True)
class ResourceKind:
    exists: Callable[[str], bool]
    cleanup: Callable[[str], None]


def _remove_path(ref: str) -> None:
    if os.path.isdir(ref):
        shutil.rmtree(ref, ignore_errors=True)
    elif os.path.exists(ref):
        os.remove(ref)


BUILTIN_KINDS: dict[str, ResourceKind] = {
    "temp_file": ResourceKind(exists=os.path.exists, cleanup=_remove_path),
    "file": ResourceKind(exists=os.path.exists, cleanup=lambda ref: None),
}


class ResourceKinds:
    """The registry of resource kinds a harness knows."""

    def __init__(self) -> None:
        self._kinds = dict(BUILTIN_KINDS)

    def register(self, name: str, kind: ResourceKind) -> None:
        self._kinds[name] = kind

    def get(self, name: str) -> ResourceKind:
        try:
            return self._kinds[name]
        except KeyError:
            raise ConfigurationError(
                f"resource kind {name!r} is not registered (known: {', '.join(sorted(self._kinds))})"
            ) from None
