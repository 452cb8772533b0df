"""kvcoord.sglang.install(pd_bootstrap=...): sglang's PD bootstrap server
(CommonKVBootstrapServer, here the fixture's) replaced by kvcoordd on the
same host:port; prefill workers register with sglang's PUT /route body from
their own processes, a decode worker looks them up with sglang's GET
/route, unchanged; a SIGKILLed prefill worker is withdrawn; uninstall()
gives sglang's own server back.  Off by default."""

import json
import os
import signal
import time
import unittest
import urllib.request

import kvcoord
from kvctest import DEADLINE, free_port, wait_for
import sgltest

TOPOLOGY = "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"


def get(port, path):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def prefill_worker(port, tp, w):
    """A prefill rank: PUT /route as sglang's CommonKVManager does, then stay."""
    body = {"attn_tp_size": 2, "attn_tp_rank": tp, "attn_cp_size": 1, "attn_cp_rank": 0,
            "attn_dp_size": 1, "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0,
            "system_dp_size": 1, "system_dp_rank": 0, "rank_ip": "10.3.0.%d" % tp,
            "rank_port": 19000 + tp, "page_size": 16, "kv_cache_dtype": "auto",
            "load_balance_method": "follow_bootstrap_room",
            "enable_dsa_cache_layer_split": False, "prefill_http_port": 30000}
    req = urllib.request.Request("http://127.0.0.1:%d/route" % port, method="PUT",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        os.write(w, b"%d" % r.status)
    time.sleep(600)


class PdBootstrap(unittest.TestCase):
    def test_off_by_default_then_kvcoordd(self):
        sgltest.use_fixture()
        from kvcoord import sglang as ks
        from sglang.srt.disaggregation.common import conn

        port = free_port()
        server = conn.CommonKVBootstrapServer("127.0.0.1", port)  # sglang's own (fixture)
        self.assertEqual(get(port, "/health"), (200, "fixture"))
        server.close()

        ks.install(None, 0, pd_bootstrap={"kvcoordd": os.environ["KVCOORD_DAEMON"]})
        kids = []
        try:
            port = free_port()
            server = conn.CommonKVBootstrapServer("127.0.0.1", port)
            self.assertEqual(get(port, "/health"), (200, "OK"))  # kvcoordd's
            self.assertEqual(get(port, TOPOLOGY)[0], 503)
            for tp in (1, 0):
                r, w = os.pipe()
                pid = os.fork()
                if pid == 0:
                    try:
                        prefill_worker(port, tp, w)
                    finally:
                        os._exit(1)
                kids.append(pid)
                self.assertEqual(os.read(r, 3), b"200")
            status, body = get(port, TOPOLOGY)
            self.assertEqual(status, 200)
            info = json.loads(body)
            self.assertEqual((info["attn_tp_size"], info["page_size"],
                              info["prefill_http_port"]), (2, 16, 30000))
            status, body = get(port, "/route?prefill_dp_rank=0&prefill_cp_rank=0"
                                     "&target_tp_rank=1&target_pp_rank=0")
            self.assertEqual((status, json.loads(body)),
                             (200, {"rank_ip": "10.3.0.1", "rank_port": 19001}))
            os.kill(kids[0], signal.SIGKILL)  # tp 1's process
            os.waitpid(kids[0], 0)
            wait_for(lambda: get(port, TOPOLOGY)[0] == 503, "tp 1's withdrawal")
            # sglang's text, then why an entry is withdrawn (the table's note)
            self.assertTrue(get(port, TOPOLOGY)[1].startswith(
                "Prefill server not fully registered yet (1 workers registered). 1 entry "
                "withdrawn: its process %d " % kids[0]), get(port, TOPOLOGY)[1])
            server.close()
        finally:
            for pid in kids[1:]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            ks.uninstall()
            try:
                kvcoord.unlink(kvcoord.name_for_port(port))
            except kvcoord.SegmentNotFoundError:
                pass
        port = free_port()
        server = conn.CommonKVBootstrapServer("127.0.0.1", port)  # sglang's own again
        self.assertEqual(get(port, "/health"), (200, "fixture"))
        server.close()

    def test_bad_option(self):
        sgltest.use_fixture()
        from kvcoord import sglang as ks

        with self.assertRaises(TypeError):
            ks.install(None, 0, pd_bootstrap="yes")
        with self.assertRaisesRegex(TypeError, "unknown option"):
            ks.install(None, 0, pd_bootstrap={"port": 1})
        self.assertFalse(ks.uninstall())  # nothing was installed


if __name__ == "__main__":
    unittest.main()
