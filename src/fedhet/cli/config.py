"""`fedhet config show`: every setting `run` would use with these flags, its value and where
it came from (default, file, flag); nothing is loaded or written."""

from __future__ import annotations

import argparse
import sys

from fedhet.cli.common import Parser, add_run_flags, run_layers, run_values


def add(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    config = sub.add_parser("config", help="the settings a command would use (config show)")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="show",
                                       parser_class=Parser)
    show = config_sub.add_parser(
        "show", help="every setting `run` would use with these flags: value and where it came from",
    )
    add_run_flags(show)
    show.add_argument("--out", "-o", help="as for run (not used)")
    show.add_argument("--resume", nargs="?", const=True, metavar="DIR",
                      help="the settings a resume of DIR (or --out) would use")
    show.add_argument("--force", action="store_true", help="as for run (not used)")
    show.add_argument("--quiet", "-q", action="store_true", help="as for run (not used)")
    show.add_argument("--tensorboard", action="store_true", help="as for run (not used)")
    show.add_argument("--json", action="store_true", help="as JSON: {section: {setting: "
                      "{value, source, note}}}")
    show.set_defaults(func=command)
    return config


def command(args: argparse.Namespace) -> int:
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.engine import parse
    from fedhet.rundir import resume_target
    from fedhet.runs import render_settings as render
    from fedhet.runs import resume_settings
    from fedhet.runs import settings_json as as_json
    from fedhet.runs import settings_sections as sections

    layers = run_layers(args)
    if args.resume:
        # what `run --resume` would refuse is refused here, in its words
        target = resume_target(args.resume, args.out, args.force)
        _, saved, _ = resume_settings(target, run_values(args) or None,
                                      lambda m: print(m, file=sys.stderr))
        layers = [(f"file {target / 'config.json'}", parse(saved, "config.json")),
                  *[(src, v) for src, v in layers if not src.startswith("file ")]]
    parts = sections(layers)
    print(as_json(parts) if args.json else render(parts))
    return 0
