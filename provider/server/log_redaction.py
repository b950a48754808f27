"""The state server's log: to stderr, with the process's secrets blanked out of every record,
and py4j never below WARNING (it logs its auth command, token included, at DEBUG)."""
from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger("keyedstate.server")


class RedactingFormatter(logging.Formatter):
    """Writes every record with the process's secrets blanked out, whatever logged them."""

    def __init__(self, fmt: str, secrets_: list[str]) -> None:
        super().__init__(fmt)
        self._secrets = [s for s in secrets_ if s]

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, "<redacted>")
        return text


def configure_logging(secrets_: list[str]) -> None:
    level = os.environ.get("KEYEDSTATE_LOG_LEVEL", "INFO").upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s", secrets_))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # py4j logs every command it sends at DEBUG (the auth command with its token among them) and
    # every callback at INFO: never below WARNING, whatever the level asked for.
    logging.getLogger("py4j").setLevel(logging.WARNING)

    def excepthook(args) -> None:  # uncaught thread errors go through the redacting log too
        if args.exc_type is not SystemExit:
            log.error("uncaught error in thread %s", getattr(args.thread, "name", "?"),
                      exc_info=(args.exc_type, args.exc_value, args.exc_traceback))

    threading.excepthook = excepthook
