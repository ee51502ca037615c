"""Builds gptlab's optional compiled tokenizer core (C, the standard toolchain); everything else is in pyproject.toml.

Both extensions are optional: without a C compiler, pip still installs gptlab
and the tokenizer runs its pure-Python reference (it says so once).
"""

from setuptools import Extension, setup

FLAGS = ["-O3", "-std=c11", "-Wall", "-Wno-unused-function"]

setup(
    ext_modules=[
        Extension(
            "gptlab.tokenizer._fastbpe",
            sources=["src/gptlab/tokenizer/_native/fastbpe.c"],
            depends=["src/gptlab/tokenizer/_native/unicode_table.h"],
            extra_compile_args=FLAGS,
            optional=True,
        ),
        Extension(
            "gptlab.tokenizer._fasttrain",
            sources=["src/gptlab/tokenizer/_native/fasttrain.c"],
            extra_compile_args=FLAGS,
            optional=True,
        ),
    ]
)
