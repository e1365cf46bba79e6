"""Turning exceptions into one-line messages that are safe to log and to answer with,
and keeping secrets out of every text the service prints, logs or answers.

A database URL carries its password (``postgresql+psycopg://user:password@host/db``),
and ``switchboard serve`` printed it whole when the database could not be reached, at
every restart of a crash loop. Everything that shows a URL or an error's text goes
through :func:`redact` here:

- a URL's password (``scheme://user:PASSWORD@``) and a libpq ``password=`` setting are
  replaced by ``***`` wherever they appear;
- so is each registered secret (:func:`protect`: the database password and the admin
  token), in whatever text it turns up (a driver quoting its connection string);
- :func:`install_log_redaction` applies the same to every log record of the process,
  tracebacks included;
- :func:`install_exception_redaction` to what Python prints by itself, without
  logging: an uncaught exception in the main thread or another thread, and one raised
  where nothing can catch it (a ``__del__``); :func:`redacting_exception_handler` to
  asyncio's errors that nothing awaited (a task's exception never retrieved).

Secrets shorter than ``MIN_SECRET`` characters are masked only where the two patterns
find them: replacing every "ab" in every message would garble the log and protect
nothing a guess would not find.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import threading
import traceback
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, unquote

MASK = "***"
MIN_SECRET = 4

# scheme://user:password@ (the password up to the last @ before a space or quote: a
# password may hold a raw @); and libpq's key=value form, quoted or not
_URL_PASSWORD = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^:/?#@\s'\"]*:)(?P<password>[^\s'\"]*)@"
)
_KEYWORD_PASSWORD = re.compile(
    r"(?P<head>\bpassword\s*=\s*)(?P<password>'(?:[^'\\]|\\.)*'|[^\s'\"&]+)", re.IGNORECASE
)

_secrets: set[str] = set()


def redact(text: str) -> str:
    """``text`` with every password and registered secret replaced by ``***``."""
    if "://" in text:
        text = _URL_PASSWORD.sub(lambda m: f"{m['head']}{MASK}@", text)
    if "=" in text:
        text = _KEYWORD_PASSWORD.sub(lambda m: f"{m['head']}{MASK}", text)
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def register_secret(secret: str | None) -> None:
    """Mask ``secret`` in everything :func:`redact` sees from now on (as it is, and as
    it would be written percent-encoded in a URL)."""
    if not secret or len(secret) < MIN_SECRET:
        return
    _secrets.update({secret, quote(secret, safe=""), unquote(secret)})


def database_passwords(url: str) -> list[str]:
    """The passwords in a database URL: its own, and a ``?password=`` (none for a URL
    that cannot be parsed: the URL pattern of :func:`redact` still masks it)."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:
        return []
    found = [parsed.password, parsed.query.get("password")]
    return [str(p) for p in found if isinstance(p, str) and p]


def protect(database_url: str, *secrets: str | None) -> None:
    """Register the database URL's passwords and ``secrets``, and redact the log."""
    for password in database_passwords(database_url):
        register_secret(password)
    for secret in secrets:
        register_secret(secret)
    install_log_redaction()


def shown_url(url: str) -> str:
    """A database URL for a person to read: password hidden, SQLite path absolute."""
    from pathlib import Path

    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:
        return redact(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        return f"sqlite:///{Path(parsed.database).expanduser().resolve()}"
    return redact(parsed.render_as_string(hide_password=True))


def first_line(error: BaseException | str | None, limit: int = 200) -> str:
    """The first non-empty line of an error's text (its type name when it has none),
    redacted: ``str(exc).splitlines()[0]`` fails on an empty message, which once killed
    the thread that was reporting it."""
    if isinstance(error, BaseException):
        text = str(getattr(error, "orig", None) or error)
        fallback = type(error).__name__
    else:
        text, fallback = error or "", "(no message)"
    for line in text.splitlines():
        if line.strip():
            return redact(line.strip())[:limit]
    return fallback


# ------------------------------------------------------------------ the log


def install_log_redaction() -> None:
    """Redact every log record this process makes, whoever makes it (our loggers,
    uvicorn's, SQLAlchemy's) and wherever it goes: the record factory sees each record
    once, before any handler or formatter. Idempotent."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "redacting", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        _redact_record(record)
        return record

    factory.redacting = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def _redact_record(record: logging.LogRecord) -> None:
    try:
        message = record.getMessage()
    except Exception:
        return  # a record whose arguments do not fit its format: logging reports that
    if redact(message) != message:
        # Arguments one by one, so that formatters which read them (uvicorn's access
        # log) still find them; an error argument as its redacted text.
        if isinstance(record.args, tuple):
            record.args = tuple(_redact_argument(a) for a in record.args)
        record.msg = redact(str(record.msg))
        try:
            if redact(record.getMessage()) != record.getMessage():
                raise ValueError
        except Exception:
            record.msg, record.args = redact(message), ()
    if record.exc_info and not record.exc_text:
        text = logging.Formatter().formatException(record.exc_info)
        cleaned = redact(text)
        if cleaned != text:
            record.exc_text = cleaned
    if record.stack_info:
        record.stack_info = redact(record.stack_info)


def _redact_argument(argument: Any) -> Any:
    if isinstance(argument, str):
        return redact(argument)
    if isinstance(argument, BaseException):
        text = str(argument)
        cleaned = redact(text)
        return argument if cleaned == text else cleaned
    return argument


# ------------------------------------------------------ what Python prints itself


def install_exception_redaction() -> None:
    """Replace Python's own printers of uncaught exceptions, which write to stderr
    without logging (so :func:`install_log_redaction` never sees them), by ones that
    print the same text redacted: ``sys.excepthook`` (the main thread),
    ``threading.excepthook`` (any other thread: a driver's error in a background
    thread quotes its connection string) and ``sys.unraisablehook`` (an exception in a
    ``__del__`` or a finaliser). Idempotent."""
    if getattr(sys.excepthook, "redacting", False):
        return

    def excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        _print_redacted(traceback.format_exception(kind, value, tb))

    def thread_excepthook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        name = args.thread.name if args.thread is not None else threading.get_ident()
        _print_redacted(
            [
                f"Exception in thread {name}:\n",
                *traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback),
            ]
        )

    def unraisablehook(unraisable: Any) -> None:
        try:
            where = repr(unraisable.object)
        except Exception:
            where = "<object repr() failed>"
        head = f"{unraisable.err_msg or 'Exception ignored in'}: {where}\n"
        lines = traceback.format_exception(
            unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback
        )
        _print_redacted([head, *lines])

    for hook in (excepthook, thread_excepthook, unraisablehook):
        hook.redacting = True  # type: ignore[attr-defined]
    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook
    sys.unraisablehook = unraisablehook


def redacting_exception_handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """An event loop's handler for errors nothing awaited (a task's exception never
    retrieved, a failing callback): what asyncio's default handler logs, each part
    redacted (the context's reprs and the traceback too)."""
    lines = [str(context.get("message") or "Unhandled exception in event loop")]
    for key in sorted(k for k in context if k not in ("message", "exception")):
        try:
            value = repr(context[key])
        except Exception:
            value = "<repr() failed>"
        lines.append(f"{key}: {value}")
    error = context.get("exception")
    if isinstance(error, BaseException):
        formatted = traceback.format_exception(type(error), error, error.__traceback__)
        lines.append("".join(formatted).rstrip())
    logging.getLogger("asyncio").error("%s", redact("\n".join(lines)))


def _print_redacted(lines: Iterable[str]) -> None:
    stream = sys.stderr
    if stream is None:  # no stderr (a daemon): Python's own printers say nothing either
        return
    stream.write(redact("".join(lines)))
    stream.flush()
