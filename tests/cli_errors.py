"""A test helper: a command that must fail with one clear error line."""

from __future__ import annotations

import pytest

from fedhet.cli import main


def one_error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run `fedhet ARGV` in this process: exit 2 and exactly one stderr line `error: ...`,
    which is returned."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]
