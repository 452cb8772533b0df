/*
 * log.h - kvcoordd's event log: one line per event on stderr.
 *
 *   2025-01-31T12:00:00.123Z info listening addr=127.0.0.1:6789 segment=kvcoord-6789
 *
 * Each line is ISO-8601 UTC time, level, event name, then key=value fields
 * (free text values are written quoted by the caller: err="...").  A line is
 * written with one write(2), so lines from threads never interleave; control
 * characters inside a line are replaced by spaces, so an event is always one
 * line.  Only the daemon logs; the library never prints.
 */
#ifndef KVC_LOG_H
#define KVC_LOG_H

enum log_level { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3 };

/* Parse "debug", "info", "warn" (or "warning"), "error".  Returns 0 and sets
 * *out, or -1 for anything else. */
int log_parse_level(const char *s, enum log_level *out);

/* Lines below level are dropped (default LOG_INFO). */
void log_set_level(enum log_level level);

/* Non-zero when a line of this level would be written (to skip formatting
 * work on hot paths). */
int log_enabled(enum log_level level);

/* Write one line: time, level, event, then fields formatted by fmt (may be
 * NULL for none). */
void log_event(enum log_level level, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* KVC_LOG_H */
