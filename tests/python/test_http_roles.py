"""kvcoordd's routes for newer sglang workers, over HTTP with `requests` and
from Python: PUT /register_parallelism_config and GET /get_parallelism_config,
`role` on the transfer-engine routes keyed by (rank, role), a trailing slash
answered 307 as sglang's FastAPI server does; then the status codes of
kvcoordd and of a FastAPI server shaped like sglang's (fastapi_bootstrap.py)
for the same requests, where docs/http-api.md says they differ.
"""

import json
import os
import time
import unittest

import requests

import kvcoord
from kvctest import DEADLINE, Daemon, free_port, new_name

CFG = {"tp_size": 8, "tp_rank": 2, "pp_size": 1, "pp_rank": 0, "ep_size": 1, "ep_rank": 0,
       "moe_tp_size": 8, "moe_tp_rank": 2, "attn_tp_size": 8, "attn_tp_rank": 2,
       "attn_dp_size": 1, "attn_dp_rank": 0, "world_size": 8, "global_rank": 2, "local_rank": 2}


def engine_body(rank, sid, wid, role=None, key="tp_rank"):
    body = {key: rank, "transfer_engine_info": {"session_id": sid, "weights_info_dict": wid}}
    if role is not None:
        body["role"] = role
    return body


class Routes(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon(new_name("http"))
        cls.url = cls.daemon.url

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def get(self, path, **params):
        return requests.get(self.url + path, params=params, timeout=DEADLINE)

    def test_parallelism_config(self):
        r = requests.put(self.url + "/register_parallelism_config",
                         json={"tp_rank": 2, "parallelism_config": CFG}, timeout=DEADLINE)
        self.assertEqual((r.status_code, r.text), (200, "OK"))
        r = self.get("/get_parallelism_config", rank=2)
        self.assertEqual(r.status_code, 200)
        self.assertEqual(r.json(), CFG)
        self.assertEqual(r.headers["X-Kvcoord-Generation"], "1")
        self.assertEqual(self.get("/get_parallelism_config", rank=2, role="target").json(), CFG)
        r = self.get("/get_parallelism_config", rank=3)
        self.assertEqual((r.status_code, r.json()), (404, {"detail":
                                                           "No parallelism config for rank 3"}))
        # "rank" works too, and POST
        r = requests.post(self.url + "/register_parallelism_config",
                          json={"rank": 4, "parallelism_config": {"tp_size": 1}}, timeout=DEADLINE)
        self.assertEqual(r.status_code, 200)
        self.assertEqual(self.get("/get_parallelism_config", rank=4).json(), {"tp_size": 1})
        # visible from Python, and what Python stores is served
        with kvcoord.Segment(self.daemon.segment) as seg:
            self.assertEqual(seg.parallelism_config(2), CFG)
            seg.parallelism_register(5, {"tp_size": 8, "tp_rank": 5}, "draft")
        self.assertEqual(self.get("/get_parallelism_config", rank=5, role="draft").json(),
                         {"tp_size": 8, "tp_rank": 5})
        r = self.get("/get_parallelism_config", rank=5)
        self.assertEqual(r.status_code, 404)

    def test_parallelism_errors(self):
        put = lambda body, **kw: requests.put(self.url + "/register_parallelism_config",
                                              data=body, timeout=DEADLINE, **kw)
        cases = [
            (b'{"parallelism_config": {}}', "Missing field 'rank' (or 'tp_rank')"),
            (b'{"tp_rank": 1}', "Missing field 'parallelism_config'"),
            (b'{"tp_rank": 1, "parallelism_config": [1]}',
             "Invalid field 'parallelism_config': must be an object"),
            (b'{"tp_rank": -1, "parallelism_config": {}}',
             "Invalid field 'tp_rank': must be a non-negative integer"),
            (b'{"tp_rank": 1, "parallelism_config": {}, "role": "a b"}',
             "Invalid field 'role': must be a role name: at most 31 bytes of [A-Za-z0-9._-]"),
            (b'[1]', "Request body must be a JSON object"),
        ]
        for body, detail in cases:
            r = put(body)
            self.assertEqual((r.status_code, r.json()["detail"]), (400, detail), body)
        r = put(b'{"tp_rank": 1,')
        self.assertEqual(r.status_code, 400)
        self.assertTrue(r.json()["detail"].startswith("Invalid JSON at line 1"))
        for params, detail in (({}, "Missing rank parameter"), ({"rank": "x"},
                                                                 "Invalid rank parameter"),
                               ({"rank": -1}, "Invalid rank parameter"),
                               ({"rank": 1, "role": "bad role"}, "Invalid role parameter")):
            r = self.get("/get_parallelism_config", **params)
            self.assertEqual((r.status_code, r.json()["detail"]), (400, detail), params)
        r = requests.delete(self.url + "/get_parallelism_config", timeout=DEADLINE)
        self.assertEqual((r.status_code, r.headers["Allow"]), (405, "GET, HEAD"))

    def test_role_keyed_engine_info(self):
        put = lambda body: requests.put(self.url + "/register_transfer_engine_info", json=body,
                                        timeout=DEADLINE)
        self.assertEqual(put(engine_body(0, "target-session", {"target.weight": [1, 4, 2]}))
                         .status_code, 200)
        self.assertEqual(put(engine_body(0, "draft-session", {"draft.weight": [1, 4, 2]},
                                         role="draft")).status_code, 200)
        info = lambda **p: self.get("/get_transfer_engine_info", rank=0, **p).json()[
            "remote_instance_transfer_engine_info"]
        self.assertEqual(info(), ["target-session", {"target.weight": [1, 4, 2]}])
        self.assertEqual(info(role="target"), ["target-session", {"target.weight": [1, 4, 2]}])
        self.assertEqual(info(role="draft"), ["draft-session", {"draft.weight": [1, 4, 2]}])
        # ?role= on the registration when the body has none
        r = requests.put(self.url + "/register_transfer_engine_info", params={"role": "eagle"},
                         json=engine_body(1, "eagle-session", {"e": [1, 1, 2]}), timeout=DEADLINE)
        self.assertEqual(r.status_code, 200)
        self.assertEqual(self.get("/get_transfer_engine_info", rank=1, role="eagle").json()
                         ["remote_instance_transfer_engine_info"][0], "eagle-session")
        r = self.get("/get_transfer_engine_info", rank=1)
        self.assertEqual((r.status_code, r.json()["detail"]),
                         (404, "No transfer engine info for rank 1"))
        r = self.get("/get_transfer_engine_info", rank=0, role="nosuch")
        self.assertEqual((r.status_code, r.json()["detail"]),
                         (404, "No transfer engine info for rank 0 (role nosuch)"))
        r = self.get("/get_transfer_engine_info", rank=0, role="x" * 40)
        self.assertEqual((r.status_code, r.json()["detail"]), (400, "Invalid role parameter"))
        # from Python: the same entries
        with kvcoord.Segment(self.daemon.segment) as seg:
            self.assertEqual(seg.role_lookup(0, "draft").session_id, "draft-session")
            self.assertEqual(seg.lookup(0).session_id, "target-session")
            self.assertIn("draft", seg.roles())
        # DELETE with a role withdraws that role's entry only
        r = requests.delete(self.url + "/transfer_engine_info", params={"rank": 0, "role": "draft"},
                            timeout=DEADLINE)
        self.assertEqual(r.status_code, 200)
        r = self.get("/get_transfer_engine_info", rank=0, role="draft")
        self.assertEqual(r.status_code, 404)
        self.assertEqual(r.json()["detail"], "No transfer engine info for rank 0 (role draft) "
                         "(withdrawn over HTTP (DELETE /transfer_engine_info))")
        self.assertEqual(info(), ["target-session", {"target.weight": [1, 4, 2]}])

    def test_trailing_slash_redirects(self):
        requests.put(self.url + "/register_transfer_engine_info",
                     json=engine_body(7, "h:7", {"w": [1, 2, 2]}), timeout=DEADLINE)
        r = requests.get(self.url + "/get_transfer_engine_info/", params={"rank": 7},
                         allow_redirects=False, timeout=DEADLINE)
        self.assertEqual(r.status_code, 307)
        self.assertEqual(r.headers["Location"], "/get_transfer_engine_info?rank=7")
        self.assertEqual(r.content, b"")
        r = requests.get(self.url + "/get_transfer_engine_info/", params={"rank": 7},
                         timeout=DEADLINE)  # followed
        self.assertEqual(r.status_code, 200)
        self.assertEqual(r.json()["remote_instance_transfer_engine_info"][0], "h:7")
        self.assertEqual([h.status_code for h in r.history], [307])
        # a PUT is repeated with its body
        r = requests.put(self.url + "/register_parallelism_config/",
                         json={"tp_rank": 7, "parallelism_config": {"tp_size": 2}},
                         timeout=DEADLINE)
        self.assertEqual((r.status_code, [h.status_code for h in r.history]), (200, [307]))
        self.assertEqual(self.get("/get_parallelism_config", rank=7).json(), {"tp_size": 2})
        self.assertEqual(requests.get(self.url + "/health/", timeout=DEADLINE).text, "OK")
        # every trailing slash goes, in one redirect (Starlette strips them all)
        r = requests.get(self.url + "/get_transfer_engine_info//", params={"rank": 7},
                         timeout=DEADLINE)
        self.assertEqual((r.status_code, [h.headers["Location"] for h in r.history]),
                         (200, ["/get_transfer_engine_info?rank=7"]))
        for path in ("/no_such_route/", "/health/x/", "//"):
            r = requests.get(self.url + path, allow_redirects=False, timeout=DEADLINE)
            self.assertEqual((r.status_code, r.json()), (404, {"detail": "Not Found"}), path)


class RoleSlots(unittest.TestCase):
    def test_a_fifth_role_gets_507_naming_the_remedy(self):
        daemon = Daemon(new_name("roles"))
        try:
            put = lambda role: requests.put(daemon.url + "/register_transfer_engine_info",
                                            json=engine_body(0, "s-" + role, {"w": [1, 1, 1]},
                                                             role=role), timeout=DEADLINE)
            for role in ("a", "b", "c"):
                self.assertEqual(put(role).status_code, 200)
                r = requests.delete(daemon.url + "/transfer_engine_info",
                                    params={"rank": 0, "role": role}, timeout=DEADLINE)
                self.assertEqual(r.status_code, 200)
            # Every entry of a, b and c withdrawn: their names still hold the slots.
            r = put("d")
            self.assertEqual(r.status_code, 507)
            detail = r.json()["detail"]
            self.assertIn("role 'd' cannot be added", detail)
            self.assertIn("register under one of those, or start kvcoordd with --fresh", detail)
        finally:
            daemon.stop()


class StatusCodesAgainstFastAPI(unittest.TestCase):
    """Every request here is sent to kvcoordd and to a FastAPI server shaped like
    sglang's; the table is what docs/http-api.md states, both columns checked."""

    # (method, path, params, body, content type) -> (kvcoordd, FastAPI)
    CASES = [
        ("GET", "/get_transfer_engine_info", {}, None, None, 400, 422),       # missing rank
        ("GET", "/get_transfer_engine_info", {"rank": "x"}, None, None, 400, 422),
        ("GET", "/get_transfer_engine_info", {"rank": "-1"}, None, None, 400, 400),
        ("GET", "/get_transfer_engine_info", {"rank": "9"}, None, None, 404, 404),
        ("GET", "/get_parallelism_config", {}, None, None, 400, 422),
        ("GET", "/get_parallelism_config", {"rank": "1.5"}, None, None, 400, 422),
        ("GET", "/get_parallelism_config", {"rank": "9"}, None, None, 404, 404),
        ("PUT", "/register_transfer_engine_info", {}, b"[1, 2]", "application/json", 400, 422),
        ("PUT", "/register_transfer_engine_info", {}, b'{"tp_rank": ', "application/json",
         400, 422),
        ("PUT", "/register_transfer_engine_info", {}, b'{"tp_rank": 1}', "application/json",
         400, 400),                                                           # missing field
        ("PUT", "/register_parallelism_config", {}, b'"text"', "application/json", 400, 422),
        ("PUT", "/register_parallelism_config", {}, b'{"tp_rank": 1}', "application/json",
         400, 400),
        ("PUT", "/register_parallelism_config", {},
         b'{"tp_rank": 1, "parallelism_config": {}}', "text/plain", 200, 422),  # content type
        ("PUT", "/register_transfer_engine_info", {},
         json.dumps(engine_body(1, "h:1", {})).encode(), "text/plain", 200, 422),
        ("GET", "/get_transfer_engine_info/", {"rank": "9"}, None, None, 307, 307),
        ("GET", "/get_transfer_engine_info//", {"rank": "9"}, None, None, 307, 307),
        ("GET", "/health//", {}, None, None, 307, 307),
        ("GET", "/no_such_route/", {}, None, None, 404, 404),
        ("GET", "/health/x/", {}, None, None, 404, 404),
        ("GET", "/health", {}, None, None, 200, 200),
    ]

    @classmethod
    def setUpClass(cls):
        try:
            import fastapi_bootstrap
        except ImportError as e:
            raise unittest.SkipTest("python3-fastapi / python3-uvicorn not installed: %s" % e)
        cls.daemon = Daemon(new_name("http422"))
        port = free_port()
        cls.server, cls.thread = fastapi_bootstrap.serve(port)
        cls.fastapi = "http://127.0.0.1:%d" % port
        end = time.monotonic() + DEADLINE
        while True:
            try:
                requests.get(cls.fastapi + "/health", timeout=1)
                break
            except requests.ConnectionError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.05)

    @classmethod
    def tearDownClass(cls):
        cls.server.should_exit = True
        cls.thread.join(DEADLINE)
        cls.daemon.stop()

    def send(self, base, method, path, params, body, ctype):
        headers = {"Content-Type": ctype} if ctype else {}
        return requests.request(method, base + path, params=params, data=body, headers=headers,
                                allow_redirects=False, timeout=DEADLINE)

    def test_table(self):
        for method, path, params, body, ctype, ours, theirs in self.CASES:
            with self.subTest(method=method, path=path, params=params, body=body, ctype=ctype):
                a = self.send(self.daemon.url, method, path, params, body, ctype)
                b = self.send(self.fastapi, method, path, params, body, ctype)
                self.assertEqual((a.status_code, b.status_code), (ours, theirs))
                if ours == theirs and ours in (400, 404) and ("rank" in params or ours == 404):
                    self.assertEqual(a.json(), b.json())  # same detail string


if __name__ == "__main__":
    unittest.main()
