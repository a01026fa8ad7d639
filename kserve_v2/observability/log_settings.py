"""Triton's logging extension: log settings that change what the server logs while it runs.

Settings and texts follow Triton's ``docs/protocol/extension_logging.md`` and its HTTP handler:
``log_info``, ``log_warning``, ``log_error`` (booleans) turn each level on or off;
``log_verbose_level`` (uint32) > 0 adds debug messages; ``log_format`` is ``default`` or ``ISO8601``
(timestamps of the text log format; JSON lines always carry ISO 8601); ``log_file`` cannot be
changed over the network. Unknown names are ignored, as Triton does. The settings act through one
``logging.Filter`` on the root logger's handlers (Python's standard ``logging``). Where the lines
go and how they look (``--log-format``, a replica's tag) is ``log_to_stderr``.
"""

from __future__ import annotations

import json
import logging
import sys
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
    """

    def __init__(self, verbose: int) -> None:
        super().__init__()
        self._on = {level: True for level in _FLAGS.values()}
        self._verbose = verbose
        self._format = "default"
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
                if handler.formatter is not None and type(handler.formatter) is logging.Formatter:
                    handler.formatter.datefmt = _ISO_TIME if log_format == "ISO8601" else None

    def current(self) -> dict[str, Value]:
        """Every setting, as Triton answers them."""
        return {"log_file": "", "log_info": self._on[logging.INFO], "log_warning": self._on[logging.WARNING],
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


def log_to_stderr(log_format: str, verbose: int, replica: int | None = None) -> None:
    """Send log lines to stderr in ``--log-format`` (``text`` or ``json``), debug lines when
    ``verbose`` > 0, tagged with the replica's number in a replica of ``--workers``."""
    handler = logging.StreamHandler(sys.stderr)
    tag = "" if replica is None else f"[replica {replica}] "
    handler.setFormatter(JsonFormatter(replica) if log_format == "json"
                         else logging.Formatter(f"%(asctime)s %(levelname)s {tag}%(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose > 0 else logging.INFO, handlers=[handler], force=True)
