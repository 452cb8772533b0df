/*
 * log.c - one line per event on stderr; see log.h.
 */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static enum log_level min_level = LOG_INFO;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

int log_parse_level(const char *s, enum log_level *out)
{
    for (int i = LOG_DEBUG; i <= LOG_ERROR; i++) {
        if (!strcmp(s, level_names[i])) {
            *out = (enum log_level)i;
            return 0;
        }
    }
    if (!strcmp(s, "warning")) {
        *out = LOG_WARN;
        return 0;
    }
    return -1;
}

void log_set_level(enum log_level level) { min_level = level; }

int log_enabled(enum log_level level) { return level >= min_level; }

static size_t format_time(char *dst, size_t cap)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(dst, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    int m = snprintf(dst + n, cap - n, ".%03ldZ ", ts.tv_nsec / 1000000);
    return n + (m > 0 ? (size_t)m : 0);
}

void log_event(enum log_level level, const char *event, const char *fmt, ...)
{
    if (!log_enabled(level))
        return;
    char line[2048];
    size_t cap = sizeof line - 1; /* room for the newline */
    size_t n = format_time(line, cap);
    int m = snprintf(line + n, cap - n, "%s %s", level_names[level], event);
    n += m > 0 ? (size_t)m : 0;
    if (fmt && n < cap - 1) {
        line[n++] = ' ';
        va_list ap;
        va_start(ap, fmt);
        m = vsnprintf(line + n, cap - n, fmt, ap);
        va_end(ap);
        n += m > 0 ? (size_t)m : 0;
    }
    if (n > cap)
        n = cap; /* truncated */
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)line[i] < 0x20)
            line[i] = ' ';
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, n);
    (void)w; /* nowhere left to report a failed log write */
}
