#!/usr/bin/python3
"""Registration rules docs/http-api.md states, over HTTP against a real
kvcoordd:

- an identical registration through a kvcoordd restarted on the segment
  (SIGKILL, start again without --fresh) keeps the rank's generation
  (X-Kvcoord-Generation stays 1); different info bumps it;
- "rank": -0 is rank 0 (as Python's json and sglang's FastAPI server read
  it), in a body and as ?rank=-0; negatives are refused;
- "role": null is refused with the role's 400 (sglang's server would key
  it under None, never found by a default lookup);
- ?wait_ms= on a role that can never exist (every role of the segment
  taken by others) answers 404 at once, naming why, instead of waiting.

Usage: test_http_register_edges.py [--daemon PATH] [unittest args]
"""

import argparse
import json
import os
import sys
import time
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

    def test_minus_zero_is_rank_zero(self):
        r = self.put(body(0, raw_rank="-0"))
        self.assertEqual((r.status_code, r.text), (200, "OK"))
        for q in ("0", "-0"):
            r = self.get(rank=q)
            self.assertEqual(r.status_code, 200, r.text)
            self.assertEqual(r.json()["rank"], 0)
        r = self.put(body(1, raw_rank="-1"))
        self.assertEqual(r.status_code, 400)
        self.assertEqual(r.json(), {"detail": "Invalid field 'rank': must be a non-negative "
                                              "integer"})
        self.assertEqual(self.get(rank="-1").status_code, 400)

    def test_null_role_refused(self):
        r = self.put(body(3).replace('{"rank"', '{"role": null, "rank"', 1))
        self.assertEqual(r.status_code, 400)
        self.assertEqual(r.json()["detail"], "Invalid field 'role': must be a role name: at most "
                                             "31 bytes of [A-Za-z0-9._-]")
        self.assertEqual(self.get(rank=3).status_code, 404)

    def test_wait_on_a_role_that_cannot_exist_answers_at_once(self):
        for role in ("draft", "r2", "r3"):  # with the default role: all 4 taken
            self.assertEqual(self.put(body(1, role=role)).status_code, 200)
        t0 = time.monotonic()
        r = self.get(rank=1, role="other", wait_ms=20000)
        waited = time.monotonic() - t0
        self.assertEqual(r.status_code, 404, r.text)
        self.assertEqual(r.json()["detail"],
                         "No transfer engine info for rank 1 (role other: the segment keeps 4 "
                         "roles, all taken (target, draft, r2, r3), so no registration can "
                         "use it)")
        # Not the full wait (20 s): answered before it, however loaded the machine.
        self.assertLess(waited, 20.0)
        # A taken role still waits for its rank; without wait_ms the same 404.
        r = self.get(rank=1, role="other")
        self.assertEqual(r.status_code, 404)
        self.assertIn("so no registration can use it", r.json()["detail"])
        r = self.get(rank=2, role="draft", wait_ms=1)
        self.assertEqual(r.json()["detail"], "No transfer engine info for rank 2 (role draft)")


def main():
    global EXE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--daemon", default=os.environ.get("KVCOORD_DAEMON"))
    args, rest = ap.parse_known_args()
    EXE = args.daemon and os.path.abspath(args.daemon)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
