"""mypy on src/fedhet against a baseline of the errors it had when type checking began, which
may only shrink (`make typecheck`, run by .ci/run).

    python .ci/mypy_check.py            # fail on any error not in the baseline, or on
                                        # baseline entries that no longer occur
    python .ci/mypy_check.py --update   # write the baseline anew after errors were fixed

An error is kept as `path: message  [code]` without its line number, so code that moves does not
change it; the baseline holds one line per occurrence. `--update` never adds an error: with a
new one it fails as a plain check does. The public API (`PUBLIC`) must check clean, baseline or
not. mypy's settings are pyproject.toml's `[tool.mypy]`.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / ".ci" / "mypy_baseline.txt"
PUBLIC = ("src/fedhet/__init__.py", "src/fedhet/api.py", "src/fedhet/engine/__init__.py",
          "src/fedhet/runs/__init__.py")
"""The files of the public API (`fedhet`, `fedhet.engine`, `fedhet.runs`): no error allowed."""

ERROR = re.compile(r"^(?P<path>[^:\n]+\.pyi?):\d+(?::\d+)?: error: (?P<message>.*)$")


def errors(output: str) -> Counter[str]:
    """mypy's error lines as `path: message  [code]`, line numbers dropped (also those a message
    quotes: "defined on line 40"), counted."""
    found: Counter[str] = Counter()
    for line in output.splitlines():
        match = ERROR.match(line.strip())
        if match:
            message = re.sub(r"\bline \d+\b", "line N", match["message"])
            found[f"{Path(match['path']).as_posix()}: {message}"] += 1
    return found


def run_mypy() -> tuple[int, str]:
    """mypy's exit status and output, run on pyproject.toml's `files` from the repository root."""
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-pretty", "--no-error-summary", "--show-error-codes",
         "--hide-error-context", "--no-color-output"],
        cwd=ROOT, capture_output=True, text=True,
    )
    return done.returncode, done.stdout + done.stderr


def read_baseline(path: Path = BASELINE) -> Counter[str]:
    lines = path.read_text().splitlines() if path.exists() else []
    return Counter(line for line in lines if line.strip() and not line.startswith("#"))


def write_baseline(found: Counter[str], path: Path = BASELINE) -> None:
    header = ("# mypy errors on src/fedhet known when type checking began; it may only shrink "
              "(.ci/mypy_check.py --update after a fix)\n")
    path.write_text(header + "".join(f"{e}\n" for e in sorted(found.elements())))


def compare(found: Counter[str], baseline: Counter[str]) -> tuple[list[str], list[str]]:
    """`(new, fixed)`: errors beyond the baseline's count, and baseline entries that are gone;
    an error in a public file is always new."""
    public = Counter({e: n for e, n in found.items() if e.startswith(tuple(f"{p}:" for p in PUBLIC))})
    new = sorted(((found - baseline) | public).elements())
    fixed = sorted((baseline - found).elements())
    return new, fixed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true",
                        help="write the baseline anew once errors were fixed (never adds one)")
    args = parser.parse_args(argv)
    status, output = run_mypy()
    if status not in (0, 1) or (status == 1 and not errors(output)):
        print(output, end="")
        print(f"mypy did not run to the end (exit status {status})", file=sys.stderr)
        return 2
    found = errors(output)
    new, fixed = compare(found, read_baseline())
    if new:
        print("\n".join(new))
        print(f"\n{len(new)} mypy error(s) beyond .ci/mypy_baseline.txt: fix them (the baseline "
              "only shrinks; the public API checks clean)", file=sys.stderr)
        return 1
    if args.update:
        write_baseline(found)
        print(f"mypy baseline written: {sum(found.values())} error(s)")
        return 0
    if fixed:
        print("\n".join(fixed))
        print(f"\n{len(fixed)} baseline error(s) no longer occur: run `python .ci/mypy_check.py "
              "--update` to shrink .ci/mypy_baseline.txt", file=sys.stderr)
        return 1
    print(f"mypy: no new error ({sum(found.values())} in the baseline)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
