"""Settings files as TOML: read into a document, and a syntax error turned into one line that
names the file and, for the common mistakes, says how to fix them (`toml_hint`).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from fedhet.errors import FedhetError


def read_toml(text: str, where: str) -> dict[str, Any]:
    """A TOML document; a syntax error is one `FedhetError` naming `where` (the caller's
    wording, e.g. `config file run.toml is`), with a hint for the common mistakes
    (`toml_hint`)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise FedhetError(f"{where} not valid TOML: {e}{toml_hint(text, str(e))}") from None


def read_toml_file(path: Path, what: str) -> tuple[str, dict[str, Any]]:
    """A settings file's text and TOML document; a missing file, a directory or a file that is
    not UTF-8 text is one `FedhetError` naming it (`what`: `config file`, `grid file`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FedhetError(f"{what} {path} not found") from None
    except IsADirectoryError:
        raise FedhetError(f"{what} {path} is a directory; give a .toml file") from None
    except UnicodeDecodeError:
        raise FedhetError(f"{what} {path} is not a text file (TOML is UTF-8 text)") from None
    return text, read_toml(text, f"{what} {path} is")


_KEY_AT = re.compile(r"""^\s*(\[\[?)?\s*([A-Za-z0-9_.\-"' ]+?)\s*(\]\]?|=)""")


def toml_hint(text: str, message: str) -> str:
    """`; <how to fix it>` for TOML's `Cannot overwrite a value` (a key given twice, or a name
    given a value and then used as a table, `algorithm = "fedprox"` beside `[algorithm]` or
    `algorithm.mu = 0.1`); `` for other errors."""
    m = re.search(r"at line (\d+)", message)
    if "Cannot overwrite a value" not in message or not m:
        return ""
    lines = text.splitlines()
    n = int(m.group(1))
    k = _KEY_AT.match(lines[n - 1]) if 0 < n <= len(lines) else None
    if not k:
        return ""
    key = k.group(2).replace('"', "").replace("'", "").strip()
    head = key.split(".")[0]
    for i, line in enumerate(lines[: n - 1], 1):
        earlier = _KEY_AT.match(line)
        if earlier and not earlier.group(1) and earlier.group(3) == "=" and \
                earlier.group(2).strip() == head and (k.group(1) or head != key):
            value = line.split("=", 1)[1].split("#")[0].strip()
            said = f"; line {i} gives {head} a value, so line {n} cannot also make it a table"
            if k.group(1):  # a [header]
                return (f"{said} ([{key}]): remove line {i} and write name = {value} as the "
                        f"table's first line, or name the table [{head}_params]")
            return (f"{said} ({key}): quote the key (\"{key}\" = ...), or write the name inside "
                    f"the table, [{head}] name = {value} followed by its parameters, or put the "
                    f"parameters under [{head}_params]")
    if k.group(3) == "=":
        return f"; {key} is given twice (line {n} repeats it): keep one"
    return ""

