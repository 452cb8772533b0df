"""pip packaging of the Python package `kvcoord`.

    python3 -m pip install --no-build-isolation ./python    (into a venv too)
    python3 -m pip wheel --no-build-isolation ./python       (a wheel)

builds the extension kvcoord._kvcoord from the project's own C sources (the
binding in python/ext/ and libkvcoord's src/core/ and src/common/,
compiled in, nothing linked from a kvcoord install) and kvcoord._engine
(python/ext/engine*.c and the transfer engine src/xfer/, for
kvcoord.mooncake) with Debian's setuptools, offline.  Needs a C11 compiler,
python3-dev, libjansson-dev, liburing-dev and libibverbs-dev.  The CMake
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
    binding = sorted(glob.glob(os.path.join(HERE, "ext", "_*.c")))
    core = sorted(glob.glob(os.path.join(ROOT, "src", "core", "*", "*.c")))
    hier = sorted(glob.glob(os.path.join(ROOT, "src", "hier", "*.c")))
    return binding + core + hier + [os.path.join(ROOT, "src", "common", "json_scan.c")]


def engine_sources():
    """kvcoord._engine: python/ext/engine*.c, the transfer engine (src/xfer/**)
    and the library it reports through (the core sources of _kvcoord)."""
    ext = sorted(glob.glob(os.path.join(HERE, "ext", "engine*.c")))
    xfer = sorted(glob.glob(os.path.join(ROOT, "src", "xfer", "**", "*.c"), recursive=True))
    core = [f for f in sources() if not f.startswith(os.path.join(HERE, ""))]
    return ext + xfer + core


def engine_macros():
    """What this transfer.h offers (python/ext/engine_peer.c): READ, descriptor fetch."""
    with open(os.path.join(ROOT, "include", "kvcoord", "transfer.h"), encoding="utf-8") as f:
        text = f.read()
    return [("KVT_HAVE_" + fn.upper(), None) for fn in ("submit_read", "descriptor_fetch")
            if "kvt_%s(" % fn in text]


def engine_includes():
    xfer = os.path.join(ROOT, "src", "xfer")
    dirs = {os.path.dirname(f) for f in glob.glob(os.path.join(xfer, "**", "*.h"), recursive=True)}
    core = sorted(glob.glob(os.path.join(ROOT, "src", "core", "*", "")))
    return [os.path.join(ROOT, "include")] + core + [os.path.join(ROOT, "src", "common")] + sorted(dirs)


setup(
    name="kvcoord",
    version=version(),
    description="The node's shared-memory coordinator for disaggregated LLM serving, from Python",
    packages=["kvcoord", "kvcoord.sglang", "kvcoord.mooncake"],
    package_dir={"kvcoord": os.path.relpath(os.path.join(HERE, "kvcoord")),
                 "kvcoord.sglang": os.path.relpath(os.path.join(HERE, "kvcoord", "sglang")),
                 "kvcoord.mooncake": os.path.relpath(os.path.join(HERE, "kvcoord", "mooncake"))},
    package_data={"kvcoord": ["py.typed", "*.pyi"], "kvcoord.sglang": ["*.pyi"]},
    python_requires=">=3.10",  # Py_NewRef (python/ext/)
    ext_modules=[
        Extension(
            "kvcoord._kvcoord",
            sources=sources(),
            include_dirs=[os.path.join(ROOT, "include"), os.path.join(HERE, "ext")]
            + sorted(glob.glob(os.path.join(ROOT, "src", "core", "*", "")))
            + [os.path.join(ROOT, "src", "common")],
            define_macros=[("_GNU_SOURCE", None)],
            libraries=["jansson", "rt"],
            # the library's kvc_* symbols stay inside the module (only PyInit_ is exported)
            extra_compile_args=["-std=c11", "-fvisibility=hidden"],
            extra_link_args=["-pthread"],
        ),
        Extension(
            "kvcoord._engine",
            sources=engine_sources(),
            include_dirs=engine_includes(),
            define_macros=[("_GNU_SOURCE", None)] + engine_macros(),
            libraries=["jansson", "uring", "ibverbs", "rt"],
            extra_compile_args=["-std=c11", "-fvisibility=hidden"],
            extra_link_args=["-pthread"],
        ),
    ],
    # sglang's plugin framework (sglang.srt.plugins.load_plugins) runs it in every
    # sglang process: docs/mooncake.md, "sglang on it, unchanged"
    entry_points={"sglang.srt.plugins": ["kvcoord = kvcoord.sglang_plugin:load"]},
    zip_safe=False,
)
