"""pip packaging of the Python package `kvcoord`.

    python3 -m pip install --no-build-isolation ./python    (into a venv too)
    python3 -m pip wheel --no-build-isolation ./python       (a wheel)

builds the extension kvcoord._kvcoord from the project's own C sources (the
binding in python/kvcoord/ and libkvcoord's src/core/ and src/common/,
compiled in, nothing linked from a kvcoord install) with Debian's setuptools,
offline.  Needs a C11 compiler, python3-dev and libjansson-dev.  The CMake
build (python/CMakeLists.txt) builds the same package into build/python.
"""

import glob
import os
import re

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def version():
    with open(os.path.join(ROOT, "include", "kvcoord", "kvcoord.h"), encoding="utf-8") as f:
        return re.search(r'#define KVC_VERSION "([^"]+)"', f.read()).group(1)


def sources():
    binding = sorted(glob.glob(os.path.join(HERE, "kvcoord", "_*.c")))
    core = sorted(glob.glob(os.path.join(ROOT, "src", "core", "*.c")))
    hier = sorted(glob.glob(os.path.join(ROOT, "src", "hier", "*.c")))
    return binding + core + hier + [os.path.join(ROOT, "src", "common", "json_scan.c")]


setup(
    name="kvcoord",
    version=version(),
    description="The node's shared-memory coordinator for disaggregated LLM serving, from Python",
    packages=["kvcoord"],
    package_dir={"kvcoord": os.path.relpath(os.path.join(HERE, "kvcoord"))},
    package_data={"kvcoord": ["py.typed", "*.pyi"]},
    python_requires=">=3.9",
    ext_modules=[
        Extension(
            "kvcoord._kvcoord",
            sources=sources(),
            include_dirs=[os.path.join(ROOT, "include"), os.path.join(ROOT, "src", "core"),
                          os.path.join(ROOT, "src", "common")],
            define_macros=[("_GNU_SOURCE", None)],
            libraries=["jansson", "rt"],
            # the library's kvc_* symbols stay inside the module (only PyInit_ is exported)
            extra_compile_args=["-std=c11", "-fvisibility=hidden"],
            extra_link_args=["-pthread"],
        )
    ],
    zip_safe=False,
)
