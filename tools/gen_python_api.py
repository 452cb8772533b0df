#!/usr/bin/python3
"""Write docs/python-api.md, the Python API reference, from the docstrings.

The page lists, for each public module (kvcoord, kvcoord.sglang,
kvcoord.mooncake), every name of its __all__ with its signature and its
docstring, and for classes their public methods and properties, in the
order of __all__ and then of the class's own definitions.  It is
generated: edit the docstrings, then run

    PYTHONPATH=build/python /usr/bin/python3 tools/gen_python_api.py

(--check compares instead of writing and exits 1 when the page is stale:
the ctest `ops_python_api` runs that).  Standard library only (inspect);
the output depends on the docstrings alone, never on addresses or paths.
"""

import argparse
import enum
import importlib
import inspect
import os
import sys

MODULES = ["kvcoord", "kvcoord.sglang", "kvcoord.mooncake"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "python-api.md")

HEADER = """# Python API reference

Generated from the docstrings by `tools/gen_python_api.py` (do not edit by hand:
edit the docstrings and rerun it; the `ops_python_api` test fails when this page
is stale). The guide, with examples: [python.md](python.md); the Mooncake-compatible
engine: [mooncake.md](mooncake.md).
"""


def signature(obj):
    """The call signature of obj as text, or "" when Python cannot tell."""
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""


def doc(obj):
    """obj's own docstring, cleaned (indentation removed), or ""."""
    d = obj.__doc__ if isinstance(obj.__doc__, str) else None
    return inspect.cleandoc(d) if d else ""


def block(text):
    """A docstring as an indented literal block (kept exactly as written)."""
    if not text:
        return "*(no docstring)*\n"
    return "\n".join(("    " + line) if line else "" for line in text.split("\n")) + "\n"


def members(cls):
    """The public members defined by cls itself, in definition order."""
    out = []
    for name, value in cls.__dict__.items():
        if name.startswith("_") and name not in ("__init__", "__call__", "__enter__", "__exit__"):
            continue
        if name.startswith("__") and not doc(value):
            continue  # protocol methods without a docstring of their own
        out.append((name, value))
    return out


def render_class(qual, cls):
    lines = ["### class `%s%s`\n" % (qual, signature(cls) if not issubclass(cls, BaseException)
                                       else ""), block(doc(cls))]
    if issubclass(cls, enum.Enum):
        lines.append("Members: " + ", ".join("`%s` = %r" % (m.name, m.value) for m in cls) + "\n")
        return lines
    bases = [b.__name__ for b in cls.__bases__ if b is not object]
    if bases:
        lines.append("Bases: " + ", ".join("`%s`" % b for b in bases) + "\n")
    for name, value in members(cls):
        if isinstance(value, property):
            lines += ["#### `%s.%s` (property)\n" % (cls.__name__, name), block(doc(value))]
        elif isinstance(value, (staticmethod, classmethod)):
            f = value.__func__
            lines += ["#### `%s.%s%s`\n" % (cls.__name__, name, signature(f)), block(doc(f))]
        elif callable(value) or inspect.ismethoddescriptor(value):
            lines += ["#### `%s.%s%s`\n" % (cls.__name__, name, signature(value)),
                      block(doc(value))]
        elif inspect.isdatadescriptor(value) or inspect.isgetsetdescriptor(value) \
                or inspect.ismemberdescriptor(value):
            lines += ["#### `%s.%s` (attribute)\n" % (cls.__name__, name), block(doc(value))]
    return lines


def render_module(modname):
    mod = importlib.import_module(modname)
    lines = ["## `%s`\n" % modname, block(doc(mod))]
    for name in getattr(mod, "__all__", []):
        obj = getattr(mod, name)
        qual = "%s.%s" % (modname, name)
        if inspect.isclass(obj):
            lines += render_class(qual, obj)
        elif callable(obj):
            lines += ["### `%s%s`\n" % (qual, signature(obj)), block(doc(obj))]
        else:
            lines += ["### `%s` = `%r`\n" % (qual, obj)]
    return lines


def render():
    lines = [HEADER]
    for m in MODULES:
        lines += render_module(m)
    text = "\n".join(line.rstrip("\n") + "\n" for line in lines)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="compare with docs/python-api.md instead of writing it; exit 1 if stale")
    ap.add_argument("--out", default=PAGE, help="the page (default docs/python-api.md)")
    args = ap.parse_args()
    text = render()
    if args.check:
        try:
            with open(args.out, encoding="utf-8") as f:
                old = f.read()
        except FileNotFoundError:
            old = ""
        if old != text:
            print("%s is stale: rerun PYTHONPATH=build/python /usr/bin/python3 "
                  "tools/gen_python_api.py" % os.path.relpath(args.out, ROOT), file=sys.stderr)
            return 1
        print("%s is current" % os.path.relpath(args.out, ROOT))
        return 0
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print("wrote %s (%d lines)" % (os.path.relpath(args.out, ROOT), text.count("\n")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
