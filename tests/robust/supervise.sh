#!/bin/sh
# supervise.sh PIDFILE STOPFILE DAEMON [ARGS...]: a minimal supervisor for
# test_restart.py, run by systemd-socket-activate, which holds the listening
# socket at descriptor 3 (LISTEN_FDS=1) as systemd's .socket unit would.
# Starts DAEMON again each time it ends, until STOPFILE exists, handing the
# same socket to each run: LISTEN_PID is set to the daemon's own pid (the
# inner shell's, which exec keeps).  PIDFILE always holds the running
# daemon's pid.
pidfile=$1 stop=$2
shift 2
while [ ! -e "$stop" ]; do
    sh -c 'LISTEN_PID=$$; export LISTEN_PID; echo $$ >"$0.tmp"; mv "$0.tmp" "$0"; exec "$@"' \
        "$pidfile" "$@"
done
