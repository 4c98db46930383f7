"""`fedhet paper-scale`: docs/paper-scale.md (the papers' numbers and claims beside ours)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    page = sub.add_parser("paper-scale", help="write docs/paper-scale.md (the papers' numbers and "
                          "claims beside ours) from results/")
    page.add_argument("--results", default="results", help="result files (default results)")
    page.add_argument("--out", default="docs/paper-scale.md", help="the page (default docs/paper-scale.md)")
    page.set_defaults(func=command)
    return page


def command(args: argparse.Namespace) -> int:
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.papers.paper_scale import write_page

    print(f"page: {write_page(Path(args.results), Path(args.out))}")
    return 0
