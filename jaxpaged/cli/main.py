"""`jaxpaged COMMAND [SUBCOMMAND] --flags`: pick the command from ``argv[1:3]``, parse its flags, run it.

A bad flag value is one line on stderr (``FATAL Flags parsing error: flag
--NAME=VALUE: MESSAGE``) and exit status 1, before the command does anything.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from absl import app, flags
from absl import logging as absl_logging

from jaxpaged.cli.commands import COMMANDS, Command, find

PROG = "jaxpaged"


def usage(group: str | None = None) -> str:
    """The command list (of ``group``'s subcommands only, e.g. ``"bench"``)."""
    rows = [c for c in COMMANDS if group is None or c.words[0] == group]
    width = max(len(c.name) for c in rows)
    head = f"usage: {PROG} {group + ' ' if group else ''}COMMAND [--flag=value ...]   ({PROG} COMMAND --help: its flags)"
    return "\n".join([head, "", "commands:", *(f"  {c.name:<{width}}  {c.help}" for c in rows)])


def command_help(command: Command) -> str:
    """``jaxpaged COMMAND --help``: the module's docstring and its flags."""
    module = command.load()
    doc = (module.__doc__ or command.help).strip()
    return f"usage: {PROG} {command.name} [--flag=value ...]\n\n{doc}\n\nflags:\n{module.FLAGS.values}"


def parse(command: Command, argv: Sequence[str]):
    """Import ``command``, parse ``argv`` (``argv[0]`` the program) into its flags: (module, positional args).

    Raises `flags.Error` on a bad flag (unknown, malformed or failing a check).
    """
    module = command.load()
    rest = module.FLAGS.parse([f"{PROG} {command.name}", *argv])
    return module, rest


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` names (default: ``sys.argv``); its exit status."""
    argv = list(sys.argv if argv is None else argv)
    command, size = find(argv)
    args = argv[1 + size:]
    if command is None:
        group = argv[1] if len(argv) > 1 and any(c.words[0] == argv[1] for c in COMMANDS) else None
        asked = len(argv) == 1 + (group is not None) or argv[1 + (group is not None)] in ("-h", "--help", "help")
        print(usage(group), file=sys.stdout if asked else sys.stderr)
        if not asked:
            print(f"\n{PROG}: no command {' '.join(argv[1:3])!r}", file=sys.stderr)
        return 0 if asked else 2
    if any(a in ("-h", "--help", "--helpshort", "--helpfull") for a in args):
        print(command_help(command))
        return 0
    try:
        module, rest = parse(command, args)
    except flags.Error as error:
        print(f"FATAL Flags parsing error: {error}", file=sys.stderr)
        print(f"Pass --help to see the flags of {PROG} {command.name}.", file=sys.stderr)
        return 1
    absl_logging.use_absl_handler()
    flags.FLAGS.mark_as_parsed()  # absl's own flags keep their defaults, and as absl's app.run does,
    if flags.FLAGS["verbosity"].using_default_value:  # INFO logs show
        flags.FLAGS.verbosity = 0
    try:
        status = module.main(rest)
    except app.UsageError as error:
        print(f"FATAL usage error: {error}", file=sys.stderr)
        return 1
    return status if isinstance(status, int) else 0


def main() -> None:
    """The console entry point."""
    sys.exit(run())
