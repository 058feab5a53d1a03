"""Logging set-up for the command line: plain text or one JSON object per line.

Log calls name their fields in the message, ``"cycle seq=%d enforced=%s"``. In
text they read as written; in JSON each ``key=%x`` becomes a key of the
object, with the argument's own value (a number stays a number), and the
message keeps the prose: ``{"message": "cycle", "seq": 4, "enforced": "true"}``.

What a client does wrong (a request that does not parse, a stream refused a
slot) is worth one line, never a traceback, and never a line per request: a
client that repeats it thousands of times must not flood the log. A
:class:`capwatch.kit.throttling.ThrottledLog` lets a burst of lines through, then one every few
seconds, and counts the rest; the next line that gets through says how many
were suppressed since the last. (The metrics count every one.)
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any, TextIO

from capwatch.kit.flags import LogFormat

# One printf-style conversion, as logging's %-formatting takes them.
_CONVERSION = re.compile(
    r"%(?P<mapping>\(\w+\))?[#0\- +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[hlL]?"
    r"(?P<kind>[diouxXeEfFgGcrsa%])"
)
# ``key=`` right before a conversion, at the start of the message or after a space.
_KEY = re.compile(r"(?:^|(?<=\s))(?P<key>[A-Za-z_][A-Za-z0-9_.]*)=$")
_RESERVED = frozenset({"time", "level", "logger", "message", "exception"})
_HANDLER = "capwatch"


def split_fields(msg: str, args: Any) -> tuple[str, dict[str, Any]] | None:
    """The message without its ``key=%x`` fields, and the fields; None if it has none
    or is not a plain %-format with positional arguments (then log it as it is)."""
    if not isinstance(args, tuple):
        return None
    text: list[str] = []
    fields: dict[str, Any] = {}
    used = end = 0
    for match in _CONVERSION.finditer(msg):
        if match["kind"] == "%":
            continue
        if match["mapping"] or "*" in match[0] or used >= len(args):
            return None
        before, arg = msg[end : match.start()], args[used]
        used += 1
        # A unit written after the conversion (interval=%gs) stays with the value.
        unit = re.match(r"\S*", msg[match.end() :])
        suffix = unit[0] if unit else ""
        key = _KEY.search(before)
        if key is None or key["key"] in _RESERVED or key["key"] in fields:
            text += [before.replace("%%", "%"), match[0] % (arg,)]
            end = match.end()
            continue
        text.append(before[: key.start()].replace("%%", "%"))
        fields[key["key"]] = _value(match[0], arg, suffix)
        end = match.end() + len(suffix)
    if used != len(args) or not fields:
        return None
    text.append(msg[end:].replace("%%", "%"))
    message = re.sub(r"\s{2,}", " ", "".join(text)).strip()
    return message, fields


def _value(conversion: str, arg: Any, suffix: str) -> Any:
    if not suffix and (arg is None or isinstance(arg, bool | int | float | str)):
        return arg
    return conversion % (arg,) + suffix


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, its fields (and the
    exception)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if isinstance(record.msg, str):
            try:
                split = split_fields(record.msg, record.args)
            except (TypeError, ValueError):  # arguments that do not fit: as logging would
                split = None
            if split is not None:
                doc["message"] = split[0]
                doc.update(split[1])
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, separators=(",", ":"), default=str)


def configure_logging(level: str, fmt: LogFormat, *, stream: TextIO | None = None) -> None:
    """Every record at ``level`` or above to ``stream`` (default stderr), as ``fmt``."""
    handler = logging.StreamHandler(stream or sys.stderr)
    if fmt is LogFormat.JSON:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.set_name(_HANDLER)
    root = logging.getLogger()
    # Replace only the handler an earlier call installed (a test's capture stays).
    root.handlers[:] = [*(h for h in root.handlers if h.get_name() != _HANDLER), handler]
    root.setLevel(level)
    # urllib3 is chatty at INFO.
    logging.getLogger("urllib3").setLevel(max(logging.WARNING, root.level))
