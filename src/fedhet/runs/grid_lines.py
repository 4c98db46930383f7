"""Where each setting of a grid was written, so an error names it: the line of every key in the
grid file's TOML text (`key_lines`), a setting's value with its place (`Setting`), and
`Locator`, which turns a place into `grid.toml:12` (or the command-line flag that set it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhet.engine import path_of
from fedhet.errors import FedhetError

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"""^\s*("(?:[^"\\]|\\.)*"|'[^']*'|[A-Za-z0-9_.\-]+)\s*=""")


def _unquote(key: str) -> str:
    parts = re.findall(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'|[^.\s]+', key)
    return ".".join(p[1:-1] if p[:1] in "\"'" else p for p in parts)


def key_lines(text: str) -> dict[str, dict[str, int]]:
    """`{section: {flat key: line}}`; sections are `""`, `base`, `axes`, `variant#0`, ...

    Sub-tables (`[base.algorithm_params]`) fold into their section with a dotted key prefix.
    """
    out: dict[str, dict[str, int]] = {"": {}}
    section, prefix, variants = "", "", 0
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _HEADER.match(line)
        if m and not _KEY.match(line):
            name = _unquote(m.group(2))
            head, _, rest = name.partition(".")
            if m.group(1) == "[[" and head == "variant":
                section, variants = f"variant#{variants}", variants + 1
            else:
                section = head
            prefix = f"{rest}." if rest else ""
            out.setdefault(section, {}).setdefault(rest, lineno)
            continue
        k = _KEY.match(line)
        if k:
            out.setdefault(section, {}).setdefault(prefix + _unquote(k.group(1)), lineno)
    return out


class Locator:
    """Names the place of a grid setting in an error: `path:line` of its key (`lines`, from
    `key_lines`), of its section's header when the key is not written, or the flag that set it
    (`given`: path → what the user typed, for `[base]` and `[axes]` settings)."""

    def __init__(self, path: Path, lines: dict[str, dict[str, int]],
                 given: Mapping[str, str] | None = None) -> None:
        self.path, self.lines, self.given = path, lines, dict(given or {})

    def line(self, section: str, key: str) -> int | None:
        """The line of `key` in `section` (any spelling of its path), or None."""
        table = self.lines.get(section, {})
        for k in (key, path_of(key)):
            if k in table:
                return table[k]
        for k, n in table.items():
            if path_of(k) == path_of(key):
                return n
        return None

    def where(self, section: str, key: str = "") -> str:
        """`path:line` of `key` in `section` (else of the section's header, else `path`)."""
        if key and section in ("base", "axes") and path_of(key) in self.given:
            return self.given[path_of(key)]  # a setting typed on the command line
        n = self.line(section, key) if key else None
        if n is None and not section and key:  # a top-level table: its [header] line
            n = self.lines.get(key, {}).get("") or self.lines.get(f"{key}#0", {}).get("")
        if n is None and section:
            n = self.lines.get(section, {}).get("")
        return f"{self.path}:{n}" if n else str(self.path)

    def fail(self, section: str, key: str, message: str) -> FedhetError:
        """The error `message`, prefixed with where `key` was written."""
        return FedhetError(f"{self.where(section, key)}: {message}")


@dataclass
class Setting:
    """One setting of a grid: its value and where it was written (a section of
    `key_lines`: `base`, `axes`, `variant#0`, ...; and its key there)."""

    value: Any
    section: str
    key: str

