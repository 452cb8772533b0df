#!/usr/bin/python3
"""A FastAPI + uvicorn bootstrap server shaped like sglang's (typed query
parameters, `data: dict` bodies, HTTPException details): the same-run
baseline of the Python lookup benchmark and the reference the HTTP tests
compare kvcoordd's status codes with.  A few lines on Debian's
python3-fastapi and python3-uvicorn; not part of kvcoord.

Usage: fastapi_bootstrap.py --port P   (or serve(port) -> (server, thread))
"""
import argparse
import threading

from fastapi import FastAPI, HTTPException
from fastapi.responses import PlainTextResponse

DEFAULT_ROLE = "target"


def make_app():
    app = FastAPI()
    engines, configs, lock = {}, {}, threading.Lock()

    @app.get("/health")
    def health():
        return PlainTextResponse("OK")

    @app.put("/register_transfer_engine_info")
    def register_transfer_engine_info(data: dict):
        try:
            rank = data["rank"] if "rank" in data else data["tp_rank"]
            info = data["transfer_engine_info"]
            entry = (info["session_id"], info["weights_info_dict"])
        except Exception as e:
            raise HTTPException(status_code=400, detail=str(e))
        with lock:
            engines[(rank, data.get("role", DEFAULT_ROLE))] = entry
        return PlainTextResponse("OK")

    @app.get("/get_transfer_engine_info")
    def get_transfer_engine_info(rank: int, role: str = DEFAULT_ROLE):
        if rank < 0:
            raise HTTPException(status_code=400, detail="Invalid rank parameter")
        with lock:
            entry = engines.get((rank, role))
        if entry is None:
            raise HTTPException(status_code=404, detail=f"No transfer engine info for rank {rank}")
        return {"rank": rank, "remote_instance_transfer_engine_info": list(entry)}

    @app.put("/register_parallelism_config")
    def register_parallelism_config(data: dict):
        try:
            key = (data["tp_rank"], data.get("role", DEFAULT_ROLE))
            config = data["parallelism_config"]
        except Exception as e:
            raise HTTPException(status_code=400, detail=str(e))
        with lock:
            configs[key] = config
        return PlainTextResponse("OK")

    @app.get("/get_parallelism_config")
    def get_parallelism_config(rank: int, role: str = DEFAULT_ROLE):
        if rank < 0:
            raise HTTPException(status_code=400, detail="Invalid rank parameter")
        with lock:
            config = configs.get((rank, role))
        if config is None:
            raise HTTPException(status_code=404, detail=f"No parallelism config for rank {rank}")
        return config

    return app


def serve(port, host="127.0.0.1"):
    """Start the server on a daemon thread; returns (uvicorn.Server, thread)."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(make_app(), host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    return server, thread


def main():
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    a = ap.parse_args()
    uvicorn.run(make_app(), host=a.host, port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
