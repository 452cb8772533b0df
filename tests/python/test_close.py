"""Segment.close() wins: once it starts, new calls raise SegmentClosedError
(a kvcoord.Error saying "closed"), and it returns as soon as the calls
already inside the library end, even while several threads keep calling
lookup, lookup_raw, ranks and wait.  Prints how long close() took; the only
limit is the generous hang guard (no assertion about speed).
"""

import sys
import threading
import time
import unittest

import kvcoord
from kvctest import DEADLINE, SMALL, discard, new_name


class CloseWins(unittest.TestCase):
    def run_against(self, nthreads):
        name = new_name("close")
        try:
            seg = kvcoord.Segment(name, mode="fresh", rank=0, **SMALL)
            seg.register(0, "h:1", {"a": list(range(100))})
            calls = [
                lambda: seg.lookup(0).weights_info_dict,
                lambda: seg.lookup_raw(0),
                lambda: seg.ranks(),
                lambda: seg.wait(0, timeout=DEADLINE),  # registered: returns at once
                lambda: seg.wait(5, timeout=DEADLINE),  # never registered: sleeps in slices
            ]
            running = threading.Barrier(nthreads + 1)
            ended = []
            counts = [0] * nthreads

            def caller(i):
                call = calls[i % len(calls)]
                running.wait()
                try:
                    while True:
                        call()
                        counts[i] += 1
                except Exception as e:  # close() ends the loop; any other error is reported
                    ended.append(e)

            threads = [threading.Thread(target=caller, args=(i,)) for i in range(nthreads)]
            for t in threads:
                t.start()
            running.wait()
            time.sleep(0.2)  # let every thread be busy calling
            done = threading.Event()
            took = []

            def closer():
                t0 = time.monotonic()
                seg.close()
                took.append(time.monotonic() - t0)
                done.set()

            c = threading.Thread(target=closer)
            c.start()
            self.assertTrue(done.wait(DEADLINE), "close() did not return within %g s" % DEADLINE)
            for t in threads:
                t.join(DEADLINE)
                self.assertFalse(t.is_alive())
            print("\n%d threads calling (%d calls made): close() returned in %.1f ms"
                  % (nthreads, sum(counts), took[0] * 1e3), file=sys.stderr)
            self.assertEqual(len(ended), nthreads)
            for e in ended:
                self.assertIsInstance(e, kvcoord.SegmentClosedError)
                self.assertIsInstance(e, kvcoord.Error)
                self.assertIsInstance(e, ValueError)
                self.assertIn("closed", str(e))
            with self.assertRaises(kvcoord.SegmentClosedError):
                seg.lookup(0)
            self.assertTrue(seg.closed)
            seg.close()  # idempotent
        finally:
            discard(name)

    def test_two_threads(self):
        self.run_against(2)

    def test_five_threads(self):
        self.run_against(5)

    def test_while_closing_new_calls_fail(self):
        """A call made after close() started (close waiting on a call in
        progress) fails at once instead of being admitted."""
        name = new_name("closing")
        try:
            seg = kvcoord.Segment(name, mode="fresh", rank=0, **SMALL)
            inside = threading.Event()

            def waiter():
                inside.set()
                try:
                    seg.wait(5, timeout=DEADLINE)
                except kvcoord.Error:
                    pass

            w = threading.Thread(target=waiter)
            w.start()
            inside.wait()
            time.sleep(0.05)  # the waiter sleeps in a wait slice
            c = threading.Thread(target=seg.close)
            c.start()
            while not seg.closed and c.is_alive():
                # close() started or is about to: no call is admitted once it has
                try:
                    seg.lookup_raw(5)
                except kvcoord.SegmentClosedError:
                    break
                except kvcoord.NotFoundError:
                    time.sleep(0.001)
            with self.assertRaises(kvcoord.SegmentClosedError):
                seg.ranks()
            c.join(DEADLINE)
            w.join(DEADLINE)
            self.assertFalse(c.is_alive())
            self.assertTrue(seg.closed)
        finally:
            discard(name)


if __name__ == "__main__":
    unittest.main()
