"""NEGATIVE CONTROL ONLY: tether with issue 26's protections switched off, in this process.

``python -m tests.chaos._levers_unsafe <tether CLI arguments>`` patches, then runs the
``tether`` command line (a worker, say); the lever console calls :func:`install` itself when
``LEVERS_UNSAFE=1`` (and then writes a person's decision through the protocol, past
``Harness.decide``'s refusal of a call in flight). What is switched off:

- ``tether.engine.calls.decision_applies``: a queued decision applies to whatever call is in
  doubt when it is applied, whatever became of the call the person looked at (its key,
  attempt and branch are not compared). It still needs *a* call in doubt: with none, the
  engine's own assertion would fail and the worker retry the lever for ever (seen with a bare
  ``lambda snap, payload: None``: 1,298 versions in a minute), which tests nothing;
- ``tether.engine.forking.own_key``: a fork's copied calls keep their source's idempotency
  keys (``lambda fork_id, key: key``).

A name this tether does not have (an older engine) is left alone and reported on stderr.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any


def _applies_to_any_call_in_doubt(snap: Any, payload: Any) -> str | None:
    call = snap.call
    if call is None or str(call.status) != "started":
        return "no call is in doubt (checked even by the negative control)"
    return None


PATCHES: dict[tuple[str, str], Any] = {
    ("tether.engine.calls", "decision_applies"): _applies_to_any_call_in_doubt,
    ("tether.engine.forking", "own_key"): lambda fork_id, key: key,
}


def install() -> list[str]:
    """Apply the patches everywhere the originals are bound; the names patched."""
    import tether.cli.main
    import tether.harness  # noqa: F401

    patched = []
    for (module_name, name), unsafe in PATCHES.items():
        module = importlib.import_module(module_name)
        original = getattr(module, name, None)
        if original is None:
            print(f"levers-unsafe: {module_name}.{name} does not exist here; not patched",
                  file=sys.stderr)
            continue
        for loaded in list(sys.modules.values()):
            if getattr(loaded, "__name__", "").startswith("tether") \
                    and getattr(loaded, name, None) is original:
                setattr(loaded, name, unsafe)
        patched.append(f"{module_name}.{name}")
    return patched


def main(argv: list[str]) -> int:
    install()
    from tether.cli.main import main as cli

    try:
        cli.main(args=argv, prog_name="tether", standalone_mode=True)
    except SystemExit as done:
        return int(done.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
