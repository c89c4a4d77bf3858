"""``elasticps``: the command line. Each group of commands lives in its own
module and adds its parsers here: experiments (demo, bench), local (train,
export), server, jobs (the client commands), sim."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from elasticps.cli import experiments, jobs, local, server, sim
from elasticps.cli.common import version


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="elasticps", description="Elastic parameter-server training on shared clusters (docs: README.md)."
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    p.add_argument("--version", action="version", version=f"elasticps {version()}")
    sub = p.add_subparsers(dest="command", required=True)
    for group in (experiments, local, server, jobs, sim):
        group.add_parsers(sub)
    return p


def subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of the subcommand ``name`` within the whole command line's ``parser``."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices[name]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the subcommand's own usage, not the top level's
        subcommand(parser, args.command).error(f"unrecognized arguments: {' '.join(unknown)}")
    args.argv = argv
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(message)s")
    from elasticps.errors import ElasticPSError

    try:
        return int(args.func(args) or 0)
    except ElasticPSError as exc:  # bad input or a failed job: a message, not a traceback
        for line in getattr(exc, "problems", None) or [str(exc)]:  # a spec's every problem, one a line
            print(f"error: {line}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader left (`| head`): end quietly, and let exit's flush write nowhere
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
