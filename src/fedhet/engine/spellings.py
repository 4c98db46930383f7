"""Setting values an earlier release spelt otherwise, read as today's (docs/cli.md, migration).

`RENAMED` lists them: `executor = "batched"` is `executor = "stacked"` (the word "batch" is kept
for the mini-batch). They reach fedhet two ways, read differently:

- **from a user** (a flag, `--set`, a settings or grid file, a keyword of `fedhet.run` or
  `fedhet.compare`, `RunConfig(...)`): `current_value` reads the old spelling as the new one
  and warns once (`FedhetDeprecationWarning`, one line naming the new spelling; the CLI prints
  it as a `note:`). This release only: the next one refuses the old spelling as any unknown
  value is refused.
- **from a run's record** (a saved `config.json`, a checkpoint's settings): `current_record`
  reads it as the new spelling without a word, in every release, so a run made before the
  rename resumes, compares equal to the same settings spelt today and is read as before. A
  grid's `grid.toml` is the user's grid file as given, and reads as one (with the note).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from fedhet.errors import deprecated

RENAMED: dict[str, dict[str, str]] = {"executor": {"batched": "stacked"}}
"""Setting → {old value: its value today}."""


def _renamed(key: str, value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    return RENAMED.get(key, {}).get(value.strip().lower())


def current_value(key: str, value: Any) -> Any:
    """A user's value of setting `key`, an old spelling replaced by today's, with the one-line
    warning that says so (the same line wherever it was given: a command says it once)."""
    new = _renamed(key, value)
    if new is None:
        return value
    deprecated(f"{key} {value.strip().lower()!r} is now {new!r}; the old spelling goes in the "
               "next release (docs/cli.md)")
    return new


def current_record(saved: Mapping[str, Any]) -> dict[str, Any]:
    """A saved `config.json` (or a checkpoint's settings) with every old spelling replaced by
    today's, silently (module docstring)."""
    out = dict(saved)
    for key in RENAMED:
        new = _renamed(key, out.get(key))
        if new is not None:
            out[key] = new
    return out


class OldFlag(argparse.Action):
    """A flag an earlier release spelt otherwise (`--batch-runs`, now `--stack-runs`): its value
    goes where the new flag's goes, with a note (docs/cli.md, migration); left out of `--help`:
    `add_argument("--batch-runs", dest="stack_runs", action=OldFlag, new="--stack-runs",
    help=argparse.SUPPRESS)`."""

    def __init__(self, *args: Any, new: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        deprecated(f"`{option_string}` is now `{self.new}`; the old spelling goes in the next "
                   "release (docs/cli.md)")
        setattr(namespace, self.dest, values)
