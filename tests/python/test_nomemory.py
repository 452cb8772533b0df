"""Every allocation the binding makes through CPython may fail: each call is
run again and again with the n-th allocation failing (n = 0, 1, 2, ... until
the call needs fewer), through _testcapi.set_nomemory (Debian's
libpython3.11-stdlib).  Each run must end in the call's result, MemoryError
or the call's own error: never SystemError ("returned NULL without setting an
exception"), another exception, a crash, or a segment left unusable.  The
allocations libkvcoord makes itself (malloc) are not covered: the C tests
cover those.  Runs in a child interpreter so that a crash is a test failure.
"""

import os
import subprocess
import sys
import unittest

from kvctest import SMALL, discard, new_name

CHILD = r'''
import json, sys
import _testcapi
import kvcoord

name = sys.argv[1]
SMALL = json.loads(sys.argv[2])
seg = kvcoord.Segment(name, mode="fresh", rank=0, **SMALL)
seg.register(0, "h:1", {"a": [1, 2, {"b": "c"}], "d": "e" * 100})
seg.room_open(7, 0, 2)
seg.room_fail(7, 0, "transport retry counter exceeded", 12)
seg.room_open(8, 0, 2)


def lookup_all():
    ri = seg.lookup(0)
    return ri.weights_info_dict, ri.info, repr(ri), ri.session_id


def reopen():
    with kvcoord.Segment(name, role="client") as s:
        return s.lookup_raw(0)


CALLS = {
    "lookup": lookup_all,
    "lookup_raw": lambda: seg.lookup_raw(0),
    "lookup_missing": lambda: seg.lookup(5),
    "ranks": lambda: [repr(r) for r in seg.ranks(include_withdrawn=True)],
    "rooms": lambda: seg.rooms(),
    "procs": lambda: seg.procs(),
    "failures": lambda: seg.failures(),
    "room_get": lambda: seg.room_get(7, 1),
    "room_get_missing": lambda: seg.room_get(9),
    "check_room": lambda: seg.check_room(7, 1),
    "check_room_ok": lambda: seg.check_room(8, 0),
    "transfer_error": lambda: kvcoord.transfer_error(seg.room_get(7, 1).failure),
    "room_sync": lambda: seg.room_sync(0, [7, 8], [3, 3]),
    "room_wait": lambda: seg.room_wait(7, 1, 1, timeout=1),
    "stat": lambda: seg.stat(),
    "roles": lambda: seg.roles(),
    "register": lambda: seg.register(0, "h:1", {"a": [1, 2, {"b": "c"}], "d": "e" * 100}),
    "wait": lambda: seg.wait(0, timeout=1),
    "bad_rank": lambda: seg.lookup(-1),
    "open_close": reopen,
    "wait_status_text": lambda: kvcoord.wait_status_text(9),
}
OWN = {"lookup_missing": KeyError, "room_get_missing": KeyError, "bad_rank": ValueError,
       "check_room": kvcoord.KVTransferError}

report = {}
for what, call in CALLS.items():
    failed, memory_errors = 0, 0
    for n in range(5000):
        _testcapi.set_nomemory(n, n + 1)  # only the n-th allocation fails
        try:
            call()
            outcome = None
        except MemoryError:
            outcome = "MemoryError"
        except BaseException as e:
            outcome = e
        finally:
            _testcapi.remove_mem_hooks()
        if outcome is None or (what in OWN and isinstance(outcome, OWN[what])):
            if n > failed + 50:  # 50 runs in a row needed no failed allocation
                break
            continue
        if outcome != "MemoryError":
            print("%s: allocation %d failed -> %r" % (what, n, outcome))
            sys.exit(1)
        failed = n
        memory_errors += 1
    report[what] = memory_errors
    # the segment still works after every one of them
    assert seg.lookup(0).weights_info_dict["a"][2] == {"b": "c"}, what
seg.close()
print(json.dumps(report))
'''


# The module's initialisation (types, exceptions, constants), each failing
# allocation in a fresh forked process: exit 0 loaded, 3 MemoryError, 4 any
# other exception, a signal for a crash.
INIT = r'''
import glob, importlib.machinery, importlib.util, os, sys
import _testcapi
suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
path = [p for d in sys.path for p in glob.glob(os.path.join(d or ".", "kvcoord", "_kvcoord" + suffix))][0]
spec = importlib.util.spec_from_file_location("kvcoord._kvcoord", path)
codes = []
for n in range(20000):
    pid = os.fork()
    if pid == 0:
        code = 0
        _testcapi.set_nomemory(n, n + 1)
        try:
            importlib.util.module_from_spec(spec)
        except MemoryError:
            code = 3
        except BaseException:
            code = 4
        _testcapi.remove_mem_hooks()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    codes.append(status)
    if status == 0 and len(codes) > 50 and not any(codes[-50:]):
        break
print(" ".join(str(c) for c in codes))
'''


class AllocationFailures(unittest.TestCase):
    def test_module_init(self):
        try:
            import _testcapi  # noqa: F401
        except ImportError:
            self.skipTest("no _testcapi (Debian's libpython3.11-stdlib has it)")
        p = subprocess.run([sys.executable, "-c", INIT], capture_output=True, text=True,
                           env=os.environ)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        statuses = [int(c) for c in p.stdout.split()]
        bad = [(n, s) for n, s in enumerate(statuses) if s not in (0, 3 << 8)]
        sys.stderr.write("\nmodule init: %d allocations failed one at a time, %d MemoryError, "
                         "bad: %s\n" % (len(statuses), statuses.count(3 << 8), bad))
        self.assertEqual(bad, [])
        self.assertGreater(statuses.count(3 << 8), 10)

    def test_each_allocation_fails_once(self):
        try:
            import _testcapi  # noqa: F401
        except ImportError:
            self.skipTest("no _testcapi (Debian's libpython3.11-stdlib has it)")
        import json
        name = new_name("nomem")
        try:
            p = subprocess.run([sys.executable, "-c", CHILD, name, json.dumps(SMALL)],
                               capture_output=True, text=True, env=os.environ)
        finally:
            discard(name)
        sys.stderr.write("\n" + p.stdout + p.stderr)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        report = json.loads(p.stdout.strip().splitlines()[-1])
        # each call met at least one failing allocation it turned into MemoryError
        for what, memory_errors in report.items():
            self.assertGreater(memory_errors, 0, what)


if __name__ == "__main__":
    unittest.main()
