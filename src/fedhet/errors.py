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


def one_line(error: BaseException) -> str:
    """`Type: message` on one line, for an error that is not fedhet's own (the user's code, a
    library): the message's lines and spaces run together; a `SyntaxError` gives its message
    without the source line it quotes."""
    text = error.msg if isinstance(error, SyntaxError) and error.msg else str(error)
    text = " ".join(text.split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class FedhetError(Exception):
    """Bad input or an unusable environment. The CLI prints `error: <message>` and exits 2."""
