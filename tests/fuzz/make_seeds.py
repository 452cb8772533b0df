#!/usr/bin/python3
"""make_seeds.py - (re)write the seed corpora of the HTTP and registration
fuzz targets: tests/fuzz/http/seed-* and tests/fuzz/register/seed-*.

The seeds are real requests as sglang and the README's clients send them:
registrations shaped like sglang's (tools/gen_model_info.py's weights dicts),
lookups with and without wait_ms, chunked bodies, 100-continue, pipelined
keep-alive, HTTP/1.0, and malformed inputs (conflicting framing headers,
unsupported transfer codings, oversized heads and bodies, raw bytes, TLS and HTTP/2 prefaces).
Crash regressions (crash-*) found later sit next to them and are never
touched by this script.  The transfer-frame seeds come from
gen_xfer_seeds.c (built as fuzz_gen_xfer_seeds), from the real encoders.

    /usr/bin/python3 tests/fuzz/make_seeds.py
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def weights(n, base=0x7F3A00000000, layers=2):
    d = {}
    for i in range(n):
        layer, w = divmod(i, 4)
        name = ["self_attn.qkv_proj.weight", "self_attn.o_proj.weight",
                "mlp.gate_up_proj.weight", "mlp.down_proj.weight"][w]
        d[f"model.layers.{layer % layers}.{name}"] = [base + i * 0x200000, 4096 * 1024, 2]
    d["model.embed_tokens.weight"] = [base - 0x10000000, 128256 * 4096 // 8, 2]
    return d


def reg_body(rank=0, key="rank", sid="10.0.0.1:16051", wid=None, extra=None):
    body = {key: rank, "transfer_engine_info": {
        "session_id": sid, "weights_info_dict": weights(8) if wid is None else wid}}
    if extra:
        body.update(extra)
    return json.dumps(body).encode()


def put(body, path="/register_transfer_engine_info", method="PUT", extra_headers=""):
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:6789\r\n"
            f"User-Agent: python-requests/2.28.1\r\nAccept-Encoding: gzip, deflate\r\n"
            f"Accept: */*\r\nConnection: keep-alive\r\nContent-Type: application/json\r\n"
            f"{extra_headers}Content-Length: {len(body)}\r\n\r\n").encode() + body


def chunked(body, path="/register_transfer_engine_info", sizes=(7, 64, 1000)):
    out = (f"PUT {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
           "Content-Type: application/json\r\n\r\n").encode()
    i = k = 0
    while i < len(body):
        n = sizes[k % len(sizes)]
        part = body[i:i + n]
        out += b"%x\r\n" % len(part) + part + b"\r\n"
        i += n
        k += 1
    return out + b"0\r\n\r\n"


def get(target, version="1.1", headers="Host: 127.0.0.1:6789\r\n"):
    return f"GET {target} HTTP/{version}\r\n{headers}\r\n".encode()


def http_seeds():
    b0 = reg_body(0)
    s = {
        "health": get("/health"),
        "health-curl": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1:6789\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\n\r\n",
        "head-health": b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n",
        "register-sglang": put(b0),
        "register-post-tp-rank": put(reg_body(3, key="tp_rank"), method="POST"),
        "register-rank-wins": put(reg_body(0, extra={"tp_rank": 7})),
        "register-ipv6": put(reg_body(2, sid="[2001:db8::1]:16051")),
        "register-expect-continue": put(reg_body(4), extra_headers="Expect: 100-continue\r\n"),
        "register-role-draft": put(reg_body(0, key="tp_rank", extra={"role": "draft"})),
        "register-role-query": put(reg_body(1), path="/register_transfer_engine_info?role=eagle"),
        "register-role-bad": put(reg_body(1, extra={"role": "a b"})),
        "lookup-role": get("/get_transfer_engine_info?rank=0&role=draft"),
        "delete-role": b"DELETE /transfer_engine_info?rank=0&role=draft HTTP/1.1\r\nHost: x\r\n\r\n",
        "parallelism-register": put(json.dumps({"tp_rank": 2, "parallelism_config": {
            "tp_size": 8, "tp_rank": 2, "pp_size": 1, "pp_rank": 0, "world_size": 8,
            "global_rank": 2, "local_rank": 2}}).encode(), path="/register_parallelism_config"),
        "parallelism-register-role": put(json.dumps({"rank": 0, "role": "draft",
                                                     "parallelism_config": {"tp_size": 1}}
                                                    ).encode(),
                                         path="/register_parallelism_config", method="POST"),
        "parallelism-register-bad": put(b'{"tp_rank": 1, "parallelism_config": [1]}',
                                        path="/register_parallelism_config"),
        "parallelism-get": get("/get_parallelism_config?rank=2"),
        "parallelism-get-role": get("/get_parallelism_config?rank=0&role=draft"),
        "trailing-slash": get("/get_transfer_engine_info/?rank=0"),
        "trailing-slash-put": put(reg_body(5), path="/register_parallelism_config/"),
        "register-chunked": chunked(reg_body(5)),
        "register-chunked-ext": b"PUT /register_transfer_engine_info HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                                b"5;ext=1\r\n{\"ran\r\n0\r\nTrailer: x\r\n\r\n",
        "register-bad-json": put(b'{"rank": 0, "transfer_engine_info": {"session_id": "a", '),
        "register-missing-sid": put(b'{"rank":1,"transfer_engine_info":{"weights_info_dict":{}}}'),
        "register-wid-list": put(b'{"rank":1,"transfer_engine_info":{"session_id":"h:1","weights_info_dict":[]}}'),
        "register-negative": put(b'{"rank":-1,"transfer_engine_info":{"session_id":"h:1","weights_info_dict":{}}}'),
        "register-huge-rank": put(b'{"rank":99999999999,"transfer_engine_info":{"session_id":"h:1","weights_info_dict":{}}}'),
        "register-escapes": put('{"rank":6,"transfer_engine_info":{"session_id":"h\\"\\\\\\u0001\u00e9:1",'
                                '"weights_info_dict":{"k\\n":[1,2,3]}}}'.encode()),
        "lookup": get("/get_transfer_engine_info?rank=0"),
        "lookup-missing": get("/get_transfer_engine_info?rank=9"),
        "lookup-wait": get("/get_transfer_engine_info?rank=9&wait_ms=5000"),
        "lookup-bad": get("/get_transfer_engine_info?rank=-1"),
        "lookup-noparam": get("/get_transfer_engine_info"),
        "lookup-pct": get("/get_transfer_engine_info?%72ank=%31&x=%zz"),
        "lookup-pct-path": get("/get%5ftransfer_engine_info?rank=1"),
        "lookup-http10": get("/get_transfer_engine_info?rank=1", version="1.0", headers=""),
        "lookup-http10-keepalive": get("/health", version="1.0", headers="Connection: keep-alive\r\n"),
        "ranks": get("/ranks"),
        "delete": b"DELETE /transfer_engine_info?rank=6 HTTP/1.1\r\nHost: x\r\n\r\n",
        "method-not-allowed": b"POST /health HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        "not-found": get("/nope"),
        "pipelined": get("/health") + put(reg_body(8)) + get("/get_transfer_engine_info?rank=8")
                     + get("/get_transfer_engine_info?rank=10&wait_ms=1") + get("/ranks")
                     + b"DELETE /transfer_engine_info?rank=8 HTTP/1.1\r\n\r\n"
                     + get("/health", headers="Connection: close\r\n"),
        "cl-and-te": b"PUT /register_transfer_engine_info HTTP/1.1\r\nContent-Length: 3\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "dup-cl": b"PUT /register_transfer_engine_info HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        "dup-te": b"PUT /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "te-gzip": b"PUT /x HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        "expect-other": b"PUT /x HTTP/1.1\r\nExpect: 200-ok\r\nContent-Length: 2\r\n\r\n{}",
        "space-before-colon": b"GET /health HTTP/1.1\r\nHost : x\r\n\r\n",
        "http2-preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        "http09": b"GET /health\r\n",
        "raw-bytes": bytes(range(256)),
        "tls-hello": bytes.fromhex("160301020001000200030365") + b"\x00" * 40,
        "long-head": b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n",
        "big-header": b"GET /health HTTP/1.1\r\nX-Big: " + b"b" * 17000 + b"\r\n\r\n",
        "big-body": b"PUT /register_transfer_engine_info HTTP/1.1\r\nContent-Length: 70000\r\n\r\n{",
        "bare-lf": b"GET /health HTTP/1.1\nHost: x\n\n",
        "absolute-uri": get("http://127.0.0.1:6789/get_transfer_engine_info?rank=0"),
        "options-star": b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
        # RFC 9112: Host required in 1.1, obs-fold refused; %2F is data in a segment
        "no-host": b"GET /health HTTP/1.1\r\n\r\n",
        "obs-fold": b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n 2\r\n\r\n",
        "pct-slash-room": get("/rooms/5%2Ffailure"),
        # rooms, failures, metrics
        "room-get": get("/rooms/9001"),
        "room-get-rank": get("/rooms/9001?rank=1"),
        "room-get-bad-id": get("/rooms/-1"),
        "room-get-huge-id": get("/rooms/9223372036854775808"),
        "room-failure": put(b'{"rank":1,"reason":"RDMA WC error 12","code":12}',
                            path="/rooms/9001/failure"),
        "room-failure-post": put(b'{"rank":0,"reason":"timeout"}', path="/rooms/7/failure",
                                 method="POST"),
        "room-failure-bad-rank": put(b'{"rank":-1,"reason":"x"}', path="/rooms/7/failure"),
        "room-failure-no-reason": put(b'{"rank":1,"code":5}', path="/rooms/7/failure"),
        "room-failure-bad-code": put(b'{"rank":1,"reason":"x","code":4294967296}',
                                     path="/rooms/7/failure"),
        "room-failure-nul": put(b'{"rank":1,"reason":"a\\u0000b"}', path="/rooms/7/failure"),
        "room-failure-not-json": put(b'rank=1&reason=x', path="/rooms/7/failure"),
        "room-failure-get": get("/rooms/7/failure"),
        "failures": get("/failures"),
        "failures-limit": get("/failures?limit=5&rank=1"),
        "failures-limit-bad": get("/failures?limit=-3"),
        "failures-limit-huge": get("/failures?limit=99999999999999999999999"),
        "metrics": get("/metrics"),
        "metrics-head": b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        "metrics-prometheus": get("/metrics", headers="Host: node:6789\r\nUser-Agent: "
                                  "Prometheus/2.42.0\r\nAccept: text/plain;version=0.0.4;q=1,"
                                  "*/*;q=0.1\r\nX-Prometheus-Scrape-Timeout-Seconds: 10\r\n"),
        # Authorization (the harness runs without a token: parsed, kept, wiped)
        "auth-bearer": put(b0, extra_headers="Authorization: Bearer tok-123.A_b\r\n"),
        "auth-bearer-lower": put(b0, extra_headers="authorization: bearer tok-123.A_b  \r\n"),
        "auth-basic": put(b0, extra_headers="Authorization: Basic dXNlcjpwYXNz\r\n"),
        "auth-dup": put(b0, extra_headers="Authorization: Bearer a\r\nAuthorization: Bearer b\r\n"),
        "auth-long": put(b0, extra_headers="Authorization: Bearer " + "t" * 1200 + "\r\n"),
        "auth-empty": put(b0, extra_headers="Authorization:\r\n"),
        "auth-delete": b"DELETE /transfer_engine_info?rank=0 HTTP/1.1\r\nHost: x\r\n"
                       b"Authorization: Bearer tok\r\n\r\n",
        "auth-pipelined": (put(b0, extra_headers="Authorization: Bearer one\r\n")
                           + put(b0, path="/rooms/1/failure") + get("/metrics")),
    }
    return s


def register_seeds():
    s = {
        "sglang": reg_body(0),
        "tp-rank": reg_body(1, key="tp_rank"),
        "rank-wins": reg_body(0, extra={"tp_rank": 7}),
        "ipv6": reg_body(2, sid="[2001:db8::1]:16051"),
        "ipv6-bare": reg_body(2, sid="2001:db8::1:16051"),
        "empty-dict": reg_body(3, wid={}),
        "nested": reg_body(4, wid={"a": {"b": [1, 2.5, None, True, "x"]}, "é": [-1, 0, 1e300]}),
        "big-ints": reg_body(5, wid={"w": [2**63 - 1, -2**63, 0]}),
        "dup-keys": b'{"rank":6,"rank":7,"transfer_engine_info":{"session_id":"a:1","weights_info_dict":{"x":1,"x":2}}}',
        "not-object": b'[1,2,3]',
        "scalar": b'42',
        "string": b'"rank"',
        "empty": b'',
        "truncated": reg_body(0)[:-5],
        "missing-rank": b'{"transfer_engine_info":{"session_id":"a:1","weights_info_dict":{}}}',
        "rank-float": b'{"rank":1.0,"transfer_engine_info":{"session_id":"a:1","weights_info_dict":{}}}',
        "rank-string": b'{"rank":"1","transfer_engine_info":{"session_id":"a:1","weights_info_dict":{}}}',
        "rank-max": b'{"rank":4294967295,"transfer_engine_info":{"session_id":"a:1","weights_info_dict":{}}}',
        "sid-empty": b'{"rank":1,"transfer_engine_info":{"session_id":"","weights_info_dict":{}}}',
        "sid-long": reg_body(1, sid="h" * 256),
        "sid-nul": b'{"rank":1,"transfer_engine_info":{"session_id":"a\\u0000b","weights_info_dict":{}}}',
        "sid-number": b'{"rank":1,"transfer_engine_info":{"session_id":1,"weights_info_dict":{}}}',
        "wid-null": b'{"rank":1,"transfer_engine_info":{"session_id":"a:1","weights_info_dict":null}}',
        "tei-list": b'{"rank":1,"transfer_engine_info":[]}',
        "bad-utf8": b'{"rank":1,"transfer_engine_info":{"session_id":"\xff\xfe","weights_info_dict":{}}}',
        "surrogate": b'{"rank":1,"transfer_engine_info":{"session_id":"\\ud800","weights_info_dict":{}}}',
        "deep": b'{"a":' * 300 + b'1' + b'}' * 300,
        "deep-array": b'[' * 3000 + b']' * 3000,
        "extra-fields": reg_body(9, extra={"unknown": {"x": 1}, "generation": 3}),
        "trailing-garbage": reg_body(10) + b' xyz',
        "weights-many": reg_body(11, wid=weights(200, layers=50)),
    }
    return s


def write(dirname, seeds):
    d = os.path.join(HERE, dirname)
    os.makedirs(d, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(d, "seed-" + name), "wb") as f:
            f.write(data)
    print(f"{d}: {len(seeds)} seeds")


if __name__ == "__main__":
    write("http", http_seeds())
    write("register", register_seeds())
