"""Triton's logging extension: log settings that change what the server logs while it runs.

Settings and texts follow Triton's ``docs/protocol/extension_logging.md`` and its HTTP handler:
``log_info``, ``log_warning``, ``log_error`` (booleans) turn each level on or off;
``log_verbose_level`` (uint32) > 0 adds debug messages; ``log_format`` is ``default`` or ``ISO8601``
(timestamps of the text log format; JSON lines always carry ISO 8601); ``log_file`` cannot be
changed over the network. Unknown names are ignored, as Triton does. The settings act through one
``logging.Filter`` on the root logger's handlers (Python's standard ``logging``). Where the lines
go (stderr, or Triton's ``--log-file``) and how they look (``--log-format``, a replica's tag) is
``configure_logging``.

Triton's two line layouts (``--log-format default|ISO8601``, its ``qa/L0_logging`` regexes; time in UTC,
level E, W, I or V, the process id, the source file and line; the message JSON-encoded, a traceback
included, unless ``TRITON_SERVER_ESCAPE_LOG_MESSAGES=0``, as Triton's ``extension_logging.md`` says)::

    I1207 13:57:56.123456 1234 app.py:199] "message"
    2026-12-07T13:57:56Z I 1234 app.py:199] "message"
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from datetime import UTC, datetime

from kserve_v2.protocol.errors import InvalidInput, Unavailable, Unsupported

Value = bool | int | str
FORMATS = ("default", "ISO8601")
_ISO_TIME = "%Y-%m-%dT%H:%M:%S"
_FLAGS = {"log_info": logging.INFO, "log_warning": logging.WARNING, "log_error": logging.ERROR}


class LogSettings(logging.Filter):
    """The server's log settings, applied to the root logger's handlers.

    Args:
        verbose: the startup ``--log-verbose`` level.
        levels: the startup ``--log-info``, ``--log-warning`` and ``--log-error`` (each level on or off).
        log_format: the startup ``--log-format``: Triton's ``default`` or ``ISO8601`` (another, such as
            ours ``text`` or ``json``, answers as ``default``).
        log_file: the startup ``--log-file`` ("": stderr), as the settings answer it.
    """

    def __init__(self, verbose: int, levels: tuple[bool, bool, bool] = (True, True, True),
                 log_format: str = "default", log_file: str = "") -> None:
        super().__init__()
        self._on = dict(zip(_FLAGS.values(), levels, strict=True))
        self._verbose = verbose
        self._format = log_format if log_format in FORMATS else "default"
        self._file = log_file
        self._installed = False

    def install(self) -> None:
        """Filter every handler configured so far: the root logger's and those of loggers that do
        not propagate, such as uvicorn's (idempotent)."""
        if self._installed:
            return
        loggers = [logging.getLogger(), *(logger for logger in logging.Logger.manager.loggerDict.values()
                                          if isinstance(logger, logging.Logger))]
        for handler in {id(h): h for logger in loggers for h in logger.handlers}.values():
            handler.addFilter(self)
        self._installed = True

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether a record passes the settings (``logging.Filter``)."""
        if record.levelno < logging.INFO:
            return self._verbose > 0
        level = max(level for level in _FLAGS.values() if level <= record.levelno)
        return self._on[level]

    def update(self, settings: dict[str, Value]) -> None:
        """Apply new values.

        Raises:
            Unsupported: ``log_file`` given -> UNIMPLEMENTED / 501.
            InvalidInput: a value of the wrong type -> INVALID_ARGUMENT / 400.
            Unavailable: an unknown ``log_format`` (Triton's code and text) -> UNAVAILABLE / 503.
        """
        if "log_file" in settings:
            raise Unsupported("log file location can not be updated through network protocol")
        for name in _FLAGS:
            if name in settings and not isinstance(settings[name], bool):
                raise InvalidInput(f"log setting '{name}' must be a boolean")
        verbose = settings.get("log_verbose_level", self._verbose)
        if isinstance(verbose, bool) or not isinstance(verbose, int) or not 0 <= verbose < 2**32:
            raise InvalidInput("log setting 'log_verbose_level' must be an unsigned 32-bit integer")
        log_format = settings.get("log_format", self._format)
        if not isinstance(log_format, str):
            raise InvalidInput("log setting 'log_format' must be a string")
        if log_format not in FORMATS:
            raise Unavailable(f"invalid argument for --log_format, got: {log_format}")
        for name, level in _FLAGS.items():
            if name in settings:
                self._on[level] = bool(settings[name])
        self._verbose = verbose
        logging.getLogger().setLevel(logging.DEBUG if verbose > 0 else logging.INFO)
        if log_format != self._format:
            self._format = log_format
            for handler in logging.getLogger().handlers:
                if isinstance(handler.formatter, TritonFormatter):
                    handler.formatter.layout = log_format
                elif handler.formatter is not None and type(handler.formatter) is logging.Formatter:
                    handler.formatter.datefmt = _ISO_TIME if log_format == "ISO8601" else None

    def current(self) -> dict[str, Value]:
        """Every setting, as Triton answers them."""
        return {"log_file": self._file, "log_info": self._on[logging.INFO], "log_warning": self._on[logging.WARNING],
                "log_error": self._on[logging.ERROR], "log_verbose_level": self._verbose,
                "log_format": self._format}


class JsonFormatter(logging.Formatter):
    """One JSON object per log line: time (ISO 8601, UTC), level, logger, message, and exception
    (and ``replica``, the replica's number, in a replica of ``--workers``)."""

    def __init__(self, replica: int | None = None) -> None:
        super().__init__()
        self._replica = {} if replica is None else {"replica": replica}

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
                 "level": record.levelname, "logger": record.name, "message": record.getMessage(), **self._replica}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class TritonFormatter(logging.Formatter):
    """Triton's log line layouts (see the module docstring): ``layout`` is ``default`` or ``ISO8601``
    (the logging extension changes it while the server runs); a replica of ``--workers`` tags its
    messages as the text layout does. Messages are JSON-encoded unless the environment has
    ``TRITON_SERVER_ESCAPE_LOG_MESSAGES=0`` when the formatter is made."""

    _LEVELS = {logging.ERROR: "E", logging.WARNING: "W", logging.INFO: "I"}

    def __init__(self, layout: str, replica: int | None = None) -> None:
        super().__init__()
        self.layout = layout
        self._tag = "" if replica is None else f"[replica {replica}] "
        self._escape = os.environ.get("TRITON_SERVER_ESCAPE_LOG_MESSAGES") != "0"

    def format(self, record: logging.LogRecord) -> str:
        level = next((letter for number, letter in self._LEVELS.items() if record.levelno >= number), "V")
        utc = time.gmtime(record.created)
        if self.layout == "ISO8601":
            head = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', utc)} {level}"
        else:
            micros = int(record.created * 1_000_000) % 1_000_000
            head = f"{level}{time.strftime('%m%d %H:%M:%S', utc)}.{micros:06d}"
        message = self._tag + record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        return (f"{head} {os.getpid()} {record.filename}:{record.lineno}] "
                f"{json.dumps(message, ensure_ascii=False) if self._escape else message}")


def configure_logging(log_format: str, verbose: int, replica: int | None = None, log_file: str = "") -> None:
    """Send log lines to stderr, or append them to ``log_file`` (Triton's ``--log-file``), in
    ``--log-format`` (ours ``text`` or ``json``, Triton's ``default`` or ``ISO8601``), debug lines
    when ``verbose`` > 0, tagged with the replica's number in a replica of ``--workers``.

    Raises:
        OSError: ``log_file`` cannot be opened for appending.
    """
    handler = logging.FileHandler(log_file, encoding="utf-8") if log_file else logging.StreamHandler(sys.stderr)
    tag = "" if replica is None else f"[replica {replica}] "
    if log_format == "json":
        handler.setFormatter(JsonFormatter(replica))
    elif log_format in FORMATS:
        handler.setFormatter(TritonFormatter(log_format, replica))
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {tag}%(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose > 0 else logging.INFO, handlers=[handler], force=True)
