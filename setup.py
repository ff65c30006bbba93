"""The native part of the build: everything else is declared in pyproject.toml.

The codec's numeric-list conversion ships as a C extension (docs/architecture/samples-and-values.md,
"Native list conversion"): C rather than Rust because setuptools and the platform's C compiler build
it from source with no extra toolchain (cargo, maturin) at install.  It is optional: without a
compiler, or when it fails to build, the install goes on and the package runs its pure-Python
conversion (one warning at import).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "archive_manager.codec._native",
            sources=["archive_manager/codec/_native.c"],
            optional=True,
        )
    ]
)
