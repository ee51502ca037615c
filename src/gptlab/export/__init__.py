"""A model leaving gptlab: Hugging Face folders, with our own modeling code where no transformers class computes it.

gptlab.export.hf writes the weights and config; gptlab.export.folder adds the tokenizer and swaps the folder in.
The CLI verb (gptlab.cli.export) only parses and calls write_hf_folder.
"""

from gptlab.export.folder import HF_FILES, check_export_dir, write_hf_folder
from gptlab.export.hf import CUSTOM_CODE_FILES, HFExport, check_exportable, export_hf

__all__ = ["CUSTOM_CODE_FILES", "HF_FILES", "HFExport", "check_export_dir", "check_exportable", "export_hf", "write_hf_folder"]
