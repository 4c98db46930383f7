"""`fedhet report DIR`: an HTML page with PNGs beside it, for a run or a grid directory.

`write_report` finds the runs (`fedhet.reports.discovery`), draws the page and its figures into
a private directory (`fedhet.reports.page`), then publishes them into the output directory
without replacing or deleting a file fedhet did not write (`REPORT_RECORD`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from fedhet.errors import FedhetError
from fedhet.reports.discovery import discover, import_plugins
from fedhet.reports.page import draw_page
from fedhet.rundir import atomic_write_text
from fedhet.rundir import ownership as rundir

REPORT_RECORD = ".fedhet-report.json"
"""What the last `fedhet report` wrote into its output directory (`{"files": {name: sha256}}`):
a file listed there and unchanged since is the report's own, to replace or remove."""


def write_report(root: Path, out: Path | None = None, warn: Callable[[str], None] | None = None) -> Path:
    """Write `report.html` and its PNGs into `out` (default `root`); returns the page's path.

    `root` must be a fedhet run, grid, or a directory of fedhet runs (`discover`). The page is
    drawn into a private directory first, then moved into `out`: a file there that the report
    would replace is replaced only when fedhet wrote it (listed in `REPORT_RECORD` unchanged,
    or a page or plot of a run or grid directory), and a figure of the previous report that
    this one no longer draws is removed only when it is listed there unchanged. Otherwise the
    report stops with one line before touching `out`: a user's file is never replaced or
    deleted."""
    warn = warn or (lambda m: print(m, file=sys.stderr))
    if not root.is_dir():
        raise FedhetError(f"{root} is not a directory; give a run or grid directory")
    manifest, runs = discover(root, warn)
    import_plugins(runs, warn)
    out = out or root
    if out.exists() and not out.is_dir():
        raise FedhetError(f"--out {out} is a file; give a directory for report.html and its figures")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    draft = Path(tempfile.mkdtemp(prefix=".report.html.", dir=out))
    try:
        draw_page(root, manifest, runs, draft, warn)
        page_path = _publish(draft, out, fedhets=out.resolve() == root.resolve())
    except BaseException:
        shutil.rmtree(draft, ignore_errors=True)
        if created and not any(out.iterdir()):
            out.rmdir()
        raise
    shutil.rmtree(draft, ignore_errors=True)
    return page_path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _previous(out: Path) -> dict[str, str]:
    """`REPORT_RECORD`'s files (`{}` when there is none or it is damaged: then nothing counts
    as the report's own)."""
    try:
        files = json.loads((out / REPORT_RECORD).read_text()).get("files", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return {k: v for k, v in files.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(files, dict) else {}


def _publish(draft: Path, out: Path, fedhets: bool = False) -> Path:
    """Move the drawn page and figures from `draft` into `out` (`write_report`'s rules);
    `fedhets`: `out` is the run or grid reported (fedhet's, marker or not)."""
    previous = _previous(out)
    in_run_dir = fedhets or rundir.is_ours(out)

    def own(name: str) -> bool:
        target = out / name
        if not target.exists():
            return True
        if not target.is_file() or target.is_symlink():
            return False
        if in_run_dir and (name == "report.html" or name.endswith(rundir.OWNED_SUFFIXES)):
            return True  # a run or grid directory's pages and plots are fedhet's (as for --force)
        return previous.get(name) == _sha256(target)

    drawn = sorted(p.name for p in draft.iterdir() if p.is_file())
    clashes = [name for name in drawn if not own(name)]
    if clashes:
        raise FedhetError(
            f"--out {out} already holds {', '.join(clashes[:3])}{' …' if len(clashes) > 3 else ''}, "
            "which fedhet did not write; the report replaces no file of yours: choose a new or "
            "empty --out directory, or move those files"
        )
    record = {name: _sha256(draft / name) for name in drawn}
    for name in drawn:
        if name != "report.html":
            os.replace(draft / name, out / name)
    for name, digest in previous.items():  # figures of the previous report not drawn this time
        stale = out / name
        if name not in record and "/" not in name and stale.is_file() and _sha256(stale) == digest:
            stale.unlink()
    atomic_write_text(out / REPORT_RECORD, json.dumps({"files": record}, indent=1) + "\n")
    os.replace(draft / "report.html", out / "report.html")  # last: the page names the figures
    return out / "report.html"
