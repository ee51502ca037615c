"""A model leaving gptlab: Hugging Face folders, with our own modeling code where no transformers class computes it.

Writers only; the CLI verb (gptlab.cli.export) stays thin.
"""

from gptlab.export.hf import CUSTOM_CODE_FILES, HFExport, check_exportable, export_hf

__all__ = ["CUSTOM_CODE_FILES", "HFExport", "check_exportable", "export_hf"]
