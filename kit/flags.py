"""Command-line options with environment-variable twins, declared as data.

Each :class:`Option` names its flag, its environment twin, its default and a
converter that validates the raw text and raises :class:`ConfigError` naming
the flag (or the twin it came from). A flag on the command line wins over its
twin; a repeatable flag's twin is a comma-separated list. A switch takes no
value on the command line (``--dry-run``); its twin says true or false.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from capwatch.kit.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Option:
    flag: str
    env: str
    help: str
    default: str | None
    # (flag or "flag (from $ENV)", raw text) -> value; raises ConfigError.
    # For a repeatable option it receives each item and the results form a tuple.
    convert: Callable[[str, str], Any]
    repeatable: bool = False
    switch: bool = False  # a bare flag meaning "true"; convert then reads true/false

    def __post_init__(self) -> None:
        if self.switch and self.repeatable:
            raise ValueError(f"{self.flag}: a switch cannot be repeatable")

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    """Declare options on ``parser``; values stay raw until :func:`read_options`."""
    for option in options:
        help_text = f"{option.help} [env {option.env}; default {option.default or 'unset'}]"
        if option.switch:
            parser.add_argument(
                option.flag, dest=option.dest, action="store_const", const="true", help=help_text
            )
            continue
        parser.add_argument(
            option.flag,
            dest=option.dest,
            default=None,
            action="append" if option.repeatable else "store",
            metavar=option.flag.removeprefix("--").upper().replace("-", "_"),
            help=help_text,
        )


def read_options(
    namespace: argparse.Namespace, environ: Mapping[str, str], options: Sequence[Option]
) -> dict[str, Any]:
    """Each option's converted value, by ``dest``: flag, else twin, else default."""
    values: dict[str, Any] = {}
    for option in options:
        raw: str | list[str] | None = getattr(namespace, option.dest, None)
        source = option.flag
        if raw is None and option.env in environ:
            raw, source = environ[option.env], f"{option.flag} (from ${option.env})"
        if raw is None:
            raw = option.default or ""
        if option.repeatable:
            items = raw.split(",") if isinstance(raw, str) else raw
            values[option.dest] = tuple(
                option.convert(source, item.strip()) for item in items if item.strip()
            )
        else:
            assert isinstance(raw, str)  # argparse "store" gives one string
            values[option.dest] = option.convert(source, raw)
    return values


def is_digits(text: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also takes superscripts and other scripts'
    digits, which ``int`` refuses (or reads) where a flag must be plain."""
    return text.isascii() and text.isdigit()


def positive_float(flag: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise ConfigError(flag, f"not a number: {text!r}") from exc
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(flag, f"must be a positive number of seconds, got {text!r}")
    return value


def enum_choice(kind: type[Enum]) -> Callable[[str, str], Any]:
    """A value of ``kind``, its case ignored (``safeDefault``, ``safedefault``)."""
    by_folded = {str(member.value).lower(): member for member in kind}

    def convert(flag: str, text: str) -> Any:
        member = by_folded.get(text.lower())
        if member is None:
            choices = ", ".join(str(m.value) for m in kind)
            raise ConfigError(flag, f"must be one of {choices}, got {text!r}")
        return member

    return convert


def release_name(flag: str, text: str) -> str:
    """A Helm release name: a DNS label of 53 at most, so that it can lead an object's
    name and be a label's value."""
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,51}[a-z0-9])?", text):
        raise ConfigError(flag, f"not a release name (a DNS label of 53 at most): {text!r}")
    return text


def boolean(flag: str, text: str) -> bool:
    word = text.strip().lower()
    if word in ("true", "1", "yes", "on"):
        return True
    if word in ("false", "0", "no", "off"):
        return False
    raise ConfigError(flag, f"must be true or false, got {text!r}")


def optional_path(flag: str, text: str) -> Path | None:
    return Path(text) if text else None


def path(flag: str, text: str) -> Path:
    if not text:
        raise ConfigError(flag, "must not be empty")
    return Path(text)


def writable_directory(flag: str, path: Path) -> None:
    """Make ``path`` (and its parents) if missing; refuse one this process cannot write."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(flag, f"cannot create {path}: {exc.strerror}") from exc
    if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(flag, f"{path} is not a writable directory")


def absolute_path(flag: str, text: str) -> Path:
    if not text.startswith("/"):
        raise ConfigError(flag, f"must be an absolute path, got {text!r}")
    return Path(text)


# Options every command has: the log's level and format.


class LogFormat(str, Enum):
    TEXT = "text"
    JSON = "json"


def _log_level(flag: str, text: str) -> str:
    level = text.upper()
    if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise ConfigError(flag, f"must be one of debug, info, warning, error, got {text!r}")
    return level


def log_level_option(default: str) -> Option:
    """``--log-level``, on every subcommand: the same twin, each its own default."""
    return Option(
        flag="--log-level",
        env="CAPWATCH_LOG_LEVEL",
        default=default,
        convert=_log_level,
        help="debug, info, warning or error",
    )


LOG_FORMAT_OPTION = Option(
    flag="--log-format",
    env="CAPWATCH_LOG_FORMAT",
    default="text",
    convert=enum_choice(LogFormat),
    help="text or json",
)
