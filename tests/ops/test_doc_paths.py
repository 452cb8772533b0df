#!/usr/bin/env python3
"""Every relative link and every repository path named in the user-facing docs
(README.md, docs/*.md, RELIABILITY.md) exists.

Checked, in each document:
  - markdown links [text](target) and <a href>: targets other than http(s):,
    mailto: or a bare #anchor must name a file or directory inside the
    repository (relative to the document); a #anchor on a markdown target, or
    a bare #anchor, must be a heading of that document (GitHub's slug rule);
  - paths starting src/, tests/ or tools/ (in code spans or prose; not
    python/..., which in these docs is as often sglang's tree as ours): the
    file or directory exists (a trailing :LINE is dropped; auth.[ch] means
    both files; names with <placeholders>, globs or "..." are checked up to
    the directory before the placeholder);
  - a bare NAME.md names a file of the repository;
  - a layout version said to be this build's ("this build reads N", "layout
    version N, as this build", "this build ... uses layout version N") is
    KVC_LAYOUT_VERSION of include/kvcoord/kvcoord.h, and in "layout version
    N (this build reads M)" N is not above M.
Prints each miss as DOC:LINE: what, and exits 1 if there is any.
Usage: test_doc_paths.py REPO_ROOT
"""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
DOCS = ["README.md", "RELIABILITY.md"] + sorted(
    os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|<a\s+href=\"([^\"]+)\"")
PATH = re.compile(r"(?<![\w/.@-])((?:src|tests|tools)/[\w./@+<>*\[\]-]*)")
MDNAME = re.compile(r"(?<![\w/.-])([\w-]+\.md)\b")


def slug(heading, seen):
    s = heading.strip().lower()
    s = re.sub(r"`", "", s)
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", s)  # a link in a heading: its text
    s = re.sub(r"[^\w\- ]", "", s)
    s = s.replace(" ", "-")
    n = seen.get(s, 0)
    seen[s] = n + 1
    return s if n == 0 else "%s-%d" % (s, n)


def anchors(path):
    out, seen, fence = set(), {}, False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.lstrip().startswith("```"):
                fence = not fence
                continue
            m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m and not fence:
                out.add(slug(m.group(1), seen))
    return out


def inside(path):
    real = os.path.realpath(path)
    return real == ROOT or real.startswith(ROOT + os.sep)


def build_layout_version():
    with open(os.path.join(ROOT, "include", "kvcoord", "kvcoord.h"), encoding="utf-8") as f:
        m = re.search(r"^#define KVC_LAYOUT_VERSION (\d+)u?\b", f.read(), re.M)
    return int(m.group(1)) if m else None


BUILD_SAYS = [re.compile(r"this build reads (\d+)"),
              re.compile(r"layout version (\d+), as this build"),
              re.compile(r"this build(?: of kvcoord)? uses layout version (\d+)")]
SHOWN = re.compile(r"layout version\s+(\d+) \(this build reads (\d+)\)")


def check_layout(line, build):
    """Misses of a line that quotes the build's layout version."""
    out = []
    for rx in BUILD_SAYS:
        for m in rx.finditer(line):
            if int(m.group(1)) != build:
                out.append("says this build's layout version is %s; it is %d (kvcoord.h)"
                           % (m.group(1), build))
    for m in SHOWN.finditer(line):
        if int(m.group(1)) > int(m.group(2)):
            out.append("shows a segment of layout version %s newer than the build's %s"
                       % (m.group(1), m.group(2)))
    return out


def check_path(p):
    """The existing-path test for a path named in prose; None when fine."""
    p = re.sub(r":\d+(-\d+)?$", "", p)
    p = p.rstrip(".,;:)")
    m = re.match(r"(.*)\[(\w+)\](.*)$", p)  # auth.[ch]: auth.c and auth.h
    if m:
        for alt in m.group(2):
            why = check_path(m.group(1) + alt + m.group(3))
            if why:
                return why
        return None
    cut = [i for i in (p.find("<"), p.find("*"), p.find("...")) if i >= 0]
    if cut:
        p = p[:min(cut)]
        p = p[:p.rfind("/") + 1] if "/" in p else p  # up to the last whole directory
    if not p:
        return None
    return None if os.path.exists(os.path.join(ROOT, p)) else "no such path: %s" % p


def main():
    misses = []
    layout = build_layout_version()
    if layout is None:
        misses.append("include/kvcoord/kvcoord.h: no #define KVC_LAYOUT_VERSION")
    mdfiles = {}
    for dirpath, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and not d.startswith("build")]
        for f in files:
            if f.endswith(".md"):
                mdfiles.setdefault(f, os.path.join(dirpath, f))
    for doc in DOCS:
        full = os.path.join(ROOT, doc)
        here = os.path.dirname(full)
        own = anchors(full)
        fence = False
        with open(full, encoding="utf-8") as f:
            lines = f.read().split("\n")
        for no, line in enumerate(lines, 1):
            where = "%s:%d" % (doc, no)
            if line.lstrip().startswith("```"):
                fence = not fence
            for m in LINK.finditer(line):
                t = m.group(1) or m.group(2)
                if re.match(r"(https?|mailto|ftp):", t):
                    continue
                target, _, frag = t.partition("#")
                if not target:
                    if frag and frag not in own:
                        misses.append("%s: no heading for #%s in %s" % (where, frag, doc))
                    continue
                tp = os.path.normpath(os.path.join(here, target))
                if not inside(tp):
                    misses.append("%s: link outside the repository: %s" % (where, t))
                elif not os.path.exists(tp):
                    misses.append("%s: link to a missing file: %s" % (where, t))
                elif frag and tp.endswith(".md") and frag not in anchors(tp):
                    misses.append("%s: no heading for #%s in %s" % (where, frag, target))
            # paths in prose (links' targets were checked above)
            text = LINK.sub(lambda m: m.group(0).split("](")[0], line)
            for m in PATH.finditer(text):
                why = check_path(m.group(1))
                if why:
                    misses.append("%s: %s" % (where, why))
            if layout is not None:
                misses.extend("%s: %s" % (where, why) for why in check_layout(line, layout))
            for m in MDNAME.finditer(text):
                if m.group(1) not in mdfiles:
                    misses.append("%s: names %s, which is not in the repository" % (where, m.group(1)))
    for x in misses:
        print(x)
    print("%d documents checked, %d misses" % (len(DOCS), len(misses)))
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
