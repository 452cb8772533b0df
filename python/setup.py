"""pip packaging of the Python package `kvcoord`.

    python3 -m pip install --no-build-isolation ./python    (into a venv too)
    python3 -m pip wheel --no-build-isolation ./python       (a wheel)

The extensions kvcoord._kvcoord and kvcoord._engine have one build, the
project's CMake (python/CMakeLists.txt): this file configures the checkout
with KVCOORD_PYTHON_ONLY=ON for the interpreter running pip, builds the two
targets and packages the modules they make, beside the pure-Python files.
No source list and no compiler flag is written here.  Offline, with Debian's
setuptools; needs cmake, pkg-config, a C11 compiler, python3-dev,
libjansson-dev, liburing-dev and libibverbs-dev.
"""

import glob
import os
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def version():
    with open(os.path.join(ROOT, "include", "kvcoord", "kvcoord.h"), encoding="utf-8") as f:
        return re.search(r'#define KVC_VERSION "([^"]+)"', f.read()).group(1)


def entry_points():
    with open(os.path.join(HERE, "entry_points.txt"), encoding="utf-8") as f:
        return f.read()


class CMakeExtension(Extension):
    """A module CMake builds: `target` in python/CMakeLists.txt."""

    def __init__(self, name, target):
        super().__init__(name, sources=[])
        self.target = target


class CMakeBuild(build_ext):
    """Configures the project once (build_temp/cmake), then builds each
    extension's CMake target and copies the module to where setuptools
    packages it."""

    def run(self):
        self.cmake_dir = os.path.join(os.path.abspath(self.build_temp), "cmake")
        cmd = ["cmake", "-S", ROOT, "-B", self.cmake_dir, "-DCMAKE_BUILD_TYPE=Release",
               "-DKVCOORD_PYTHON_ONLY=ON", "-DKVCOORD_TESTS=OFF",
               "-DPython3_EXECUTABLE=" + sys.executable]
        subprocess.run(cmd, check=True)
        super().run()

    def build_extension(self, ext):
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        subprocess.run(["cmake", "--build", self.cmake_dir, "--target", ext.target,
                        "-j", jobs], check=True)
        leaf = ext.name.rsplit(".", 1)[1]
        built = glob.glob(os.path.join(self.cmake_dir, "python", "kvcoord", leaf + ".*.so"))
        if len(built) != 1:
            raise RuntimeError("CMake target %s made %r" % (ext.target, built))
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(built[0], dest)


setup(
    name="kvcoord",
    version=version(),
    description="The node's shared-memory coordinator for disaggregated LLM serving, from Python",
    packages=["kvcoord", "kvcoord.sglang", "kvcoord.mooncake"],
    package_dir={"kvcoord": os.path.relpath(os.path.join(HERE, "kvcoord")),
                 "kvcoord.sglang": os.path.relpath(os.path.join(HERE, "kvcoord", "sglang")),
                 "kvcoord.mooncake": os.path.relpath(os.path.join(HERE, "kvcoord", "mooncake"))},
    package_data={"kvcoord": ["py.typed", "*.pyi"]},  # the C extensions' stubs
    python_requires=">=3.10",  # Py_NewRef (python/ext/)
    ext_modules=[CMakeExtension("kvcoord._kvcoord", "kvcoord_python"),
                 CMakeExtension("kvcoord._engine", "kvcoord_python_engine")],
    cmdclass={"build_ext": CMakeBuild},
    # sglang's plugin framework (sglang.srt.plugins.load_plugins) runs it in every
    # sglang process: docs/mooncake.md, "sglang on it, unchanged".  One file, which
    # python/CMakeLists.txt installs too (the .deb's kvcoord-VERSION.dist-info).
    entry_points=entry_points(),
    zip_safe=False,
)
