#!/usr/bin/env python3
"""test_units.py - the build units as docs/architecture.md draws them.

Reads every CMakeLists.txt of src/, tools/ and python/ and fails when
  - a target puts another unit's folder (src/<other>/...) on its include
    path: a unit's headers reach its users by linking its target;
  - a link between targets of two folders (target_link_libraries) is not in
    architecture.md's "Links between units" table: the row of the linking
    target must name the linked one.

Usage: test_units.py SOURCE_DIR"""

import os
import re
import sys

# Object libraries listed under the library they are built into.
ROW_OF = {"kvcoord_core_obj": "kvcoord_static", "kvcoord_transfer_obj": "kvcoord_transfer_static"}
# How the table may name a linked target besides its own name.
NAMES = {"kvcoord_common": ("kvcoord_common", "common")}


def commands(text, name):
    """The argument lists of every call of the CMake command name."""
    text = re.sub(r"#[^\n]*", "", text)
    for m in re.finditer(r"\b%s\s*\(([^)]*)\)" % name, text):
        yield m.group(1).split()


def main(root):
    files = []
    for top in ("src", "tools", "python"):
        for d, _, names in os.walk(os.path.join(root, top)):
            if "CMakeLists.txt" in names:
                files.append(os.path.join(d, "CMakeLists.txt"))
    folder_of, links, errors = {}, [], []
    for f in files:
        text = open(f).read()
        rel = os.path.relpath(os.path.dirname(f), root)
        unit = "/".join(rel.split("/")[:2])  # src/<unit>, tools, python
        if unit.startswith("tools"):
            unit = "tools"
        for cmd in ("add_library", "add_executable"):
            for args in commands(text, cmd):
                folder_of[args[0]] = unit
        for args in commands(text, "target_include_directories"):
            for a in args[1:]:
                m = re.search(r"src/(\w+)", a)
                if m and "src/" + m.group(1) != unit:
                    errors.append("%s: %s puts %s on its include path" % (f, args[0], a))
        for args in commands(text, "target_link_libraries"):
            links += [(args[0], a) for a in args[1:]]
    table = open(os.path.join(root, "docs", "architecture.md")).read()
    start = table.index("### Links between units")
    rows = [ln for ln in table[start:].splitlines()[1:] if ln.startswith("|")]
    rows = rows[2:]  # the header and its rule
    checked = 0
    for t, lib in links:
        if lib not in folder_of or folder_of.get(t) == folder_of[lib]:
            continue  # a system library, or a link inside one unit
        row_t = ROW_OF.get(t, t)
        row = [r for r in rows if "`%s`" % row_t in r.split("|")[1]]
        names = NAMES.get(lib, (lib,))
        checked += 1
        if not row or not any(("`%s`" % n if n == lib else n) in row[0].split("|")[2]
                              for n in names):
            errors.append("architecture.md's links table does not list %s -> %s" % (t, lib))
    print("%d CMake files, %d links between units checked" % (len(files), checked))
    for e in errors:
        print("FAIL:", e)
    return 1 if errors or not checked else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
