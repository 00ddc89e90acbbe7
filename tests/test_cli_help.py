"""Every flag's ``--help`` states its default: a walk over the parser of every ``txl`` subcommand."""

from __future__ import annotations

import argparse

from txl.cli import build_parser, main


def _parsers(parser: argparse.ArgumentParser, path: str = "txl"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def _shown(default) -> str:
    return ", ".join(map(str, default)) if isinstance(default, list | tuple) else str(default)


def test_every_option_with_a_default_states_it_in_its_help():
    """Each option of every subcommand whose default is not None, False or empty: its help as printed says
    "default" and shows the value. The failure names each flag that lacks it."""
    missing, checked = [], 0
    for path, parser in _parsers(build_parser()):
        for action in parser._actions:
            formatter = parser._get_formatter()
            default = action.default
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            if default is None or default is False or default is argparse.SUPPRESS or default == []:
                continue
            printed = " ".join(formatter._format_action(action).split())  # as --help prints it
            text = printed.removeprefix(formatter._format_action_invocation(action)).strip()
            checked += 1
            if "default" not in text or _shown(default) not in text:
                missing.append(f"{path} {action.option_strings[-1]} (default {default!r}): help {text!r}")
    assert checked > 40
    assert not missing, "these flags' --help does not state their default:\n" + "\n".join(missing)


def test_the_stated_default_is_printed_by_help(capsys):
    try:
        main(["generate", "--help"])
    except SystemExit:
        pass
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "--num-samples N samples of each prompt, drawn in one batch, sample i of every prompt with seed + i "
        "(default: 1)"
        in out
        and "--seed SEED sampling seed of the first sample (default: 0)" in out
    )
