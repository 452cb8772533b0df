#!/usr/bin/python3
"""Registration rules docs/http-api.md states, over HTTP against a real
kvcoordd:

- an identical registration through a kvcoordd restarted on the segment
  (SIGKILL, start again without --fresh) keeps the rank's generation
  (X-Kvcoord-Generation stays 1); different info bumps it.

Usage: test_http_register_edges.py [--daemon PATH] [unittest args]
"""

import argparse
import json
import os
import sys
import unittest

import requests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvctest import Daemon, new_name  # noqa: E402  (the tests' one helper module)

TIMEOUT = 30
EXE = None


def body(rank, sid="10.0.0.5:16008", role=None, raw_rank=None):
    doc = {"rank": rank, "transfer_engine_info": {"session_id": sid,
                                                  "weights_info_dict": {"w": [1, 2, 2]}}}
    if role is not None:
        doc["role"] = role
    text = json.dumps(doc)
    if raw_rank is not None:
        text = text.replace('"rank": %d' % rank, '"rank": %s' % raw_rank, 1)
    return text


class Rules(unittest.TestCase):
    def setUp(self):
        self.d = Daemon(new_name("regrules"), exe=EXE)

    def tearDown(self):
        self.d.stop()

    def put(self, text):
        return requests.put(self.d.url + "/register_transfer_engine_info", data=text,
                            timeout=TIMEOUT)

    def get(self, **params):
        return requests.get(self.d.url + "/get_transfer_engine_info", params=params,
                            timeout=TIMEOUT)

    def generation(self, rank):
        r = self.get(rank=rank)
        self.assertEqual(r.status_code, 200, r.text)
        return int(r.headers["X-Kvcoord-Generation"])

    def test_identical_after_restart_keeps_generation(self):
        self.assertEqual(self.put(body(8)).status_code, 200)
        self.assertEqual(self.generation(8), 1)
        self.d.sigkill()
        self.d.start(fresh=False)
        self.assertEqual(self.generation(8), 1)
        r = self.put(body(8))
        self.assertEqual((r.status_code, r.text), (200, "OK"))
        self.assertEqual(self.generation(8), 1)  # was 2: read as a new registrant
        self.assertEqual(self.put(body(8, sid="10.0.0.5:16009")).status_code, 200)
        self.assertEqual(self.generation(8), 2)


def main():
    global EXE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--daemon", default=os.environ.get("KVCOORD_DAEMON"))
    args, rest = ap.parse_known_args()
    EXE = args.daemon and os.path.abspath(args.daemon)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
