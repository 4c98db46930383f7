"""The one error type users see: a message that says what is wrong and how to fix it."""

import os
import sys

MUST_KNOW = ("warning:", "rebuilt ", "removed ")
"""How the log lines a quiet command still shows begin: a warning, a file rebuilt from the
checkpoint, files fedhet removed."""


def quiet(line: str) -> None:
    """The log of a quiet command (`run -q`, a grid's runs, a campaign's): only the lines the
    user must know (`MUST_KNOW`), on stderr."""
    if line.startswith(MUST_KNOW):
        print(line, file=sys.stderr, flush=True)


def debugging() -> bool:
    """`--debug` or `FEDHET_DEBUG=1`: errors show their full traceback, not only their line."""
    return os.environ.get("FEDHET_DEBUG", "") not in ("", "0")


class FedhetError(Exception):
    """Bad input or an unusable environment. The CLI prints `error: <message>` and exits 2."""
