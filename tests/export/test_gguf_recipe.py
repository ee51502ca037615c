"""`export gguf` of the demo's model is refused naming the training flags that make such a model exportable; a model
trained with exactly those flags (and the demo's other settings) exports."""

import re

from gptlab.cli.main import main
from gptlab.export.gguf import gguf_problems, gguf_recipe, recipe_flags
from gptlab.model import preset
from gptlab.train import train_preset

TINY = ["--model.n-layer", "1", "--model.n-embd", "32", "--model.n-head", "2", "--model.block-size", "32", "--seq-len", "32",
        "--micro-batch", "4", "--batch-tokens", "128", "--max-steps", "1", "--eval-batches", "1", "--precision", "fp32",
        "--device", "cpu", "--sample-tokens", "4"]


def test_the_recipe_is_the_fewest_changes_that_leave_no_problem():
    demo = train_preset("shakespeare-cpu").model  # rotary, RMSNorm, ReLU^2, QK-norm on the gpt2 trunk
    assert gguf_problems(demo)
    recipe = gguf_recipe(demo)
    assert recipe_flags(recipe) == "--model.arch llama --model.activation swiglu --model.bias false"  # the README's llama recipe
    assert recipe_flags(recipe, "--train.model.") == "--train.model.arch llama --train.model.activation swiglu --train.model.bias false"
    # gpt2's recipe from a model that is nearly gpt2 already
    assert recipe_flags(gguf_recipe(preset("gpt2-tiny", logit_softcap=15.0))) == "--model.logit-softcap 0.0"


def test_the_refusal_names_flags_that_make_the_demo_model_exportable(prepared, tmp_path, capsys):
    demo = tmp_path / "demo"
    assert main(["train", "--data", str(prepared / "data"), "--out", str(demo), *TINY]) == 0
    capsys.readouterr()
    assert main(["export", "gguf", str(demo), str(tmp_path / "demo.gguf")]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and not (tmp_path / "demo.gguf").exists()
    flags = re.search(r"a model trained with (.+?) exports \(gptlab run: (.+?)\)", error)
    assert flags and flags.group(1) == "--model.arch llama --model.activation swiglu --model.bias false"
    assert flags.group(2).startswith("--train.model.arch llama")

    fixed = tmp_path / "fixed"
    assert main(["train", "--data", str(prepared / "data"), "--out", str(fixed), *TINY, *flags.group(1).split()]) == 0
    assert main(["export", "gguf", str(fixed), str(tmp_path / "fixed.gguf")]) == 0
    assert (tmp_path / "fixed.gguf").stat().st_size > 0
