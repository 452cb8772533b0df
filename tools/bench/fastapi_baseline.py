#!/usr/bin/python3
"""fastapi_baseline.py - the baseline registration benchmarks compare kvcoordd with.

A few lines of FastAPI + uvicorn (Debian's python3-fastapi, python3-uvicorn;
uvloop and httptools when installed) serving the routes of sglang's
engine-info bootstrap server with their status codes and detail strings:

  GET  /health                          200 text/plain OK
  PUT  /register_transfer_engine_info   (POST too) 200 OK, 400 naming the field
  GET  /get_transfer_engine_info?rank=N 200 {"rank", "remote_instance_transfer_engine_info"},
                                        400 Missing/Invalid rank parameter, 404

Usage: tools/bench/fastapi_baseline.py --port P [--host 127.0.0.1]
Started and stopped by tools/bench/bench_register.sh; not part of kvcoord.
"""
import argparse
import json

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

app = FastAPI()
infos = {}  # rank -> [session_id, weights_info_dict]


def detail(status, text):
    return JSONResponse({"detail": text}, status_code=status)


@app.get("/health")
async def health():
    return PlainTextResponse("OK")


@app.api_route("/register_transfer_engine_info", methods=["PUT", "POST"])
async def register(request: Request):
    try:
        body = json.loads(await request.body())
    except ValueError as e:
        return detail(400, f"Invalid JSON: {e}")
    if not isinstance(body, dict):
        return detail(400, "Request body must be a JSON object")
    rank = body.get("rank", body.get("tp_rank"))
    if rank is None or isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        return detail(400, "Missing or invalid field 'rank' (or 'tp_rank')")
    info = body.get("transfer_engine_info")
    if not isinstance(info, dict):
        return detail(400, "Missing or invalid field 'transfer_engine_info'")
    sid, wid = info.get("session_id"), info.get("weights_info_dict")
    if not isinstance(sid, str) or not sid:
        return detail(400, "Missing or invalid field 'transfer_engine_info.session_id'")
    if not isinstance(wid, dict):
        return detail(400, "Missing or invalid field 'transfer_engine_info.weights_info_dict'")
    infos[rank] = [sid, wid]
    return PlainTextResponse("OK")


@app.get("/get_transfer_engine_info")
async def lookup(request: Request):
    value = request.query_params.get("rank")
    if value is None:
        return detail(400, "Missing rank parameter")
    try:
        rank = int(value)
    except ValueError:
        return detail(400, "Invalid rank parameter")
    if rank < 0:
        return detail(400, "Invalid rank parameter")
    if rank not in infos:
        return detail(404, f"No transfer engine info for rank {rank}")
    return JSONResponse({"rank": rank, "remote_instance_transfer_engine_info": infos[rank]})


def main():
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    a = ap.parse_args()
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
