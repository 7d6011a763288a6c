"""The ``dpinfer`` command."""

from __future__ import annotations

import sys

COMMANDS = {"demo": "privatise census counts and recover them with a Bayesian model"}


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: dpinfer COMMAND [options]\n\ncommands:")
        for name, text in COMMANDS.items():
            print(f"  {name:8s} {text}")
        return
    command, rest = argv[0], argv[1:]
    if command == "demo":
        from dpinfer.demo import main as demo_main

        demo_main(rest)
    else:
        raise SystemExit(f"dpinfer: unknown command {command!r}; choose from {sorted(COMMANDS)}")
