#!/usr/bin/env python3
"""The transfer engine's layers as docs/transfer.md ("Backends") draws them.

- The shared code (the engine: xfer_engine.c, xfer_submit.c, xfer_desc.c;
  the connection layer: xfer_conn.c, xfer_rx.c) includes no backend header
  (xfer_tcp.h, xfer_verbs.h) and names no backend function (kvt__tcp_*,
  kvt__verbs_*): it calls them through e->net and e->rdma.
- xfer_backends.c is the one file that names both tables.
- The tcp backend (xfer_tcp.c) never calls into the receive path
  (kvt__rx_*): a recv's completion goes through the connection layer.
- The connection layer's functions are declared in xfer_conn.h only.
Prints each breach and exits 1 if there is any.
Usage: test_xfer_layers.py SRC_XFER_DIR
"""
import os
import re
import sys

D = sys.argv[1]
SHARED = ["xfer_engine.c", "xfer_submit.c", "xfer_read.c", "xfer_fetch.c", "xfer_desc.c", "xfer_conn.c",
          "xfer_rx.c"]


def code(path):
    """The file's text without comments and string literals."""
    s = open(path, encoding="utf-8").read()
    s = re.sub(r"/\*.*?\*/", " ", s, flags=re.S)
    s = re.sub(r"//[^\n]*", " ", s)
    return re.sub(r'"(\\.|[^"\\])*"', '""', s)


def main():
    bad = []
    for f in SHARED:
        s = code(os.path.join(D, f))
        for h in ("xfer_tcp.h", "xfer_verbs.h"):
            if re.search(r'#include\s*"%s"' % re.escape(h), s):
                bad.append("%s includes the backend header %s" % (f, h))
        for m in sorted(set(re.findall(r"\bkvt__(?:tcp|verbs)_\w+", s))):
            bad.append("%s names the backend function %s" % (f, m))
    s = code(os.path.join(D, "xfer_tcp.c"))
    for m in sorted(set(re.findall(r"\bkvt__rx_\w+", s))):
        bad.append("xfer_tcp.c calls the receive path: %s" % m)
    named = [f for f in os.listdir(D) if f.endswith(".c")
             and re.search(r"\bkvt__(tcp|verbs)_(net|rdma)\b", code(os.path.join(D, f)))
             and f not in ("xfer_backends.c", "xfer_tcp.c")]
    bad += ["%s names a backend's table (only xfer_backends.c may)" % f for f in named]
    conn = set(re.findall(r"\b(kvt__(?:conn_\w+|ctl_wr))\s*\(", code(os.path.join(D, "xfer_conn.h"))))
    for h in [f for f in os.listdir(D) if f.endswith(".h") and f != "xfer_conn.h"]:
        for m in sorted(conn & set(re.findall(r"\b(kvt__\w+)\s*\(", code(os.path.join(D, h))))):
            bad.append("%s declares the connection layer's %s (xfer_conn.h's)" % (h, m))
    if not conn:
        bad.append("xfer_conn.h declares no kvt__conn_* function")
    for b in bad:
        print(b)
    print("%d breaches" % len(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
