"""`fedhet docs [TOPIC] [--path]`: the docs shipped with the package (`fedhet.userdocs`)."""

from __future__ import annotations

import argparse


def add(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    docs = sub.add_parser("docs", help="the user docs shipped with fedhet: list them, print one "
                          "(fedhet docs grids), or --path to locate it")
    docs.add_argument("topic", nargs="?", help="a doc's name (grids, gpu, deploy, fedveca, ...)")
    docs.add_argument("--path", action="store_true", help="print where the page is, not the page")
    docs.set_defaults(func=command)
    return docs


def command(args: argparse.Namespace) -> int:
    # lazy, as every command's imports (fast --help)
    from fedhet import userdocs

    if not args.topic:
        print(userdocs.listing())
        return 0
    path = userdocs.doc_path(args.topic)
    print(path if args.path else path.read_text(encoding="utf-8"), end="\n" if args.path else "")
    return 0
