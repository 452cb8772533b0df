"""kvcoord.sglang's stand-alone parts: EngineInfoBootstrapServer (a
kvcoordd started or adopted, `requests` clients registering and reading over
HTTP, in-process reads from the segment), KVStatusBook (sglang's per-rank
status and failure bookkeeping with sglang's rules, the origin's reason
shared through the rooms, across forked processes too) and
poll_and_all_reduce(pollers, book) (the MIN in the segment).  install() on
sglang itself: test_sglang_install.py and test_sglang_ranks.py.
"""

import http.server
import os
import socket
import threading
import unittest

import requests

import kvcoord
from kvcoord.sglang import EngineInfoBootstrapServer, KVStatusBook, poll_and_all_reduce
from kvctest import DEADLINE, SMALL, Daemon, collect, discard, fork_children, free_port, new_name

P = kvcoord.KVPoll
REASON = "ibv_post_send: transport retry counter exceeded"


def port_open(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class BootstrapServer(unittest.TestCase):
    def setUp(self):
        if not os.environ.get("KVCOORD_DAEMON"):
            self.skipTest("KVCOORD_DAEMON not set (run through ctest)")
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port

    def tearDown(self):
        discard(kvcoord.name_for_port(self.port))

    def test_starts_kvcoordd_and_serves_requests_clients(self):
        server = EngineInfoBootstrapServer("127.0.0.1", self.port,
                                           daemon_args=["--fresh", "--max-rooms", "256"])
        try:
            self.assertIsNotNone(server.pid)
            self.assertFalse(server.adopted)
            self.assertEqual(requests.get(self.url + "/health", timeout=DEADLINE).text, "OK")
            wid = {"model.embed_tokens.weight": [139637976727552, 16032768, 2]}
            for rank in range(4):
                r = requests.put(self.url + "/register_transfer_engine_info", json={
                    "tp_rank": rank, "transfer_engine_info": {
                        "session_id": "10.0.0.5:%d" % (16000 + rank), "weights_info_dict": wid}},
                    timeout=DEADLINE)
                self.assertEqual((r.status_code, r.text), (200, "OK"))
            # in-process, from the segment: sglang's tuple, None when absent
            self.assertEqual(server.get_transfer_engine_info(2), ("10.0.0.5:16002", wid))
            self.assertIsNone(server.get_transfer_engine_info(9))
            self.assertEqual(server.transfer_engine_info.get(3), ("10.0.0.5:16003", wid))
            self.assertEqual(sorted(server.transfer_engine_info), [0, 1, 2, 3])
            self.assertIn(1, server.transfer_engine_info)
            # remote clients read what was registered
            r = requests.get(self.url + "/get_transfer_engine_info", params={"rank": 1},
                             timeout=DEADLINE)
            self.assertEqual(r.json(), {"rank": 1, "remote_instance_transfer_engine_info":
                                        ["10.0.0.5:16001", wid]})
            # parallelism configs and roles, both ways
            requests.put(self.url + "/register_parallelism_config",
                         json={"tp_rank": 1, "parallelism_config": {"tp_size": 4, "tp_rank": 1}},
                         timeout=DEADLINE)
            self.assertEqual(server.get_parallelism_config_info(1), {"tp_size": 4, "tp_rank": 1})
            self.assertIsNone(server.get_parallelism_config_info(2))
            with kvcoord.Segment(port=self.port, role="client") as worker:  # through the segment
                worker.register(0, "10.0.0.5:17000", wid, role="draft")
            self.assertEqual(server.get_transfer_engine_info(0, role="draft"),
                             ("10.0.0.5:17000", wid))
            r = requests.get(self.url + "/get_transfer_engine_info",
                             params={"rank": 0, "role": "draft"}, timeout=DEADLINE)
            self.assertEqual(r.json()["remote_instance_transfer_engine_info"][0], "10.0.0.5:17000")
            pid = server.pid
        finally:
            server.close()
        server.close()  # idempotent
        self.assertFalse(port_open(self.port))
        with self.assertRaises(ProcessLookupError):
            os.kill(pid, 0)

    def test_adopts_a_running_kvcoordd(self):
        daemon = Daemon(kvcoord.name_for_port(self.port), extra=())
        daemon.stop()  # free its ephemeral port; now serve the chosen one
        import subprocess
        proc = subprocess.Popen([os.environ["KVCOORD_DAEMON"], "--listen",
                                 "127.0.0.1:%d" % self.port, "--segment",
                                 kvcoord.name_for_port(self.port), "--fresh", "--max-rooms",
                                 "256"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            import time
            end = time.monotonic() + DEADLINE
            while not port_open(self.port):
                self.assertLess(time.monotonic(), end)
                time.sleep(0.02)
            # serving: the server's own look (/health, 2 s) then finds it at
            # once, on a loaded machine too (a daemon still starting up there
            # answered late and was not adopted)
            self.assertEqual(requests.get(self.url + "/health", timeout=DEADLINE).status_code, 200)
            with EngineInfoBootstrapServer("127.0.0.1", self.port) as server:
                self.assertTrue(server.adopted)
                self.assertIsNone(server.pid)
                requests.put(self.url + "/register_transfer_engine_info", json={
                    "rank": 0, "transfer_engine_info": {"session_id": "h:0",
                                                        "weights_info_dict": {}}},
                    timeout=DEADLINE)
                self.assertEqual(server.get_transfer_engine_info(0), ("h:0", {}))
            self.assertIsNone(proc.poll())  # an adopted kvcoordd keeps running
            self.assertTrue(port_open(self.port))
        finally:
            proc.terminate()
            proc.wait(DEADLINE)

    def test_port_taken_by_something_else(self):
        class Health(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"OK")

            def log_message(self, *a):
                pass

        httpd = http.server.HTTPServer(("127.0.0.1", self.port), Health)
        t = threading.Thread(target=httpd.serve_forever, daemon=True)
        t.start()
        try:
            with self.assertRaises(OSError) as cm:
                EngineInfoBootstrapServer("127.0.0.1", self.port)
            self.assertIn("not a kvcoordd", str(cm.exception))
        finally:
            httpd.shutdown()
            httpd.server_close()

    def test_close_unlink_removes_the_segment(self):
        server = EngineInfoBootstrapServer("127.0.0.1", self.port,
                                           daemon_args=["--fresh", "--max-rooms", "256"])
        path = "/dev/shm/" + server.segment_name
        self.assertTrue(os.path.exists(path))
        server.close(unlink=True)
        self.assertFalse(os.path.exists(path))
        server.close(unlink=True)  # idempotent: nothing left to remove

    def test_daemon_that_cannot_start(self):
        with self.assertRaises(OSError) as cm:
            EngineInfoBootstrapServer("127.0.0.1", self.port, daemon_args=["--no-such-option"])
        self.assertIn("kvcoordd exited", str(cm.exception))


class Book(unittest.TestCase):
    def setUp(self):
        self.name = new_name("book")
        self.seg = kvcoord.Segment(self.name, mode="fresh", role="client", **SMALL)
        self.r0 = KVStatusBook(self.seg, 0, participants=2)
        self.r1 = KVStatusBook(self.seg, 1, participants=2)

    def tearDown(self):
        self.seg.close()
        discard(self.name)

    def test_update_and_check_as_sglang(self):
        with self.assertRaises(KeyError):
            self.r0.check_status(10)
        self.r0.update_status(10, P.Failed)  # Failed on a room not followed: a no-op
        self.assertNotIn(10, self.r0)
        self.r0.update_status(10, P.WaitingForInput)  # first: taken as is
        self.assertIn(10, self.r0)
        self.assertEqual(self.r0.check_status(10), P.WaitingForInput)
        self.r0.update_status(10, P.Bootstrapping)  # lower: max keeps it
        self.assertEqual(self.r0.check_status(10), P.WaitingForInput)
        self.r0.update_status(10, P.Transferring)
        self.assertEqual(self.r0.check_status(10), P.Transferring)
        self.assertNotIn(10, self.r1)  # each rank follows its own rooms
        self.assertEqual(self.seg.room_get(10).local, (P.Transferring, None))
        self.r0.update_status(10, P.Failed)  # Failed replaces, a later Success raises it
        self.assertEqual(self.r0.check_status(10), P.Failed)
        self.r0.update_status(10, P.Success)
        self.assertEqual(self.r0.check_status(10), P.Success)
        self.r0.clear(10)
        self.assertNotIn(10, self.r0)
        with self.assertRaises(KeyError):
            self.r0.check_status(10)
        self.r0.clear(10)  # again: nothing
        self.r0.update_status(10, P.Failed)  # after clear: still a no-op
        self.assertNotIn(10, self.r0)

    def test_failure_shared_between_ranks(self):
        for b in (self.r0, self.r1):
            b.update_status(20, P.Transferring)
        self.r1.record_failure(20, "first", 110)
        self.r1.record_failure(20, REASON, 110)  # this rank's record: overwritten
        self.assertEqual(self.r0.check_status(20), P.Transferring)  # local, as sglang's
        with self.assertRaises(kvcoord.KVTransferError) as cm:
            self.r0.failure_exception(20)
        e = cm.exception
        self.assertEqual(str(e), "KVTransferError(bootstrap_room=20): first")  # the node's
        self.assertEqual((e.failure_reason, e.is_from_another_rank, e.origin_rank, e.code),
                         ("first", True, 1, 110))
        self.assertNotIn(20, self.r0)  # failure_exception clears, as sglang's
        with self.assertRaises(kvcoord.KVTransferError) as cm:  # popped: sglang's fallback
            self.r0.failure_exception(20)
        self.assertEqual(cm.exception.failure_reason, kvcoord.UNKNOWN_REASON)
        self.assertTrue(cm.exception.is_from_another_rank)
        with self.assertRaises(kvcoord.KVTransferError) as cm:
            self.r1.failure_exception(20)
        self.assertFalse(cm.exception.is_from_another_rank)
        self.assertEqual(cm.exception.failure_reason, REASON)  # its own, overwritten
        self.assertEqual(self.seg.rooms(), [])  # both cleared: released
        # a room nobody failed: the unknown reason, as sglang
        self.r0.update_status(21, P.Transferring)
        with self.assertRaises(kvcoord.KVTransferError) as cm:
            self.r0.failure_exception(21)
        self.assertEqual(cm.exception.failure_reason, kvcoord.UNKNOWN_REASON)

    @unittest.skipUnless(hasattr(kvcoord.Segment, "allreduce_min"), "no collective")
    def test_poll_and_all_reduce(self):
        class Poller:
            def __init__(self, room, state):
                self.bootstrap_room, self.state = room, state

            def poll(self):
                return self.state

        got = {}

        def rank(book, states):
            got[book.rank] = poll_and_all_reduce([Poller(30 + j, s) for j, s in
                                                  enumerate(states)], book)

        t = threading.Thread(target=rank, args=(self.r1, [P.Success, P.Success, P.Failed]))
        t.start()
        rank(self.r0, [P.Success, P.Transferring, P.Success])
        t.join()
        self.assertEqual(got, {0: [4, 3, 0], 1: [4, 3, 0]})  # min per room, on both
        self.assertTrue(all(type(x) is int for x in got[0]))


class BookAcrossProcesses(unittest.TestCase):
    """The reason rank 5 records is what every rank raises."""

    def test_eight_ranks(self):
        name = new_name("book8")
        with kvcoord.Segment(name, mode="fresh", role="none", **SMALL):
            pass
        room = 777

        def child(i, name):
            with kvcoord.Segment(name, rank=i) as seg:
                book = KVStatusBook(seg, i, participants=8)
                book.update_status(room, P.Transferring)
                if i == 5:
                    while seg.room_get(room, i).joined < 8:
                        pass
                    book.record_failure(room, REASON, 12)
                info = seg.room_get(room, i)
                while info.failure is None:
                    info = seg.room_wait(room, info.state, i, timeout=DEADLINE)
                try:
                    book.failure_exception(room)
                except kvcoord.KVTransferError as e:
                    out = [str(e), e.is_from_another_rank, e.origin_rank, e.code]
                return out

        try:
            reports = collect(fork_children(8, child, name))
            with kvcoord.Segment(name, role="none") as seg:
                left = seg.rooms()
        finally:
            discard(name)
        for i, rep in reports.items():
            self.assertNotIn("error", rep, rep.get("error"))
            self.assertEqual(rep["result"], ["KVTransferError(bootstrap_room=777): " + REASON,
                                             i != 5, 5, 12])
        self.assertEqual(left, [])  # failure_exception cleared it on every rank: released


if __name__ == "__main__":
    unittest.main()
