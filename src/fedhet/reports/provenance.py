"""What made a page's runs: the `provenance` record of each run's `config.json`.

A run records the fedhet version and commit (and whether the checkout had uncommitted
changes), torch, numpy and Python versions, the device and the plugins it loaded. A report
page shows them in a small block: one value where every run agrees, else each value with how
many runs had it, so a reviewer sees at once when a grid mixes commits or library versions.
Runs made before the record existed have none; the block says how many.
"""

from __future__ import annotations

from typing import Any

FIELDS = (
    # (key in the record, shown as)
    ("fedhet", "fedhet"), ("commit", "commit"), ("dirty", "uncommitted changes"),
    ("torch", "torch"), ("numpy", "numpy"), ("python", "python"), ("device", "device"),
    ("plugins", "plugins"),
)


def _text(key: str, value: Any) -> str:
    if key == "commit" and value is None:
        return "unknown (not a git checkout)"
    if key == "dirty":
        return {True: "yes", False: "no"}.get(value, "unknown")
    if key == "plugins":
        return ", ".join(map(str, value)) if value else "none"
    return "unknown" if value is None else str(value)


def provenance_rows(configs: list[dict[str, Any]]) -> tuple[list[list[str]], str]:
    """`([[field, value], ...], note)` for the block; `([], "")` when no run has a record.

    A field on which the runs differ lists each value with its count (`2.11.0 (3 runs); 2.12.0
    (1 run)`); the note says how many runs have no record."""
    records = [c["provenance"] for c in configs if isinstance(c.get("provenance"), dict)]
    if not records:
        return [], ""
    rows = []
    for key, name in FIELDS:
        counts: dict[str, int] = {}
        for record in records:
            text = _text(key, record.get(key))
            counts[text] = counts.get(text, 0) + 1
        if len(counts) == 1:
            rows.append([name, next(iter(counts))])
        else:
            rows.append([name, "; ".join(f"{v} ({n} run{'s' if n > 1 else ''})" for v, n in counts.items())])
    missing = len(configs) - len(records)
    note = (f"{missing} of {len(configs)} runs predate provenance records (made before fedhet "
            "wrote them); the values above are those of the other runs.") if missing else ""
    return rows, note
