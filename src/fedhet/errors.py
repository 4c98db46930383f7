"""The one error type users see: a message that says what is wrong and how to fix it; and the
one warning of a spelling an earlier release used (`deprecated`)."""

import os
import sys
import warnings

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


class FedhetDeprecationWarning(FutureWarning):
    """An earlier release's spelling, still read for this one (the migration tables in
    docs/cli.md): the message is one line naming the new spelling. A `FutureWarning`, so Python
    shows it by default; the CLI prints it as one `note:` line after the command."""


def deprecated(message: str) -> None:
    """Warn `message` (`FedhetDeprecationWarning`) at the first caller outside fedhet: the line
    of the user's script that spelt it so."""
    frame, level = sys._getframe(0), 1
    while frame.f_back is not None and _ours(frame.f_globals.get("__name__", "")):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, FedhetDeprecationWarning, stacklevel=level)


def _ours(module: str) -> bool:
    return module == "fedhet" or module.startswith("fedhet.")
