"""`fedhet report DIR`: the HTML report with plots of a run or grid directory."""

from __future__ import annotations

import argparse
from pathlib import Path


def add(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    report = sub.add_parser("report", help="HTML report with plots of a run or grid directory")
    report.add_argument("dir", help="a run directory or a compare/reproduce directory")
    report.add_argument("--out", help="where report.html and the PNGs go (default: DIR); it "
                        "replaces or removes only files an earlier report wrote there")
    report.add_argument("--screenshot", metavar="PNG",
                        help="also render the page with headless Chromium into PNG (as a reader sees it)")
    report.set_defaults(func=command)
    return report


def command(args: argparse.Namespace) -> int:
    # lazy: a command imports torch only when it runs (fast --help and flag errors); the papers
    # register their report figures (`fedhet.reports.figures`) when imported
    from fedhet import papers  # noqa: F401
    from fedhet.reports import write_report

    page = write_report(Path(args.dir), Path(args.out) if args.out else None)
    print(f"report: {page}")
    if args.screenshot:
        from fedhet.reports import screenshot_page as screenshot  # lazy, as above

        print(f"screenshot: {screenshot(page, Path(args.screenshot))}")
    return 0
