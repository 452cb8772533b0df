# bench_lib.sh - what the HTTP benchmark scripts (bench_http.sh,
# bench_register.sh, bench_burst.sh) share; sourced, not run.  The script
# sets PY, TMP, SEGMENT, DAEMON_PID (kvcoordd) and BASELINE_PID (nginx or
# the FastAPI server) before starting them, and FLOOR_PID if it starts a
# third server (bench_register.sh's do-nothing nginx); sourcing installs the
# traps: on exit those processes are stopped and waited for, the segment and
# TMP removed, and the script's exit status kept.

cleanup() {
    local rc=$?
    set +e
    if [[ -n ${FLOOR_PID:-} ]]; then kill "$FLOOR_PID" 2>/dev/null; wait "$FLOOR_PID" 2>/dev/null; fi
    if [[ -n $BASELINE_PID ]]; then kill "$BASELINE_PID" 2>/dev/null; wait "$BASELINE_PID" 2>/dev/null; fi
    if [[ -n $DAEMON_PID ]]; then kill "$DAEMON_PID" 2>/dev/null; wait "$DAEMON_PID" 2>/dev/null; fi
    rm -f "/dev/shm/$SEGMENT"
    rm -rf "$TMP"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A TCP port free on 127.0.0.1 now (the kernel's choice).
free_port() {
    $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Wait up to ~15 s for URL to answer 2xx; status 1 if it never does.
wait_http() { # URL
    local i
    for ((i = 0; i < 300; i++)); do
        curl -fsS -o /dev/null --max-time 1 "$1" 2>/dev/null && return 0
        sleep 0.05
    done
    return 1
}

# Start nginx ($NGINX, one worker, its files in $TMP/nginx) listening on
# 127.0.0.1:PORT, with HTTP_LINES added to its http {} block, SERVER_LINES
# to its server {} block and MAIN_LINES (optional) to the top level; sets
# NGINX_PID.  The caller waits for it to answer (wait_http) and shows
# nginx_log when it does not.
nginx_start() { # PORT HTTP_LINES SERVER_LINES [MAIN_LINES]
    local d=$TMP/nginx
    mkdir -p "$d"
    cat >"$d/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $d/nginx.pid;
error_log $d/error.log warn;
${4:-}
events { worker_connections 4096; }
http {
    access_log off;
$2
    client_body_temp_path $d/body;
    proxy_temp_path $d/proxy;
    fastcgi_temp_path $d/fastcgi;
    uwsgi_temp_path $d/uwsgi;
    scgi_temp_path $d/scgi;
    server {
        listen 127.0.0.1:$1;
$3
    }
}
CONF
    "$NGINX" -p "$d" -c "$d/nginx.conf" -e "$d/error.log" >"$d/stdout.log" 2>&1 &
    NGINX_PID=$!
}

# The end of nginx's error log and output, for a message.
nginx_log() { cat "$TMP/nginx/error.log" "$TMP/nginx/stdout.log" 2>/dev/null | tail -20; }
