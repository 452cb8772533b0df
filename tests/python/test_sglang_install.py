"""kvcoord.sglang.install() on the sglang-shaped fixture (tests/python/fake_sglang),
in one process: sglang's local rules answer the same before and after it;
uninstall() puts back every original by identity; rooms are released on
clear (10,000 rooms through a 64-room table); a room kvcoord fails itself
(the room TTL, a SIGKILLed participant) raises, through sglang's own
failure_exception and exception class, a reason that says so.
"""

import os
import signal
import sys
import time
import unittest

import kvcoord
import kvcoord.sglang as ksg
from kvctest import DEADLINE, SMALL, discard, new_name, wait_for
from sgltest import use_fixture

sglang = use_fixture()
from sglang.srt.disaggregation import decode, prefill, utils  # noqa: E402
from sglang.srt.disaggregation.base.conn import KVPoll as P  # noqa: E402
from sglang.srt.disaggregation.common import conn as common  # noqa: E402
from sglang.srt.disaggregation.mooncake import conn as mooncake  # noqa: E402


def raised(fn):
    """(exception class name, failure_reason or str, is_from_another_rank) of fn()."""
    try:
        fn()
    except Exception as e:  # the fixture's classes, compared by the caller
        return (type(e).__name__, getattr(e, "failure_reason", str(e)),
                getattr(e, "is_from_another_rank", None))
    return None


def scenario():
    """Every rule of sglang's bookkeeping the issue names, as observations."""
    m = mooncake.MooncakeKVManager(0)
    out = []
    m.update_status(1, P.Failed)  # Failed on a room never seen: a no-op
    out.append(("failed on unseen room kept", 1 in m.request_status))
    out.append(("check_status unknown", raised(lambda: m.check_status(1))))
    for s in (P.Bootstrapping, P.Failed, P.Success):  # Failed, then max: Success
        m.update_status(2, s)
    out.append(("bootstrapping-failed-success", m.check_status(2)))
    m.update_status(3, P.Transferring)
    m.update_status(3, P.Bootstrapping)  # lower: max keeps Transferring
    out.append(("max", m.check_status(3)))
    snd = mooncake.MooncakeKVSender(m, "10.0.0.9:8998", 4)
    m.record_failure(4, "first reason")
    m.record_failure(4, "second reason")  # overwrites (the recompute-on-abort path)
    m.update_status(4, P.Failed)
    out.append(("poll", snd.poll()))
    out.append(("overwritten reason", raised(snd.failure_exception)))
    out.append(("popped", raised(snd.failure_exception)))
    out.append(("cleared by failure_exception", 4 in m.request_status))
    snd = mooncake.MooncakeKVSender(m, "10.0.0.9:8998", 5)
    m.update_status(5, P.Success)
    out.append(("success", snd.poll()))
    snd.clear()
    out.append(("clear pops", 5 in m.request_status, raised(lambda: m.check_status(5))))
    m.update_status(5, P.Failed)  # a late abort after clear: no-op
    out.append(("failed after clear kept", 5 in m.request_status))
    again = mooncake.MooncakeKVReceiver(m, "10.0.0.9:8998", 5)  # the id reused: fresh
    out.append(("reused", again.poll(), raised(again.failure_exception)))
    rcv = mooncake.MooncakeKVReceiver(m, "10.0.0.9:8998", 6)
    rcv.abort()
    out.append(("abort", m.check_status(6), raised(rcv.failure_exception)))
    base = common.CommonKVSender(m, "10.0.0.9:8998", 7)
    out.append(("base sender", raised(base.failure_exception)))
    out.append(("left", sorted(m.request_status), sorted(m.failure_records)))
    return out


class Case(unittest.TestCase):
    def setUp(self):
        self.name = new_name("sglinst")
        self.seg = kvcoord.Segment(self.name, mode="fresh", role="client", **self.capacities())

    def capacities(self):
        return SMALL

    def tearDown(self):
        ksg.uninstall()
        self.seg.close()
        discard(self.name)


class Semantics(Case):
    def test_same_results_before_and_after_install(self):
        before = scenario()
        # the rules as sglang states them (the fixture follows sglang's code)
        self.assertEqual(dict((o[0], o[1:]) for o in before), {
            "failed on unseen room kept": (False,),
            "check_status unknown": (("KeyError", "1", None),),
            "bootstrapping-failed-success": (P.Success,),
            "max": (P.Transferring,),
            "poll": (P.Failed,),
            "overwritten reason": (("KVTransferError", "second reason", False),),
            "popped": (("KVTransferError", mooncake.UNKNOWN, True),),
            "cleared by failure_exception": (False,),
            "success": (P.Success,),
            "clear pops": (False, ("KeyError", "5", None)),
            "failed after clear kept": (False,),
            "reused": (P.Bootstrapping, ("KVTransferError", mooncake.UNKNOWN, True)),
            "abort": (P.Failed, ("KVTransferError", "Aborted by AbortReq.", False)),
            "base sender": (("Exception", "Fake KVSender Exception", None),),
            "left": ([2, 3, 7], []),
        })
        ksg.install(self.seg, 0, size=1)
        self.assertEqual(scenario(), before)
        # the segment followed: rooms 2, 3 and 7 are still followed, the others released
        self.assertEqual(sorted(r.room for r in self.seg.rooms()), [2, 3, 7])
        # the overwritten reason: the node's record is the first (the others read that)
        self.assertEqual([f.reason for f in self.seg.failures() if f.room == 4], ["first reason"])
        ksg.uninstall()  # releases what is still followed
        self.assertEqual(self.seg.rooms(), [])

    def test_install_by_name_and_errors(self):
        with self.assertRaises(kvcoord.SegmentNotFoundError):
            ksg.install(new_name("none"), 0)
        with self.assertRaises(ValueError):
            ksg.install(self.seg, 2, size=2)
        with self.assertRaises(ValueError):
            ksg.install(self.seg, -1)
        # More participants than a room holds: refused at install, the limit named.
        for size in (kvcoord.ROOM_MAX_PARTICIPANTS + 1, 100):
            with self.assertRaisesRegex(ValueError, r"^size %d exceeds the 32 participants "
                                        r"a bootstrap room holds" % size):
                ksg.install(self.seg, 0, size=size)
        with self.assertRaises(TypeError):
            ksg.install(42, 0)
        patched = ksg.install(self.name, 3)  # size: the segment's world size (8)
        self.assertIn(("sglang.srt.disaggregation.decode", "poll_and_all_reduce"), patched)
        self.assertNotIn("sglang.srt.disaggregation.ascend.conn", sys.modules)  # skipped
        with self.assertRaises(RuntimeError):
            ksg.install(self.seg, 0)
        m = mooncake.MooncakeKVManager(3)
        mooncake.MooncakeKVSender(m, "10.0.0.9:8998", 99)
        info = self.seg.room_get(99)
        self.assertEqual((info.participants, info.local[3]), (8, P.Bootstrapping))
        self.assertTrue(ksg.uninstall())
        self.assertFalse(ksg.uninstall())
        info = self.seg.room_get(99)  # this rank's part released on uninstall (the
        self.assertEqual((info.joined, info.released), (1, 1))  # other 7 never joined)


class Uninstall(Case):
    def test_restores_every_original(self):
        funcs = [(mod, n) for mod in (utils, decode, prefill) for n in dir(mod)
                 if n.startswith("poll_and_all_reduce")]
        self.assertEqual(len(funcs), 3 + 2 + 2)
        methods = [(common.CommonKVManager, "update_status"),
                   (common.CommonKVManager, "record_failure"),
                   (common.CommonKVSender, "clear"), (common.CommonKVReceiver, "clear"),
                   (common.CommonKVSender, "failure_exception"),
                   (mooncake.MooncakeFailureExceptionMixin, "failure_exception")]
        before = {(o, n): vars(o)[n] for o, n in funcs + methods}
        unpatched = {(c, n): vars(c)[n] for c, n in [(common.CommonKVManager, "check_status"),
                                                     (mooncake.MooncakeKVSender, "poll")]}
        ksg.install(self.seg, 0, size=1)
        for key, orig in before.items():
            now = vars(key[0])[key[1]]
            self.assertIsNot(now, orig, key)
            self.assertIs(now.__kvcoord_original__, orig, key)
        self.assertIs(decode.poll_and_all_reduce, utils.poll_and_all_reduce)
        for (c, n), orig in unpatched.items():  # nothing else is touched
            self.assertIs(vars(c)[n], orig)
        self.assertNotIn("clear", vars(mooncake.MooncakeKVSender))  # inherited stays inherited
        import sglang.srt.disaggregation.embedding as late  # imported after install()

        self.assertIs(late.poll_and_all_reduce, utils.poll_and_all_reduce)
        ksg.uninstall()
        for (o, n), orig in before.items():
            self.assertIs(vars(o)[n], orig, (o, n))
        self.assertIs(late.poll_and_all_reduce, before[(utils, "poll_and_all_reduce")])


class RoomsReleased(Case):
    def capacities(self):
        return dict(SMALL, max_rooms=64)

    def test_ten_thousand_rooms_through_a_64_room_table(self):
        ksg.install(self.seg, 0, size=1)
        m = mooncake.MooncakeKVManager(0)
        for room in range(1, 10001):
            kind = mooncake.MooncakeKVSender if room % 2 else mooncake.MooncakeKVReceiver
            x = kind(m, "10.0.0.9:8998", room)
            for s in (P.WaitingForInput, P.Transferring, P.Success):
                m.update_status(room, s)
            self.assertEqual(x.poll(), P.Success)
            x.clear()
        self.assertEqual(m.request_status, {})
        st = self.seg.stat()
        self.assertEqual((st["rooms_live"], st["failures_total"]), (0, 0))


class TTL(Case):
    def capacities(self):
        return dict(SMALL, room_ttl=0.2)

    def test_timed_out_room_says_so(self):
        ksg.install(self.seg, 0, size=1)
        m = mooncake.MooncakeKVManager(0)
        rcv = mooncake.MooncakeKVReceiver(m, "10.0.0.9:8998", 31)
        self.assertEqual(rcv.poll(), P.Bootstrapping)  # sglang's own view: unchanged
        wait_for(lambda: any(f.room == 31 for f in self.seg.failures())
                 or self.seg.room_get(31).failure is not None, "the room TTL")
        with self.assertRaises(common.KVTransferError) as cm:
            rcv.failure_exception()
        e = cm.exception
        self.assertIs(type(e), common.KVTransferError)
        self.assertTrue(e.is_from_another_rank)
        self.assertIn("timed out after 0.2 s", e.failure_reason)
        self.assertTrue(e.failure_reason.endswith("timed out after 0.2 s with no update (room TTL)"), e.failure_reason)
        self.assertIsNone(e.origin_rank)
        # pop-style: a second call is sglang's unknown reason
        with self.assertRaises(common.KVTransferError) as cm:
            rcv.failure_exception()
        self.assertEqual(cm.exception.failure_reason, mooncake.UNKNOWN)


class DeadParticipant(Case):
    def test_sigkilled_rank(self):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # rank 1: follows room 41, then waits to be killed
            os.close(r)
            try:
                ksg.install(self.name, 1, size=2)
                mooncake.MooncakeKVSender(mooncake.MooncakeKVManager(1), "10.0.0.9:8998", 41)
                os.write(w, b"joined")
                time.sleep(DEADLINE)
            finally:
                os._exit(1)
        os.close(w)
        try:
            self.assertEqual(os.read(r, 16), b"joined")
            ksg.install(self.seg, 0, size=2)
            m = mooncake.MooncakeKVManager(0)
            snd = mooncake.MooncakeKVSender(m, "10.0.0.9:8998", 41)
            os.kill(pid, signal.SIGKILL)
            # reaped only once noticed: how it died is read from the dead process
            wait_for(lambda: self.seg.room_get(41).failure is not None, "the death noticed")
            os.waitpid(pid, 0)
            self.assertEqual(snd.poll(), P.Bootstrapping)  # sglang's own view: unchanged
            with self.assertRaises(common.KVTransferError) as cm:
                snd.failure_exception()
        finally:
            os.close(r)
        e = cm.exception
        self.assertTrue(e.is_from_another_rank)
        self.assertEqual(e.origin_rank, 1)
        self.assertIn("rank 1 (pid %d)" % pid, e.failure_reason)
        self.assertIn("killed by signal 9", e.failure_reason)
        self.assertTrue(e.failure_reason.startswith("kvcoord failed room 41: "))


if __name__ == "__main__":
    unittest.main()
