"""Optional compiled build of the engine (issue 24): ``simulator/engine/engine.py`` and ``network.py`` compiled by
Cython, typed by the ``.pxd`` files beside them, into ``simulator.engine._compiled_engine`` / ``_compiled_network``.

The ``.py`` files stay the one source: each is copied into the build folder under its compiled name with two
changes that do not change what it does -- ``slots=True`` dropped from its ``@dataclass`` decorators (Cython's
extension types have fixed fields already and its dataclass takes no ``slots``) and a last line
``_SOURCE_SHA256 = "..."``, the fingerprint of the ``.py`` and ``.pxd`` (simulator/engine/_source_hash.py) that
:mod:`simulator.engine` compares before it uses the module. C flags keep IEEE results as the interpreter computes
them: ``-O2 -ffp-contract=off -fno-fast-math`` (no fused multiply-add, no reassociation), no ``-march=native``.

Optional: without Cython or a C compiler (``CC=/bin/false``), or if the build fails, the package installs without
the extensions and the pure-Python modules run (a warning says why). Metadata stays in pyproject.toml.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
ENGINE_DIR = ROOT / "simulator" / "engine"
COMPILED = ("network", "engine")
# -g0: no debug information (the interpreter's own CFLAGS carry -g), the same code in half the compile time
CFLAGS = ["-O2", "-ffp-contract=off", "-fno-fast-math", "-g0"]
_SLOTS = re.compile(r"^(@dataclass\([^)\n]*?),\s*slots=True(\))", re.MULTILINE)


def _source_sha256(name: str) -> str:
    spec = importlib.util.spec_from_file_location("_clustersim_source_hash", ENGINE_DIR / "_source_hash.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.source_sha256(ENGINE_DIR, name)


def compiled_source(name: str) -> str:
    """The text Cython compiles for ``name``: the source, ``slots=True`` dropped, the fingerprint appended."""
    text = (ENGINE_DIR / f"{name}.py").read_text()
    text = _SLOTS.sub(r"\1\2", text)
    return text.rstrip("\n") + f'\n\n_SOURCE_SHA256 = "{_source_sha256(name)}"  # added by setup.py\n'


class OptionalCythonBuildExt(build_ext):
    """Cythonize the copies at build time; on any failure, warn and build nothing (the pure-Python modules run)."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:  # the two modules compiled side by side (most of an install's added time)
            self.parallel = min(2, os.cpu_count() or 1)

    def run(self):
        if os.environ.get("CLUSTERSIM_NO_COMPILE"):
            self.warn("CLUSTERSIM_NO_COMPILE set: the engine stays pure Python")
            self.extensions = []
            return
        try:
            for extension, cythonized in zip(self.extensions, self._cythonize(Path(self.build_temp) / "cython"),
                                             strict=True):
                extension.sources = cythonized.sources  # the generated C; setuptools' bookkeeping stays on ours
                extension.extra_compile_args = CFLAGS
        except Exception as exc:  # noqa: BLE001 - no Cython, a Cython error: the compiled build is optional
            self.warn(f"the engine's compiled build was skipped (pure Python runs): {exc}")
            self.extensions = []
            return
        super().run()

    def _cythonize(self, where: Path) -> list[Extension]:
        from Cython.Build import cythonize

        package = where / "simulator" / "engine"
        package.mkdir(parents=True, exist_ok=True)
        for init in (where / "simulator" / "__init__.py", package / "__init__.py"):
            init.write_text("")
        extensions = []
        for name in COMPILED:
            target = f"_compiled_{name}"
            (package / f"{target}.py").write_text(compiled_source(name))
            shutil.copyfile(ENGINE_DIR / f"{name}.pxd", package / f"{target}.pxd")
            extensions.append(Extension(f"simulator.engine.{target}", [str(package / f"{target}.py")],
                                        extra_compile_args=CFLAGS, optional=True))
        return cythonize(extensions, include_path=[str(where)], quiet=True, force=True,
                         compiler_directives={"language_level": 3, "annotation_typing": False})


# Placeholders: the real sources are made by OptionalCythonBuildExt.run (the copies above).
setup(ext_modules=[Extension(f"simulator.engine._compiled_{name}", [f"simulator/engine/{name}.py"], optional=True)
                   for name in COMPILED],
      cmdclass={"build_ext": OptionalCythonBuildExt})
