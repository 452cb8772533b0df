/*
 * notify.h - systemd readiness notification (sd_notify's protocol, without
 * libsystemd): one datagram of "KEY=VALUE\n" lines sent to the AF_UNIX
 * socket named by $NOTIFY_SOCKET (a path, or "@name" for the abstract
 * namespace).  Without $NOTIFY_SOCKET every call does nothing, so kvcoordd
 * behaves the same outside systemd.
 *
 * kvcoordd sends READY=1 once its listening socket is bound and the segment
 * is open (the unit is Type=notify: `systemctl start` returns only then),
 * RELOADING=1 then READY=1 around a SIGHUP token reload, and STOPPING=1
 * when it begins to shut down.  No logging here.
 */
#ifndef KVC_NOTIFY_H
#define KVC_NOTIFY_H

#include <stddef.h>

/* Send state (e.g. "READY=1\nSTATUS=listening on 127.0.0.1:6789") to
 * $NOTIFY_SOCKET.  Returns 1 when sent, 0 when $NOTIFY_SOCKET is unset or
 * empty, -1 on error (errno set; err, if not NULL, gets a message). */
int notify_send(const char *state, char *err, size_t errcap);

/* READY=1 with STATUS=<status> (status may be NULL). */
int notify_ready(const char *status);

/* RELOADING=1 with MONOTONIC_USEC=<now> (as systemd 253's Type=notify-reload
 * wants; older systemd ignores the field). */
int notify_reloading(void);

/* STOPPING=1. */
int notify_stopping(void);

#endif /* KVC_NOTIFY_H */
