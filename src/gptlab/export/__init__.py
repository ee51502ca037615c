"""A model leaving gptlab: Hugging Face folders, with our own modeling code where no transformers class computes it;
and GGUF files for llama.cpp and Ollama.

gptlab.export.hf writes the weights and config; gptlab.export.folder adds the tokenizer and swaps the folder in.
gptlab.export.gguf writes one GGUF file (weights), gptlab.export.gguf_vocab its tokenizer and the Ollama Modelfile.
The CLI verb (gptlab.cli.export) only parses and calls write_hf_folder or write_gguf.
"""

from gptlab.export.folder import HF_FILES, check_export_dir, write_hf_folder
from gptlab.export.gguf import GGUF_TYPES, write_gguf
from gptlab.export.gguf_vocab import ollama_modelfile, write_modelfile
from gptlab.export.hf import CUSTOM_CODE_FILES, HFExport, check_exportable, export_hf

__all__ = ["CUSTOM_CODE_FILES", "GGUF_TYPES", "HF_FILES", "HFExport", "check_export_dir", "check_exportable", "export_hf",
           "ollama_modelfile", "write_gguf", "write_hf_folder", "write_modelfile"]
