"""The decoders' hot loops in C (addon/streamtap/wire/_accel.c); everything else about the build is
in pyproject.toml. The extension is optional: where it cannot be compiled, the package installs
without it and the same loops run in Python."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "streamtap.wire._accel",
            ["addon/streamtap/wire/_accel.c"],
            libraries=["z"],
            optional=True,
            extra_compile_args=["-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
        )
    ]
)
