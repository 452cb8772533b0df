#!/usr/bin/python3
"""Registration bodies that could overwrite a live worker's rank unseen.

- A field kvcoordd reads occurs once: {"rank":9,"rank":0,...} is refused
  (400 "Duplicate field 'rank'"), and so is a repeated transfer_engine_info,
  session_id or weights_info_dict, role or parallelism_config; nothing is
  stored (before: the last "rank" counted and replaced rank 0).  "rank"
  beside "tp_rank" stays valid (rank wins, sglang's rule); keys repeated
  inside weights_info_dict are the client's data, stored as sent.
- An HTTP registration that replaces a rank whose registrant (a worker,
  through the library) is alive is logged at warn, naming the rank, the
  process and both session ids; none for a rank nobody holds, nor for one
  registered over HTTP before.

Usage: test_http_register_rules.py --daemon PATH --worker PATH
"""

import argparse
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import test_http_raw as raw  # noqa: E402
from test_http_raw import Conn, Daemon, detail  # noqa: E402
from kvctest import Worker, wait_log  # noqa: E402  (the tests' one helper module)

WID = '{"w":[4096,1024,2]}'


def body(*members):
    return ("{" + ",".join(members) + "}").encode()


def tei(sid="10.0.0.9:1", wid=WID):
    return '"transfer_engine_info":{"session_id":"%s","weights_info_dict":%s}' % (sid, wid)


class RegisterRules(unittest.TestCase):
    def setUp(self):
        self.d = Daemon()
        try:
            self.worker = Worker(ARGS.worker, self.d.segment)
        except BaseException:
            self.d.stop()
            raise
        self.c = Conn(self.d.port)

    def tearDown(self):
        self.c.close()
        self.worker.stop()
        self.d.stop()

    def put(self, data):
        return self.c.request("PUT", "/register_transfer_engine_info", data)

    def rank0_session(self):
        status, _, b = self.c.request("GET", "/get_transfer_engine_info?rank=0")
        self.assertEqual(status, 200, b)
        return json.loads(b)["remote_instance_transfer_engine_info"][0]

    def test_duplicate_fields_refused(self):
        cases = [
            (body('"rank":9', '"rank":0', tei()), "rank", 2),
            (body('"tp_rank":0', '"tp_rank":0', tei()), "tp_rank", 2),
            (body('"rank":0', tei(), tei("10.0.0.8:1")), "transfer_engine_info", 2),
            (body('"rank":0', '"transfer_engine_info":{"session_id":"a:1","session_id":"b:1",'
                  '"session_id":"c:1","weights_info_dict":{}}'),
             "transfer_engine_info.session_id", 3),
            (body('"rank":0', '"transfer_engine_info":{"session_id":"a:1",'
                  '"weights_info_dict":{},"weights_info_dict":{}}'),
             "transfer_engine_info.weights_info_dict", 2),
            (body('"rank":0', '"role":"draft"', '"role":"target"', tei()), "role", 2),
            (body('"r\\u0061nk":9', '"rank":0', tei()), "rank", 2),  # an escaped key too
        ]
        for data, field, times in cases:
            with self.subTest(field=field, body=data):
                status, _, b = self.put(data)
                self.assertEqual(status, 400, b)
                self.assertEqual(detail(b), "Duplicate field '%s': it occurs %d times; send "
                                            "each field once" % (field, times))
        self.assertEqual(self.rank0_session(), "127.0.0.1:17000")  # nothing stored
        status, _, b = self.c.request(
            "PUT", "/register_parallelism_config",
            body('"rank":3', '"parallelism_config":{}', '"parallelism_config":{"tp":2}'))
        self.assertEqual(status, 400, b)
        self.assertIn("Duplicate field 'parallelism_config'", detail(b))
        self.assertNotIn("http_register_replaces_live", self.d.output())

    def test_allowed_repeats(self):
        # rank beside tp_rank: rank wins (sglang's server); keys repeated in
        # weights_info_dict are stored as sent
        status, _, b = self.put(body('"tp_rank":4', '"rank":5',
                                     tei(wid='{"w":[1,2,3],"w":[4,5,6]}')))
        self.assertEqual(status, 200, b)
        status, _, b = self.c.request("GET", "/get_transfer_engine_info?rank=5")
        self.assertEqual(status, 200, b)
        self.assertIn(b'{"w":[1,2,3],"w":[4,5,6]}', b)

    def test_replacing_a_live_workers_rank_is_logged(self):
        status, _, b = self.put(body('"rank":7', tei("10.0.0.7:1")))  # nobody held rank 7
        self.assertEqual(status, 200, b)
        status, _, b = self.put(body('"rank":7', tei("10.0.0.77:1")))  # an HTTP one did
        self.assertEqual(status, 200, b)
        self.assertNotIn("http_register_replaces_live", self.d.output())
        status, _, b = self.put(body('"rank":0', tei("10.0.0.9:1")))
        self.assertEqual(status, 200, b)
        self.assertEqual(self.rank0_session(), "10.0.0.9:1")
        lines = [l for l in self.d.output().splitlines() if "http_register_replaces_live" in l]
        self.assertEqual(len(lines), 1, self.d.output())
        self.assertIn(" warn http_register_replaces_live rank=0 role=target pid=%d "
                      'session_id_was="127.0.0.1:17000" session_id="10.0.0.9:1"'
                      % self.worker.pid, lines[0])
        self.assertNotIn("rank_replaced", self.d.output())  # said once, by the HTTP route

    def test_a_library_replacement_of_a_live_workers_rank_is_logged(self):
        # A second worker registers rank 0 through the library while the
        # first one runs: the daemon's rank watch names both.
        w2 = Worker(ARGS.worker, self.d.segment, session_id="127.0.0.1:17001")
        try:
            wait_log(self.d.log.name, r"rank_replaced", "the rank watch's line")
            lines = [l for l in self.d.output().splitlines() if "rank_replaced" in l]
            self.assertEqual(len(lines), 1, lines)
            self.assertIn(" warn rank_replaced rank=0 ", lines[0])
            self.assertIn(" pid=%d pid_was=%d " % (w2.pid, self.worker.pid), lines[0])
            self.assertIn("is not restored", lines[0])
            self.assertEqual(self.rank0_session(), "127.0.0.1:17001")
        finally:
            w2.stop()

def main():
    global ARGS
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", default=os.path.join(here, "..", "..", "build", "kvcoordd"))
    ap.add_argument("--worker", default=os.path.join(here, "..", "..", "build", "kvcoord-worker"))
    ARGS, rest = ap.parse_known_args()
    raw.ARGS = ARGS
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
