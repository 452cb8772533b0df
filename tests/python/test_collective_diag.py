"""Segment.allreduce_min: what a caller is told, and when (issue 30).

- close() wins: a thread waiting in allreduce_min (timeout=20, or None) for
  a rank that never comes is woken by close() from another thread and
  raises SegmentClosedError; close() returns as the call ends.
- Ctrl-C: SIGINT to a process whose main thread waits in allreduce_min
  (timeout=None) raises KeyboardInterrupt there, and its peer's call of the
  same round fails at once naming the rank that gave up; the next round of
  the group works.  So does every other endless wait of a Segment (wait,
  room_wait, wait_change), and close() ends each of them too.
- A size mismatch (rank 1 calls with size 3, rank 0 with size 2, either
  first) is named as such on every rank, at once; so is a call of another
  kind in the same round (the first rank that differs).
No assertion is about time: a call not woken at once would wait out its
60 s timeout and raise another error than the one asserted.
"""

import os
import signal
import sys
import threading
import time
import unittest

import kvcoord
from kvctest import DEADLINE, SegmentCase, collect, fork_children

LONG = 60.0  # longer than any test here should take: waiting it out fails the test


class CloseWins(SegmentCase):
    def waiter_closed(self, timeout):
        seg = kvcoord.Segment(self.name, role="client")
        ended, started = [], threading.Event()

        def wait():
            started.set()
            try:
                seg.allreduce_min(0xc105e, 2, 0, b"\x03", timeout=timeout)  # rank 1 never comes
                ended.append(None)
            except Exception as e:
                ended.append(e)

        t = threading.Thread(target=wait)
        t.start()
        started.wait()
        time.sleep(0.3)  # inside the wait
        t0 = time.monotonic()
        seg.close()
        took = time.monotonic() - t0
        t.join(DEADLINE)
        self.assertFalse(t.is_alive(), "allreduce_min still waits after close()")
        print("\nclose() during allreduce_min(timeout=%s) returned in %.1f ms"
              % (timeout, took * 1e3), file=sys.stderr)
        self.assertIsInstance(ended[0], kvcoord.SegmentClosedError, repr(ended[0]))
        self.assertIn("closed while the call waited", str(ended[0]))

    def test_close_wakes_a_timed_wait(self):
        self.waiter_closed(20)

    def test_close_wakes_an_endless_wait(self):
        self.waiter_closed(None)


def interrupted_child(i, name, ready_w):
    with kvcoord.Segment(name, role="client") as seg:
        if i == 0:  # the main thread waits for rank 2, which never comes
            os.write(ready_w, b"r")
            try:
                seg.allreduce_min(0x1c, 3, 0, b"\x04\x04", timeout=None)
                return "returned"
            except KeyboardInterrupt:
                first = "KeyboardInterrupt"
        else:  # rank 1 waits in the same round: told that rank 0 gave up
            try:
                seg.allreduce_min(0x1c, 3, 1, b"\x02\x04", timeout=LONG)
                return "returned"
            except kvcoord.CollectiveError as e:
                first = [str(e), e.ranks, e.dead]
        # the group goes on: a round of its own group with the other rank
        return [first, list(seg.allreduce_min(0x2c, 2, i, [i + 1, 7], timeout=LONG))]


WAITS = {
    "wait": lambda seg: seg.wait(37, timeout=None),  # never registered
    "room_wait": lambda seg: seg.room_wait(4242, 1, timeout=None),  # stays Bootstrapping
    "wait_change": lambda seg: seg.wait_change(seg.epoch(), timeout=None),
    "allreduce_min": lambda seg: seg.allreduce_min(0xe1, 2, 0, b"", timeout=None),
}


def every_wait_child(i, name, ready_w):
    out = {}
    with kvcoord.Segment(name, role="client") as seg:
        seg.room_open(4242, 0, 2)
        for what, wait in sorted(WAITS.items()):
            try:  # a SIGINT that comes before the wait starts ends it too
                os.write(ready_w, b"r")
                wait(seg)
                out[what] = "returned"
            except KeyboardInterrupt:
                out[what] = "KeyboardInterrupt"
            except Exception as e:
                out[what] = repr(e)
        seg.room_release(4242, 0)
    return out


def closing_handler_child(i, name, ready_w):
    seg = kvcoord.Segment(name, role="client")
    signal.signal(signal.SIGINT, lambda *_: seg.close())  # sglang-like: shut down on Ctrl-C
    os.write(ready_w, b"r")
    try:
        seg.allreduce_min(0xe2, 2, 0, b"", timeout=None)
        return "returned"
    except Exception as e:
        return type(e).__name__


class EveryWait(SegmentCase):
    def test_sigint_handler_that_closes(self):
        # The handler runs once the call left the library: closing there
        # does not wait for the call that runs it.
        r, w = os.pipe()
        kids = fork_children(1, closing_handler_child, self.name, w)
        os.close(w)
        self.assertEqual(os.read(r, 1), b"r")
        os.close(r)
        time.sleep(0.4)
        os.kill(kids[0][0], signal.SIGINT)
        res = collect(kids)
        self.assertEqual(res[0].get("result"), "SegmentClosedError", res[0])

    def test_ctrl_c_ends_every_wait(self):
        r, w = os.pipe()
        kids = fork_children(1, every_wait_child, self.name, w)
        os.close(w)
        for _ in WAITS:
            self.assertEqual(os.read(r, 1), b"r")
            time.sleep(0.4)  # inside the wait
            os.kill(kids[0][0], signal.SIGINT)
        os.close(r)
        res = collect(kids)
        self.assertNotIn("error", res[0], res[0].get("error"))
        self.assertEqual(res[0]["result"], {k: "KeyboardInterrupt" for k in WAITS})

    def test_close_ends_every_wait(self):
        seg = kvcoord.Segment(self.name, role="client")
        seg.room_open(4242, 0, 2)
        ended, threads = {}, []
        for what, wait in WAITS.items():
            def run(what=what, wait=wait):
                try:
                    wait(seg)
                    ended[what] = "returned"
                except Exception as e:
                    ended[what] = type(e).__name__
            threads.append(threading.Thread(target=run))
        for t in threads:
            t.start()
        time.sleep(0.4)  # every thread inside its wait
        seg.close()
        for t in threads:
            t.join(DEADLINE)
            self.assertFalse(t.is_alive())
        self.assertEqual(ended, {k: "SegmentClosedError" for k in WAITS})


class CtrlC(SegmentCase):
    def test_sigint_interrupts_the_main_thread(self):
        r, w = os.pipe()
        kids = fork_children(2, interrupted_child, self.name, w)
        os.close(w)
        self.assertEqual(os.read(r, 1), b"r")
        os.close(r)
        time.sleep(0.5)  # rank 0 inside its wait
        os.kill(kids[0][0], signal.SIGINT)
        res = collect(kids)
        for i in range(2):
            self.assertNotIn("error", res[i], res[i].get("error"))
        first0, again0 = res[0]["result"]
        first1, again1 = res[1]["result"]
        self.assertEqual(first0, "KeyboardInterrupt")
        self.assertIn("rank 0 of group 0x1c gave up the call", first1[0])
        self.assertEqual(first1[1:], [[0], False])
        self.assertEqual(again0, [1, 7])
        self.assertEqual(again1, [1, 7])


def size_child(i, name, first):
    """Rank i of group 0x5e (rank 1 says size 3, rank 0 size 2); `first`
    calls first, the other a moment later."""
    with kvcoord.Segment(name, role="client") as seg:
        if i != first:
            time.sleep(0.5)
        try:
            seg.allreduce_min(0x5e, 3 if i == 1 else 2, i, b"\x01", timeout=LONG)
            return "returned"
        except kvcoord.Error as e:
            return [type(e).__name__, str(e)]


def kind_child(i, name):
    with kvcoord.Segment(name, role="client") as seg:
        out = []
        for kind in ((1, 1), (1, 4), (2, 2)):
            try:
                out.append(list(seg.allreduce_min(0x6e, 2, i, [i, 3], timeout=LONG,
                                                  kind=kind[i])))
            except kvcoord.InvalidArgumentError as e:
                out.append(str(e))
        return out


class Mismatch(SegmentCase):
    def sizes(self, first):
        res = collect(fork_children(2, size_child, self.name, first))
        for i in range(2):
            self.assertNotIn("error", res[i], res[i].get("error"))
            cls, msg = res[i]["result"]
            self.assertEqual(cls, "InvalidArgumentError", msg)
            self.assertIn("a size mismatch", msg)
            late = 1 - first  # the one that found the group made by the other
            self.assertIn("rank %d of group 0x5e called with size %d, the group's ranks with "
                          "size %d" % (late, 3 if late == 1 else 2, 2 if late == 1 else 3), msg)

    def test_size_mismatch_rank1_first(self):
        self.sizes(1)

    def test_size_mismatch_rank0_first(self):
        self.sizes(0)

    def test_kind_mismatch(self):
        res = collect(fork_children(2, kind_child, self.name))
        for i in range(2):
            self.assertNotIn("error", res[i], res[i].get("error"))
            same, differ, again = res[i]["result"]
            self.assertEqual(same, [0, 3])
            self.assertIn("rank 1 of group 0x6e made a call of kind 4, rank 0 one of kind 1",
                          differ)
            self.assertEqual(again, [0, 3])


if __name__ == "__main__":
    unittest.main()
