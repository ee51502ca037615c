"""A command builds only its own stage's parser (gptlab.cli.main.build_parser): the same parser as when every stage
is built, and the tokenizer and data commands never import torch."""

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from gptlab.cli.main import STAGES, build_parser, command_stage

ROOT = Path(__file__).resolve().parents[2]


def stage_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction)).choices


def all_help(parser: argparse.ArgumentParser) -> list[str]:
    """The parser's --help and every subcommand's below it, in order."""
    texts = [parser.format_help()]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            texts += [text for sub in action.choices.values() for text in all_help(sub)]
    return texts


def test_top_level_help_is_the_same_with_or_without_the_stages_built():
    full, names = build_parser(), build_parser("")
    assert names.format_help() == full.format_help()
    assert list(stage_parsers(names)) == list(stage_parsers(full)) == list(STAGES)


@pytest.mark.parametrize("stage", list(STAGES))
def test_a_stage_built_alone_is_the_stage_of_the_full_parser(stage):
    alone, full = stage_parsers(build_parser(stage))[stage], stage_parsers(build_parser())[stage]
    assert all_help(alone) == all_help(full)
    assert alone.get_default("handler") is not None or stage_parsers(alone)


def test_the_stage_is_the_first_word_that_is_not_an_option():
    assert command_stage(["tokenizer", "encode", "-t", "gpt2"]) == "tokenizer"
    assert command_stage(["--version"]) == "" and command_stage([]) == ""
    assert command_stage(["trian"]) == "trian"  # not a stage: argparse names the choices


def test_tokenizer_and_data_commands_do_not_import_torch(prepared, tmp_path):
    """In a fresh interpreter: train a tokenizer, prepare shards with it, encode a file; torch never loaded."""
    (tmp_path / "text.txt").write_text("To be, or not to be, that is the question. " * 200)
    script = f"""
import sys
from gptlab.cli.main import main
for argv in (["tokenizer", "train", "--input", "text.txt", "--vocab-size", "300", "--out", "tok"],
             ["data", "prepare", "text.txt", "-t", "tok", "--out", "data", "--quiet"],
             ["tokenizer", "encode", "-t", {str(prepared / "tokenizer")!r}, "text.txt"]):
    assert main(argv) == 0, argv
assert "torch" not in sys.modules, "torch was imported"
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]


def test_an_unknown_flag_is_matched_against_the_commands_own_flags_only(prepared, capsys):
    """`--precision` exists on other stages (and looks like the top-level `--version`): neither is suggested."""
    from gptlab.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["tokenizer", "encode", "-t", str(prepared / "tokenizer"), "--precision", "fp32"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "unrecognized arguments: --precision" in err and "did you mean" not in err
