"""How the command line prints: whatever a task holds is shown literally and harmlessly.

Task ids, inputs, results, errors, reasons and dialog rows come from agents, tools, senders
and older stores. Printed as they are, rich markup in them (``[INST] hi [/INST]``, ``[/]``)
would crash the command or restyle the terminal, and escape sequences (ESC, CSI, OSC, the C1
codes, bidi overrides) would act on the terminal instead of being read. So everything the CLI
prints goes through this module, and this module never parses markup:

- :func:`visible` is the one place data is made printable: every character that acts on a
  terminal instead of showing (Unicode categories Cc, Cf, Cs, Zl and Zp, except newline, tab
  and the zero-width joiner of emoji sequences) becomes a visible escape like ``\\x1b``;
- lines and tables are rich :class:`~rich.text.Text` built from parts (never markup), each
  part passed through :func:`visible`; styles come only from this module's callers;
- JSON keeps the data exact: what JSON leaves raw (C1 codes, bidi overrides, line
  separators) is written as ``\\u`` escapes, which decode to the same text.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import asdict, is_dataclass
from datetime import datetime
from typing import Any

import click
import orjson
from rich.console import Console
from rich.table import Table
from rich.text import Text

ACTING = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Unicode categories whose characters act on a terminal (or hide text) instead of showing."""
KEPT = frozenset("\n\t\u200d")
"""Characters of those categories kept as they are in multi-line text: newline, tab and the
zero-width joiner that holds emoji sequences together."""
_CANDIDATE = re.compile(r"[^\x20-\x7e]")
_JSON_CANDIDATE = re.compile(r"[^\x00-\x7e]")  # orjson already escapes C0 inside strings

Part = object | tuple[object, str]
"""A piece of a printed line: data, or (data, rich style)."""


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def visible(text: str, *, one_line: bool = False) -> str:
    """*text* with every character that would act on a terminal shown as an escape instead
    (``\\x1b``, ``\\u202e``); with *one_line*, newlines and tabs too."""
    def swap(match: re.Match[str]) -> str:
        ch = match.group()
        if (ch in KEPT and not one_line) or unicodedata.category(ch) not in ACTING:
            return ch
        return _escape(ch)

    return _CANDIDATE.sub(swap, text)


def shown(value: Any, *, one_line: bool = False, limit: int | None = None) -> str:
    """A value as a person reads it: text as it is, other data as compact JSON, made
    :func:`visible`, and cut to *limit* characters."""
    if isinstance(value, BaseException):
        value = str(value)
    elif not isinstance(value, str):
        try:
            value = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
        except TypeError:
            value = str(value)
    text = visible(value, one_line=one_line)
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def line(*parts: Part) -> Text:
    """A line of rich text from data parts, each shown literally (markup is never parsed)."""
    text = Text()
    for part in parts:
        value, style = part if isinstance(part, tuple) else (part, "")
        text.append(shown(value), style=style)
    return text


def console(stderr: bool = False) -> Console:
    """A console for one print: no markup, no emoji codes, no guessing of numbers or URLs to
    colour, and the terminal (and its width) as they are now."""
    return Console(markup=False, highlight=False, emoji=False, stderr=stderr)


def say(*parts: Part, err: bool = False) -> None:
    """Print one line (styled on a terminal); it is never wrapped, so ids stay whole."""
    console(err).print(line(*parts), soft_wrap=True)


def echo(*parts: object, err: bool = False) -> None:
    """Print one plain line (for output read by scripts: ids, receipts)."""
    click.echo("".join(shown(part) for part in parts), err=err)


def error(message: object) -> None:
    """The one line a failed command prints (exit status is the caller's)."""
    say(("error:", "red"), " ", message)


def table(headers: Iterable[str], rows: Iterable[Iterable[object]],
          no_wrap: Iterable[int] = (), cut: Iterable[int] = (), compact: bool = False) -> None:
    """Print a table whose cells are data, shown literally.

    Columns in *no_wrap* are never wrapped nor cut (ids, statuses); cells of columns in *cut*
    stay on one line, ended with an ellipsis where the column is too narrow, and those
    columns give up their width first. A *compact* table has no box, to fit 80 columns.
    """
    out = Table(*headers, box=None, pad_edge=False, header_style="bold underline") \
        if compact else Table(*headers)
    for index in no_wrap:
        out.columns[index].no_wrap = True
    one_line = frozenset(cut)
    for row in rows:
        out.add_row(*(Text(shown(cell, one_line=True), no_wrap=True, overflow="ellipsis")
                      if index in one_line else Text(shown(cell))
                      for index, cell in enumerate(row)))
    console().print(out)


def local_time(ts: Any) -> str:
    """A stored timestamp as local time; a value no calendar holds (an older store's deadline
    in the year 31 million, say) as the number it is."""
    if ts is None or ts == 0:  # 0: never set
        return "-"
    try:
        return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, ValueError, OSError, TypeError):
        return f"{ts!r} (not a date)" if not isinstance(ts, int | float) else f"{ts:g}"


def short_time(ts: Any, now: float | None = None) -> str:
    """A stored timestamp in few characters, as ``ls -l`` shows them: the time of day for
    today, month, day and time for this year, the date for older ones."""
    full = local_time(ts)
    if not isinstance(ts, int | float) or " " not in full:
        return full  # never set, or not a date
    when = datetime.fromtimestamp(ts)
    today = datetime.fromtimestamp(time.time() if now is None else now)
    if when.date() == today.date():
        return when.strftime("%H:%M:%S")
    return when.strftime("%b %d %H:%M" if when.year == today.year else "%Y-%m-%d")


def json_text(data: Any) -> str:
    """*data* as indented JSON that is safe on a terminal and decodes to the same data."""
    text = orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS
                        | orjson.OPT_PASSTHROUGH_DATACLASS, default=plain).decode()
    return _JSON_CANDIDATE.sub(_json_escape, text)


def _json_escape(match: re.Match[str]) -> str:
    ch = match.group()
    if ch != "\x7f" and unicodedata.category(ch) not in ACTING:
        return ch
    code = ord(ch)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # JSON spells characters beyond the BMP as a UTF-16 surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def print_json(data: Any) -> None:
    click.echo(json_text(data))


def plain(value: Any) -> Any:
    """Dataclasses as dicts, for JSON."""
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    raise TypeError


class VisibleLogs(logging.Handler):
    """Log records on stderr, made :func:`visible` (a reason or a traceback quoting task data
    is data too). Resolves stderr at each record, so it follows redirections."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            click.echo(visible(self.format(record)), err=True)
        except Exception:  # a log line must never take the worker down
            self.handleError(record)


@contextlib.contextmanager
def visible_logs(logger: logging.Logger) -> Iterator[None]:
    """While a command runs, print *logger*'s records through :class:`VisibleLogs` instead of
    Python's bare last-resort handler, unless the application configured logging itself
    (then its handlers decide)."""
    if logging.getLogger().handlers:
        yield
        return
    handler = VisibleLogs()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
