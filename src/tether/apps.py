"""Finding the user's application: a Harness, or a factory of one, named by an import path.

``tether worker --app myapp.main:harness``, the chaos harness's child workers and anything
else that starts from a command line name the application as ``package.module:attribute``.
"""

from __future__ import annotations

import importlib
import os
import sys

from tether.errors import ConfigurationError
from tether.harness import Harness


def load_harness(spec: str, store: str, store_given: bool = True) -> Harness:
    """Import ``module:attribute`` (``module`` alone means ``module:harness``): a Harness,
    or a factory called with the store URL.

    A Harness keeps the store it was built with unless *store_given* (``--store`` or
    ``TETHER_STORE``).
    """
    module_name, colon, attribute = spec.partition(":")
    attribute = attribute if colon else "harness"
    if not module_name or not attribute:
        raise ConfigurationError(f"--app {spec!r} must look like 'package.module:harness'"
                                 " (or 'package.module', whose harness is named harness)")
    sys.path.insert(0, os.getcwd())
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot load app {spec!r}: {exc}") from exc
    except Exception as exc:  # the app's own code failed as it was imported
        raise ConfigurationError(f"cannot load app {spec!r}: importing it raised"
                                 f" {type(exc).__name__}: {exc}") from exc
    if isinstance(target, Harness):
        if store_given:
            target.use_store(store)
        return target
    if callable(target):
        harness = target(store)
        if isinstance(harness, Harness):
            return harness
    raise ConfigurationError(f"app {spec!r} is neither a tether.Harness nor a factory returning one")
