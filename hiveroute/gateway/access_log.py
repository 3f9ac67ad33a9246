"""Structured logging: one JSON line per request, and JSON for everything else too."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

ACCESS_LOGGER = "hiveroute.access"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        else:
            entry["msg"] = record.getMessage()
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class MalformedHttpFilter(logging.Filter):
    """aiohttp logs a full traceback for every malformed request; one line is enough.

    Otherwise any client can fill the log with stack traces by sending garbage.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], HttpProcessingError):
            record.msg = f"{record.getMessage()}: {record.exc_info[1]!s}".replace("\n", " ")
            record.args = ()
            record.exc_info = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, MalformedHttpFilter) for f in server_log.filters):
        server_log.addFilter(MalformedHttpFilter())


def access_log_enabled() -> bool:
    """Whether request lines are written (level info or lower): fields that cost something
    to build are built only then."""
    return logging.getLogger(ACCESS_LOGGER).isEnabledFor(logging.INFO)


def log_request(fields: dict[str, Any]) -> None:
    logger = logging.getLogger(ACCESS_LOGGER)
    if logger.isEnabledFor(logging.INFO):
        fields.setdefault("event", "request")
        fields.setdefault("time", time.time())
        logger.info("request", extra={"fields": fields})
