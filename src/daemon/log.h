/*
 * log.h - kvcoordd's event log: one line per event on stderr.
 *
 *   2025-01-31T12:00:00.123Z info listening addr=127.0.0.1:6789 segment=kvcoord-6789
 *
 * Each line is ISO-8601 UTC time, level, event name, then key=value fields
 * (free text values are written quoted by the caller: err="...").  A line is
 * written with one write(2), so lines from threads never interleave.
 *
 * Every string value (each %s / %.*s / %c argument) goes through one
 * escaping function, log_escape(): '"' and '\\' are backslash-escaped, \n \r
 * \t written as such, other control bytes, DEL and bytes that are not valid
 * UTF-8 as \xNN; valid UTF-8 passes.  A value the format does not quote is
 * quoted when it would not stay one token (empty, or holding a space, '=',
 * a quote or an escape).  So a value can never end its field, add a field
 * or a line (a session_id of  x" level=error evil="1  stays one value), and
 * an event is always one line.  Only the daemon logs; the library never
 * prints.
 */
#ifndef KVC_LOG_H
#define KVC_LOG_H

#include <stddef.h>

enum log_level { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3 };

/* Parse "debug", "info", "warn" (or "warning"), "error".  Returns 0 and sets
 * *out, or -1 for anything else. */
int log_parse_level(const char *s, enum log_level *out);

/* Lines below level are dropped (default LOG_INFO). */
void log_set_level(enum log_level level);

/* Non-zero when a line of this level would be written (to skip formatting
 * work on hot paths). */
int log_enabled(enum log_level level);

/* Escape n bytes of src as described above into dst (cap bytes, not
 * NUL-terminated), inside quotes when quote is set.  Returns the length of
 * the escaped text, which may exceed cap (then only cap bytes are written). */
size_t log_escape(char *dst, size_t cap, const char *src, size_t n, int quote);

/* Format fields as log_event() does (string arguments escaped) into dst
 * (cap bytes, not NUL-terminated); returns the full length.  For tests. */
size_t log_format(char *dst, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Write one line: time, level, event, then fields formatted by fmt (may be
 * NULL for none), string arguments escaped. */
void log_event(enum log_level level, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* KVC_LOG_H */
