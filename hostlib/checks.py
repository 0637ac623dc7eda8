"""Value checks for every configuration edge: the controller's TOML, topology files, command lines.

A check is a small callable ``check(value, field) -> value`` that returns the value in its canonical type
(an ``int`` where a float is wanted becomes a ``float``, a list becomes a tuple) or raises ``CheckError``,
whose message is one line naming the field::

    >>> integer(ge=0)("x", "[controller] counters_every")
    CheckError: [controller] counters_every: expected an integer >= 0, got 'x'

Configuration modules keep one table of ``{key: check}`` per section, so a new key is one line. ``arg(check)``
turns a check into an argparse ``type=`` and ``OneLineParser`` reports every command-line mistake as one
line on stderr with exit status 2 (argparse's default prints the whole usage first). Standard library only:
hostlib uses it too.
"""
from __future__ import annotations

import argparse
import difflib
import ipaddress
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NoReturn, Sequence

Check = Callable[[Any, str], Any]


class CheckError(ValueError):
    """A value failed its check; ``str()`` is ``"<field>: <what is wrong>"``, one line."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}" if field else problem)


def _got(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _num(v) -> str:
    return str(v) if isinstance(v, int) else f"{v:g}"


def _bounds(ge=None, gt=None, le=None, lt=None) -> str:
    parts = []
    for op, bound in ((">", gt), (">=", ge), ("<", lt), ("<=", le)):
        if bound is not None:
            parts.append(f"{op} {_num(bound)}")
    return " and ".join(parts)


def _in_range(value, ge, gt, le, lt) -> bool:
    return ((ge is None or value >= ge) and (gt is None or value > gt)
            and (le is None or value <= le) and (lt is None or value < lt))


def integer(*, ge: int | None = None, gt: int | None = None, le: int | None = None,
            lt: int | None = None) -> Check:
    """An integer (not a bool, not a float) within the bounds."""
    want = "an integer" + (" " + _bounds(ge, gt, le, lt) if (ge, gt, le, lt) != (None,) * 4 else "")

    def check(value, field):
        if isinstance(value, bool) or not isinstance(value, int):
            raise CheckError(field, f"expected {want}, got {_got(value)}")
        if not _in_range(value, ge, gt, le, lt):
            raise CheckError(field, f"expected {want}, got {value}")
        return value
    return check


def number(*, ge: float | None = None, gt: float | None = None, le: float | None = None,
           lt: float | None = None) -> Check:
    """A finite real number (int or float, not a bool) within the bounds; returned as a float."""
    want = "a number" + (" " + _bounds(ge, gt, le, lt) if (ge, gt, le, lt) != (None,) * 4 else "")

    def check(value, field):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CheckError(field, f"expected {want}, got {_got(value)}")
        if not math.isfinite(value) or not _in_range(value, ge, gt, le, lt):
            raise CheckError(field, f"expected {want}, got {value:g}")
        return float(value)
    return check


def fraction() -> Check:
    """A number in [0, 1] (MSRs, TLRs, loss rates)."""
    return number(ge=0.0, le=1.0)


def boolean() -> Check:
    """``true`` or ``false`` (a TOML/YAML/JSON boolean; 0, 1 and strings are refused)."""
    def check(value, field):
        if not isinstance(value, bool):
            raise CheckError(field, f"expected true or false, got {_got(value)}")
        return value
    return check


def string(*, nonempty: bool = True) -> Check:
    def check(value, field):
        if not isinstance(value, str):
            raise CheckError(field, f"expected a string, got {_got(value)}")
        if nonempty and not value:
            raise CheckError(field, "must not be empty")
        return value
    return check


def choice(options: Iterable[str]) -> Check:
    """One of ``options``, with the closest one suggested on a typo."""
    options = tuple(options)

    def check(value, field):
        if value not in options:
            close = difflib.get_close_matches(str(value), options, n=1, cutoff=0.5)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise CheckError(field, f"{_got(value)} is not one of {', '.join(options)}.{hint}")
        return value
    return check


def optional(inner: Check) -> Check:
    """``None`` or a value passing ``inner``."""
    def check(value, field):
        return None if value is None else inner(value, field)
    return check


def sequence(inner: Check, *, length: int | None = None, min_length: int = 0) -> Check:
    """A list (or tuple) whose every item passes ``inner``; returned as a tuple."""
    def check(value, field):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise CheckError(field, f"expected a list, got {_got(value)}")
        if length is not None and len(value) != length:
            raise CheckError(field, f"expected {length} values, got {len(value)}")
        if len(value) < min_length:
            raise CheckError(field, f"expected at least {min_length} value(s), got {len(value)}")
        return tuple(inner(v, f"{field}[{i}]") for i, v in enumerate(value))
    return check


def mapping(key: Check, value: Check) -> Check:
    """A table whose keys and values pass their checks; returned as a dict."""
    def check(table, field):
        if not isinstance(table, Mapping):
            raise CheckError(field, f"expected a table, got {_got(table)}")
        return {key(k, f"{field} key"): value(v, f"{field}.{k}") for k, v in table.items()}
    return check


def either(*checks: Check, want: str) -> Check:
    """The first of ``checks`` the value passes; else ``expected <want>``."""
    def check(value, field):
        for c in checks:
            try:
                return c(value, field)
            except CheckError:
                pass
        raise CheckError(field, f"expected {want}, got {_got(value)}")
    return check


def port(*, allow: Sequence[int] = ()) -> Check:
    """A TCP/UDP port 1..65535, or one of the special values in ``allow`` (0: any free port, -1: off)."""
    special = f" (or {', '.join(str(a) for a in sorted(allow))})" if allow else ""

    def check(value, field):
        if isinstance(value, bool) or not isinstance(value, int) or not (1 <= value <= 65535 or value in allow):
            raise CheckError(field, f"expected a port 1..65535{special}, got {_got(value)}")
        return value
    return check


def ip_address() -> Check:
    """An IPv4 or IPv6 address as text (``0.0.0.0`` binds every address)."""
    def check(value, field):
        if not isinstance(value, str):
            raise CheckError(field, f"expected an IP address, got {_got(value)}")
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise CheckError(field, f"{value!r} is not an IP address") from None
        return value
    return check


def _is_host(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        labels = text.rstrip(".").split(".")
        return bool(text) and len(text) <= 253 and all(
            0 < len(label) <= 63 and label[0] != "-" and label[-1] != "-"
            and all(c.isascii() and (c.isalnum() or c == "-") for c in label) for label in labels)


def host() -> Check:
    """An IP address or a host name (``0.0.0.0`` binds every address)."""
    def check(value, field):
        if not isinstance(value, str) or not _is_host(value):
            raise CheckError(field, f"expected an IP address or host name, got {_got(value)}")
        return value
    return check


def host_port() -> Check:
    """``host:port`` (a gRPC address): any host name or address, a port 1..65535."""
    def check(value, field):
        if not isinstance(value, str):
            raise CheckError(field, f"expected HOST:PORT, got {_got(value)}")
        name, sep, p = value.rpartition(":")
        name = name[1:-1] if name.startswith("[") and name.endswith("]") else name  # [::1]:9559
        if not sep or not _is_host(name) or not p.isdigit() or not 1 <= int(p) <= 65535:
            raise CheckError(field, f"expected HOST:PORT with a port 1..65535, got {value!r}")
        return value
    return check


def mac_address() -> Check:
    def check(value, field):
        parts = value.split(":") if isinstance(value, str) else []
        if len(parts) != 6 or not all(len(p) == 2 and all(c in "0123456789abcdefABCDEF" for c in p) for p in parts):
            raise CheckError(field, f"expected a MAC address like 02:00:00:00:00:01, got {_got(value)}")
        return value
    return check


def output_file(*, create_dirs: bool = False) -> Check:
    """A path a file can be written to now: not a directory, writable if it exists, in a writable directory
    (``create_dirs``: a directory the writer will create, below a writable one). Checked before a job starts, so
    its result is not lost at the end. Returns a ``Path``."""
    def check(value, field):
        if not isinstance(value, (str, os.PathLike)) or not str(value):
            raise CheckError(field, f"expected a file name, got {_got(value)}")
        path = Path(value)
        if path.is_dir():
            raise CheckError(field, f"{str(path)!r} is a directory")
        if path.exists() and not os.access(path, os.W_OK):
            raise CheckError(field, f"{str(path)!r} is not writable")
        parent = path.absolute().parent
        if create_dirs:
            while not parent.exists() and parent != parent.parent:
                parent = parent.parent
        if not parent.is_dir():
            what = "is not a directory" if parent.exists() else "does not exist"
            raise CheckError(field, f"cannot write {str(path)!r}: {str(parent)!r} {what}")
        try:  # os.access says yes to root everywhere (/proc, read-only mounts): create a file to be sure
            with tempfile.NamedTemporaryFile(dir=parent, prefix=".write-check-"):
                pass
        except OSError as e:
            raise CheckError(field, f"cannot write {str(path)!r}: directory {str(parent)!r}: {e.strerror}") from None
        return path
    return check


def check_table(table: Mapping[str, Any], checks: Mapping[str, Check], where: str) -> dict[str, Any]:
    """Every key of ``table`` that ``checks`` knows, checked (``"<where> <key>"`` names it in errors); other
    keys are passed through unchanged (the caller reports unknown keys its own way)."""
    return {k: (checks[k](v, f"{where} {k}".strip()) if k in checks else v) for k, v in table.items()}


# --- command lines ------------------------------------------------------------------------------------------


def arg(check: Check, convert: Callable[[str], Any] | None = None) -> Callable[[str], Any]:
    """An argparse ``type=``: ``convert`` the text (default: int, else float, as the check wants), then check
    it. argparse names the option in the message (``argument --epoch-ms: expected a number > 0, got -5``)."""
    def parse(text: str):
        value: Any = text
        if convert is not None:
            try:
                value = convert(text)
            except ValueError as e:
                raise argparse.ArgumentTypeError(str(e).splitlines()[0] if str(e) else f"bad value {text!r}") from None
        else:
            for conv in (int, float):
                try:
                    value = conv(text)
                    break
                except ValueError:
                    pass
        try:
            return check(value, "")
        except CheckError as e:
            raise argparse.ArgumentTypeError(e.problem) from None
    parse.__name__ = "value"
    return parse


_NO_DEFAULT_ACTIONS = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction,
                       argparse._CountAction, argparse._HelpAction, argparse._VersionAction, argparse._AppendAction,
                       argparse._AppendConstAction)


def states_default(action: argparse.Action) -> bool:
    """Whether ``--help`` tells an option's default: its text says it, or the option has none to tell (a flag,
    a repeatable option, a required one, a positional argument)."""
    if not action.option_strings or action.required or isinstance(action, _NO_DEFAULT_ACTIONS):
        return True
    return "default" in (action.help or "").lower()


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends ``(default X)`` to an option's help when the text does not say its default itself and there is
    one to say (a flag's or ``None`` is said in words, by the help text)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if states_default(action) or action.default in (None, argparse.SUPPRESS) or action.default == []:
            return text
        return f"{text} (default %(default)s)" if text else "default %(default)s"


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a mistake is one line on stderr (``prog: error: argument --x: ...``), exit status 2; ``--help``
    states every option's default (``DefaultsHelpFormatter``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


def one_line(message: object) -> str:
    """``message`` with its line breaks and runs of spaces folded: an error report is one line."""
    return " ".join(str(message).split())


def fail(prog: str, message: object) -> NoReturn:
    """Report a configuration error as one line on stderr and exit with status 2 (command-line entry points)."""
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr)
    raise SystemExit(2)
