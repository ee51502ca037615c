"""docs/cli.md's verb table against the real parser: every verb and subverb `gptlab --help` offers has a row."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from gptlab.cli.main import build_parser

CLI_PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def parser_commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every command the parser accepts, as word tuples: ("run",), ("tokenizer", "train"), ..."""
    subcommands = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    if not subcommands:
        return {prefix}
    return {command for action in subcommands for name, sub in action.choices.items() for command in parser_commands(sub, (*prefix, name))}


def table_commands(page: str) -> set[tuple[str, ...]]:
    """The commands the verb table's first column names: `gptlab data get / prepare` is ("data", "get"), ("data", "prepare")."""
    table = page.split("## The verbs", 1)[1].split("\n## ", 1)[0]
    commands = set()
    for row in table.splitlines():
        if not row.startswith("| `gptlab"):
            continue
        for span in re.findall(r"`gptlab ([^`]+)`", row.split("|")[1]):
            words = span.split(" / ")
            head = words[0].split()
            commands.add(tuple(head))
            commands.update((*head[:-1], word.strip()) for word in words[1:])
    return commands


def test_table_commands_reads_subverbs_separated_by_slashes():
    page = "## The verbs\n\n| verb | what |\n|---|---|\n| `gptlab run`, `gptlab data get / prepare` | x |\n\n## Next\n| `gptlab nope` | y |\n"
    assert table_commands(page) == {("run",), ("data", "get"), ("data", "prepare")}


def test_parser_commands_lists_subverbs_of_a_stage():
    commands = parser_commands(build_parser())
    assert ("export", "gguf") in commands and ("tokenizer", "view") in commands and ("run",) in commands
    assert ("export",) not in commands


def test_cli_page_verb_table_names_every_command_of_the_parser():
    missing = sorted(" ".join(command) for command in parser_commands(build_parser()) - table_commands(CLI_PAGE.read_text()))
    assert not missing, f"docs/cli.md's verb table lacks: {', '.join(missing)}"


def test_cli_page_verb_table_names_no_command_the_parser_lacks():
    extra = sorted(" ".join(command) for command in table_commands(CLI_PAGE.read_text()) - parser_commands(build_parser()))
    assert not extra, f"docs/cli.md's verb table names commands gptlab does not have: {', '.join(extra)}"
