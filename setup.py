"""Builds gptlab's optional compiled tokenizer core (C, the standard toolchain); everything else is in pyproject.toml.

The extensions are optional: without a C compiler, pip still installs gptlab
and the tokenizer runs its pure-Python reference (it says so once).
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SHARED = ["src/gptlab/tokenizer/_native/bytes_map.h"]  # included by the encoders: editing it rebuilds them
GCC_FLAGS = ["-O3", "-std=c11", "-Wall", "-Wno-unused-function"]  # gcc and clang
MSVC_FLAGS = ["/O2"]


class BuildExt(build_ext):
    """Compiler flags for the compiler at hand (MSVC does not take gcc's)."""

    def build_extensions(self) -> None:
        flags = MSVC_FLAGS if self.compiler.compiler_type == "msvc" else GCC_FLAGS
        for extension in self.extensions:
            extension.extra_compile_args = flags
        super().build_extensions()


setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=[
        Extension("gptlab.tokenizer._fastbpe", sources=["src/gptlab/tokenizer/_native/fastbpe.c"], depends=SHARED, optional=True),
        Extension("gptlab.tokenizer._fasttrain", sources=["src/gptlab/tokenizer/_native/fasttrain.c"], optional=True),
        Extension("gptlab.tokenizer._spbpe", sources=["src/gptlab/tokenizer/_native/spbpe.c"], depends=SHARED, optional=True),
        Extension("gptlab.tokenizer._sptrain", sources=["src/gptlab/tokenizer/_native/sptrain.c"], optional=True),
    ],
)
