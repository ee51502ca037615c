"""`gptlab export hf MODEL OUT`: a model and its tokenizer as one Hugging Face folder (gptlab.export.write_hf_folder).

    gptlab export hf runs/shakespeare out/shakespeare-hf

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained("out/shakespeare-hf", trust_remote_code=True)  # gptlab's logits
    tokenizer = AutoTokenizer.from_pretrained("out/shakespeare-hf", trust_remote_code=True)    # gptlab's ids

MODEL is any folder gptlab reads (gptlab.load.model_folders). The weights go through
gptlab.export.export_hf: GPT2LMHeadModel, LlamaForCausalLM or Qwen3ForCausalLM where
one computes the model exactly, else gptlab's own modeling code written into OUT
(trust_remote_code=True); the line printed says which. The tokenizer goes through the
tokenizer's Hugging Face writer.

`gptlab export gguf MODEL OUT.gguf [--type f32|f16|q8_0] [--modelfile]`: one GGUF file for llama.cpp and Ollama
(gptlab.export.gguf.write_gguf), weights, tokenizer and chat template inside; --modelfile writes OUT.Modelfile
beside it for `ollama create`. A model llama.cpp cannot compute is refused in one line naming the options.
"""

from __future__ import annotations

import argparse

from gptlab.cli.common import add_model_argument

GGUF_TYPES = ("f32", "f16", "q8_0")  # gptlab.export.gguf.GGUF_TYPES, named here so --help needs no import


def register(stages) -> None:
    parser = stages.add_parser("export", help="write a model in another format (hf: a Hugging Face folder; gguf: llama.cpp, Ollama)")
    formats = parser.add_subparsers(dest="format", metavar="FORMAT", required=True, parser_class=type(parser))
    hf = formats.add_parser("hf", help="a Hugging Face folder: AutoModelForCausalLM and AutoTokenizer load it")
    add_model_argument(hf, positional=True)
    hf.add_argument("out", metavar="OUT", help="the folder to write (new or empty, or an earlier export with --force)")
    hf.add_argument("--tokenizer", "-t", metavar="DIR|NAME", help="the model's tokenizer (default: the one saved with it)")
    hf.add_argument("--force", action="store_true", help="replace an earlier export in OUT")
    hf.set_defaults(handler=run_export_hf)
    gguf = formats.add_parser("gguf", help="one GGUF file: llama.cpp (llama-cli, llama-cpp-python) and Ollama run it")
    add_model_argument(gguf, positional=True)
    gguf.add_argument("out", metavar="OUT", help="the .gguf file to write (new, or an earlier GGUF file with --force)")
    gguf.add_argument("--type", default="f16", choices=GGUF_TYPES, help="how weights are stored (default f16; q8_0: 8-bit blocks)")
    gguf.add_argument("--tokenizer", "-t", metavar="DIR|NAME", help="the model's tokenizer (default: the one saved with it)")
    gguf.add_argument("--modelfile", action="store_true", help="also write an Ollama Modelfile beside OUT (model.gguf -> model.Modelfile)")
    gguf.add_argument("--force", action="store_true", help="replace an earlier GGUF file in OUT (and its Modelfile)")
    gguf.set_defaults(handler=run_export_gguf)


def run_export_hf(args: argparse.Namespace) -> int:
    from gptlab.export import check_export_dir, check_exportable, write_hf_folder
    from gptlab.load.model_folders import load_model, load_model_tokenizer

    check_export_dir(args.out, force=args.force)  # before the model is read: a wrong OUT costs nothing
    model, path = load_model(args.checkpoint)
    check_exportable(model.config)  # before the tokenizer is read
    tokenizer, _ = load_model_tokenizer(args.checkpoint, path, model, args.tokenizer)
    written = write_hf_folder(model, tokenizer, args.out, force=args.force)
    print(f"exported {args.checkpoint} ({model.config.arch}, {model.num_params():,} parameters) {written.describe()} with its "
          f"tokenizer ({tokenizer.vocab_size:,} ids) to {written.directory}")
    return 0


def run_export_gguf(args: argparse.Namespace) -> int:
    from gptlab.export.gguf import check_gguf_out, export_gguf, gguf_architecture
    from gptlab.export.gguf_vocab import modelfile_path
    from gptlab.load.model_folders import load_model, load_model_tokenizer

    check_gguf_out(args.out, force=args.force)  # before the model is read: a wrong OUT costs nothing
    if args.modelfile:
        modelfile_path(args.out, force=args.force)
    model, path = load_model(args.checkpoint)
    architecture = gguf_architecture(model)  # before the tokenizer is read
    tokenizer, _ = load_model_tokenizer(args.checkpoint, path, model, args.tokenizer)
    out, modelfile = export_gguf(model, tokenizer, args.out, type=args.type, force=args.force, modelfile=args.modelfile)
    print(f"exported {args.checkpoint} ({model.config.arch}, {model.num_params():,} parameters) as GGUF {args.type} "
          f"(llama.cpp architecture {architecture}) with its tokenizer ({tokenizer.vocab_size:,} ids) to {out}")
    if modelfile is not None:
        print(f"wrote {modelfile}: ollama create NAME -f {modelfile}")
    return 0
