"""Rooms fail promptly with kvcoordd dead (README: "every reader checks").

kvcoordd publishes a watch beat every 100 ms; readers trust its dead marks
only while the beat is under 500 ms old (kvc_proc_watch_beat).  kvcoordd is
SIGKILLed, then a participant of a Transferring room: rank 0's first read
later than kvcoordd's death + 500 ms + the 100 ms /proc re-check (+ 50 ms
for the coarse clock) must see the room Failed.  With the old 1 s beat
trusted for 3 s it read Transferring for some 2.3 s.
"""

import os
import signal
import time
import unittest

import kvcoord
from kvctest import DEADLINE, Daemon, discard, new_name

BOUND = 0.5 + 0.1 + 0.05  # KVC_PROC_WATCH_STALE_MS + re-check + clock


class DaemonKilledFirst(unittest.TestCase):
    def test_participant_killed_after_kvcoordd(self):
        name = new_name("watch")
        d = Daemon(name)
        r, w = os.pipe()
        child = os.fork()
        if child == 0:  # a worker: rank 1 of room 7001, Transferring
            try:
                s = kvcoord.Segment(name, rank=1)
                s.room_open(7001, 1, 2, "decode")
                s.room_set_state(7001, 1, kvcoord.KVPoll.Transferring)
                os.write(w, b"x")
                while True:
                    time.sleep(100)
            finally:
                os._exit(1)
        try:
            self.assertEqual(os.read(r, 1), b"x")
            s = kvcoord.Segment(name, rank=0)
            s.room_open(7001, 0, 2, "prefill")
            self.assertIs(s.room_state(7001), kvcoord.KVPoll.Bootstrapping)
            time.sleep(1.5)  # kvcoordd has scanned the table and beats
            d.sigkill()
            dead = time.monotonic()
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            child = 0
            while True:  # rank 0 polls; nothing asserted before the bound
                t = time.monotonic()
                state = s.room_state(7001)
                if t > dead + BOUND:
                    break
                self.assertLess(t, dead + DEADLINE)  # hang guard
                time.sleep(0.02)
            self.assertIs(state, kvcoord.KVPoll.Failed)
            self.assertIn("rank 1", s.room_failure(7001, 0).reason)
            s.close()
        finally:
            if child:
                os.kill(child, signal.SIGKILL)
                os.waitpid(child, 0)
            os.close(r)
            os.close(w)
            if d.alive():
                d.sigkill()
            discard(name)


if __name__ == "__main__":
    unittest.main()
