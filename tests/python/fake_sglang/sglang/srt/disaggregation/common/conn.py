"""sglang's common/conn.py shape: its KVTransferError and the common KV
manager's status/failure bookkeeping (request_status, failure_records under
failure_lock), with sglang's rules:

- update_status on a room not in request_status: Failed is ignored (a
  cleared room is not brought back), any other status is taken as is; on a
  known room Failed replaces the status and others raise it (max), so
  Bootstrapping -> Failed -> Success reads Success.
- check_status: request_status[room] (KeyError when unknown).
- record_failure: failure_records[room] = reason (the last one wins).
- clear (sender and receiver): pop the room's entries.
"""

import threading

from sglang.srt.disaggregation.base.conn import (
    BaseKVManager,
    BaseKVReceiver,
    BaseKVSender,
    KVPoll,
)


class KVTransferError(Exception):
    def __init__(self, bootstrap_room, failure_reason, is_from_another_rank=False):
        super().__init__(failure_reason)
        self.bootstrap_room = bootstrap_room
        self.failure_reason = failure_reason
        self.is_from_another_rank = is_from_another_rank

    def __str__(self):
        return "KVTransferError(bootstrap_room=%s): %s" % (self.bootstrap_room,
                                                           self.failure_reason)


class CommonKVManager(BaseKVManager):
    def __init__(self, engine_rank=0):
        self.engine_rank = engine_rank
        self.request_status = {}
        self.failure_records = {}
        self.failure_lock = threading.Lock()
        self.transfer_infos = {}
        self.required_prefill_response_num_table = {}
        self.prefill_response_tracker = {}

    def check_status(self, bootstrap_room):
        return self.request_status[bootstrap_room]

    def update_status(self, bootstrap_room, status):
        known = self.request_status.get(bootstrap_room)
        if known is None:
            if status == KVPoll.Failed:
                return  # never resurrect a room that was cleared (or never seen)
            self.request_status[bootstrap_room] = status
        elif status == KVPoll.Failed:
            self.request_status[bootstrap_room] = KVPoll.Failed
        else:
            self.request_status[bootstrap_room] = max(known, status)

    def record_failure(self, bootstrap_room, failure_reason):
        with self.failure_lock:
            self.failure_records[bootstrap_room] = failure_reason


class CommonKVSender(BaseKVSender):
    def __init__(self, mgr, bootstrap_addr, bootstrap_room):
        self.kv_mgr = mgr
        self.bootstrap_server_url = bootstrap_addr
        self.bootstrap_room = bootstrap_room
        self.conclude_state = None
        self.kv_mgr.update_status(bootstrap_room, KVPoll.Bootstrapping)

    def poll(self):
        return self.kv_mgr.check_status(self.bootstrap_room)

    def failure_exception(self):
        raise Exception("Fake KVSender Exception")  # sglang's base: overridden by backends

    def clear(self):
        self.kv_mgr.request_status.pop(self.bootstrap_room, None)
        self.kv_mgr.transfer_infos.pop(self.bootstrap_room, None)

    def abort(self):
        self.kv_mgr.record_failure(self.bootstrap_room, "Aborted by AbortReq.")
        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)
        self.conclude_state = KVPoll.Failed


class CommonKVReceiver(BaseKVReceiver):
    def __init__(self, mgr, bootstrap_addr, bootstrap_room=None):
        self.kv_mgr = mgr
        self.bootstrap_addr = bootstrap_addr
        self.bootstrap_room = bootstrap_room
        self.conclude_state = None
        self.require_staging = False
        self.kv_mgr.update_status(bootstrap_room, KVPoll.Bootstrapping)

    def poll(self):
        return self.kv_mgr.check_status(self.bootstrap_room)

    def failure_exception(self):
        raise Exception("Fake KVReceiver Exception")

    def clear(self):
        self.kv_mgr.request_status.pop(self.bootstrap_room, None)
        self.kv_mgr.required_prefill_response_num_table.pop(self.bootstrap_room, None)
        self.kv_mgr.prefill_response_tracker.pop(self.bootstrap_room, None)

    def abort(self):
        self.kv_mgr.record_failure(self.bootstrap_room, "Aborted by AbortReq.")
        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)
        self.conclude_state = KVPoll.Failed


class CommonKVBootstrapServer:
    """sglang's PD bootstrap server shape: constructed with (host, port) by
    the prefill's tokenizer manager, serves at once from a thread (run()),
    stopped by close().  Here the thread is the standard library's HTTP
    server answering every GET with "fixture", so a test can tell it from
    kvcoordd."""

    def __init__(self, host, port):
        self.host = host
        self.port = port
        self._httpd = None
        self.thread = threading.Thread(target=self._run_server, daemon=True)
        self._ready = threading.Event()
        self.run()
        self._ready.wait(10)

    def run(self):
        self.thread.start()

    def _run_server(self):
        import http.server

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Length", "7")
                self.end_headers()
                self.wfile.write(b"fixture")

            def log_message(self, *args):
                pass

        self._httpd = http.server.ThreadingHTTPServer((self.host, self.port), Handler)
        self._ready.set()
        self._httpd.serve_forever()

    def close(self):
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        self.thread.join(timeout=2)
