"""Build of torchneuron_jit and its C extension torchneuron_jit._C.

libtcc must have been built first (``make deps`` runs tools/deps.sh, which
builds it as position-independent code from Debian's tcc source package into
build/tcc; TORCHNEURON_TCC_DIR points elsewhere). Its runtime library
libtcc1.a and tcc's own headers are bundled into the package (_tcc/), so the
compiler finds them wherever the package is installed.
"""
import glob
import os
import shutil
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
TCC = os.environ.get("TORCHNEURON_TCC_DIR", os.path.join(ROOT, "build", "tcc"))
VERSION = "0.1.0"


class BuildExt(build_ext):
    def run(self):
        libtcc = os.path.join(TCC, "lib", "libtcc.a")
        if not os.path.exists(libtcc):
            raise SystemExit(
                f"setup.py: {libtcc} is missing; run 'make deps' (or tools/deps.sh tcc {TCC})")
        pkg = ROOT if self.inplace else self.build_lib
        dest = os.path.join(pkg, "torchneuron_jit", "_tcc")
        os.makedirs(os.path.join(dest, "include"), exist_ok=True)
        shutil.copy2(os.path.join(TCC, "lib", "libtcc1.a"), dest)
        shutil.copy2(os.path.join(TCC, "COPYING"), os.path.join(dest, "COPYING"))
        for h in glob.glob(os.path.join(TCC, "include", "tcc", "*.h")):
            shutil.copy2(h, os.path.join(dest, "include"))
        super().run()

    def build_extension(self, ext):
        # pip's editable install (make build runs it after build_ext --inplace) builds in an empty
        # temporary directory: the extension just built in place is copied instead of compiled again
        built = os.path.join(ROOT, self.get_ext_filename(ext.name))
        inputs = [os.path.join(ROOT, f) for f in ext.sources + ext.depends]
        if getattr(self, "editable_mode", False) and os.path.exists(built) and \
                max(map(os.path.getmtime, inputs)) < os.path.getmtime(built):
            target = self.get_ext_fullpath(ext.name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(built, target)
            return
        # one compiler process per source and core (distutils runs them one after the other)
        one_by_one = self.compiler.compile

        def compile_all(sources, *args, **kwargs):
            with ThreadPoolExecutor(os.cpu_count()) as pool:
                objects = pool.map(lambda source: one_by_one([source], *args, **kwargs), sources)
                return [obj for objs in objects for obj in objs]

        self.compiler.compile = compile_all
        try:
            super().build_extension(ext)
        finally:
            self.compiler.compile = one_by_one


sources = sorted(glob.glob("csrc/*.c") + glob.glob("csrc/*/*.c"))

ext = Extension(
    "torchneuron_jit._C",
    sources=sources,
    include_dirs=["csrc", os.path.join(TCC, "include")],
    define_macros=[("_GNU_SOURCE", None), ("TORCHNEURON_VERSION", f'"{VERSION}"')],
    extra_compile_args=["-std=c11", "-Wall", "-Wextra", "-Werror", "-O2", "-fopenmp-simd"],
    extra_objects=[os.path.join(TCC, "lib", "libtcc.a")],
    libraries=["lmdb", "xxhash", "mimalloc", "mvec", "pthread", "dl", "m"],
    depends=sorted(glob.glob("csrc/*.h") + glob.glob("csrc/*/*.h")),
)

setup(
    name="torchneuron_jit",
    version=VERSION,
    description="A JIT compiler for PyTorch: graph capture, fusion into C kernels compiled by libtcc, "
                "a persistent LMDB compile cache",
    packages=find_packages(include=["torchneuron_jit", "torchneuron_jit.*"]),
    package_data={"torchneuron_jit": ["_tcc/libtcc1.a", "_tcc/COPYING", "_tcc/include/*.h"]},
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExt},
    python_requires=">=3.11",
    install_requires=["torch>=2.13"],
    entry_points={
        "console_scripts": ["torchneuron-jit=torchneuron_jit.__main__:main"],
        # torch.compile(model, backend="neuron") finds the back end without an import
        "torch_dynamo_backends": ["neuron = torchneuron_jit.backend:neuron"],
    },
)
