"""The decoders' hot loops in C (addon/streamtap/wire/_accel.c) and the recording writer's frame
lines (addon/streamtap/recording/_lines.c); everything else about the build is in pyproject.toml.
Both extensions are optional: where they cannot be compiled, the package installs without them
and the same loops run in Python."""

import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py


class build_py_afresh(build_py):
    """The package is copied into an emptied build folder: setuptools reuses the checkout's
    ``build/``, where a module deleted from the sources since an earlier build would still ship."""

    def run(self):
        if not getattr(self, "editable_mode", False):
            shutil.rmtree(Path(self.build_lib) / "streamtap", ignore_errors=True)
        super().run()


WARNINGS = ["-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"]

setup(
    cmdclass={"build_py": build_py_afresh},
    ext_modules=[
        Extension(
            "streamtap.wire._accel",
            ["addon/streamtap/wire/_accel.c"],
            libraries=["z"],
            optional=True,
            extra_compile_args=WARNINGS,
        ),
        Extension(
            "streamtap.recording._lines",
            ["addon/streamtap/recording/_lines.c"],
            libraries=["crypto"],  # OpenSSL's SHA-256, the one hashlib runs
            optional=True,
            extra_compile_args=WARNINGS,
        ),
    ],
)
