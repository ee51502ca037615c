"""gptlab.runtime.optional: a missing optional package is one line naming its extra; how to type gptlab from here."""

import json
import os
import sys
from pathlib import Path

import pytest

from gptlab.cli.main import main
from gptlab.runtime import GptlabError
from gptlab.runtime.optional import activation_hint, gptlab_command, require


def test_require_returns_the_module_when_it_is_installed():
    assert require("json", extra="hf", purpose="reading") is json


def test_require_names_the_package_the_extra_and_its_make_target_when_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as if not installed: `import lm_eval` raises ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "lm_eval.tasks", raising=False)  # imported by an earlier test: found again through lm_eval
    with pytest.raises(GptlabError) as raised:
        require("lm_eval.tasks", extra="harness", purpose="--harness")
    assert str(raised.value) == ("--harness needs the lm-eval package, from gptlab's 'harness' extra: "
                                 "make install-harness (or pip install 'gptlab[harness]')")


def test_require_shows_a_broken_install_as_it_is(tmp_path, monkeypatch):
    """A module that is there but fails on another missing module is a bug to see, not a missing extra."""
    (tmp_path / "broken_optional.py").write_text("import no_such_module_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="no_such_module_anywhere"):
        require("broken_optional", extra="hf", purpose="x")


def test_a_command_missing_an_extra_says_which_in_one_line_without_a_traceback(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    code = main(["eval", "--checkpoint", str(tmp_path / "no-model"), "--harness", "lambada_openai"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert err.splitlines() == ["gptlab: error: --harness needs the lm-eval package, from gptlab's 'harness' extra: "
                                "make install-harness (or pip install 'gptlab[harness]')"]


def test_tensorboard_logging_without_tensorboard_says_which_extra(tmp_path, monkeypatch):
    from gptlab.train.metrics import MetricsLog

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # torch.utils.tensorboard imports it first thing
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    with pytest.raises(GptlabError, match="--tensorboard needs the tensorboard package, from gptlab's 'tracking' extra"):
        MetricsLog(tmp_path, enabled=True, tensorboard=True)


def make_script(folder: Path) -> Path:
    folder.mkdir(parents=True)
    script = folder / "gptlab"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    (folder / "activate").write_text("")
    return script


def test_gptlab_command_is_the_path_typed_from_here_when_gptlab_is_not_on_path(tmp_path, monkeypatch):
    script = make_script(tmp_path / ".venv" / "bin")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [".venv/bin/gptlab", "run"])  # as `make demo` starts it
    monkeypatch.setenv("PATH", str(tmp_path / "elsewhere"))
    assert gptlab_command() == ".venv/bin/gptlab"
    assert activation_hint(".venv/bin/gptlab") == "to type gptlab alone: source .venv/bin/activate"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    monkeypatch.setattr(sys, "argv", [str(script), "run"])
    assert gptlab_command() == str(script)  # from a folder it is not below: the whole path


def test_gptlab_command_is_gptlab_when_that_name_runs_this_one(tmp_path, monkeypatch):
    script = make_script(tmp_path / ".venv" / "bin")
    other = make_script(tmp_path / "other" / "bin")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(script), "run"])
    monkeypatch.setenv("PATH", str(script.parent))  # after `source .venv/bin/activate`
    assert gptlab_command() == "gptlab" and activation_hint("gptlab") == ""
    monkeypatch.setenv("PATH", os.pathsep.join([str(other.parent), str(script.parent)]))  # another gptlab comes first
    assert gptlab_command() == ".venv/bin/gptlab"
