/*
 * log.c - one line per event on stderr; see log.h.
 */
#include "log.h"
#include "utf8.h"

#include <stdarg.h>
#include <stdint.h>
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

size_t log_escape(char *dst, size_t cap, const char *src, size_t n, int quote)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)src;
    size_t o = 0;
#define PUT(ch)                  \
    do {                         \
        if (o < cap)             \
            dst[o] = (char)(ch); \
        o++;                     \
    } while (0)
    if (quote)
        PUT('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        size_t u;
        if (c == '"' || c == '\\') {
            PUT('\\');
            PUT(c);
        } else if (c == '\n') {
            PUT('\\');
            PUT('n');
        } else if (c == '\r') {
            PUT('\\');
            PUT('r');
        } else if (c == '\t') {
            PUT('\\');
            PUT('t');
        } else if (c >= 0x20 && c < 0x7f) {
            PUT(c);
        } else if (c >= 0x80 && (u = kvc__utf8_seq(s + i, n - i)) > 0) {
            for (size_t k = 0; k < u; k++)
                PUT(s[i + k]);
            i += u - 1;
        } else { /* other control bytes, DEL, invalid UTF-8 */
            PUT('\\');
            PUT('x');
            PUT(hex[c >> 4]);
            PUT(hex[c & 15]);
        }
    }
    if (quote)
        PUT('"');
#undef PUT
    return o;
}

/* Does an unquoted value need quotes to stay one value (space, '=', a quote,
 * anything escaped, or empty)? */
static int needs_quotes(const char *s, size_t n)
{
    if (n == 0)
        return 1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c == '=' || c == '"' || c == '\\' || c >= 0x7f)
            return 1;
    }
    return 0;
}

/* The line being built: bytes past cap are counted, not written. */
struct line {
    char *buf;
    size_t cap, n;
};

static void line_put(struct line *l, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++, l->n++)
        if (l->n < l->cap)
            l->buf[l->n] = s[i];
}

/* A string value: escaped; quoted unless the format quotes it already
 * (key="%s") - then the format's quotes enclose the escaped text. */
static void put_string(struct line *l, const char *s, size_t n, int in_quotes)
{
    int quote = !in_quotes && needs_quotes(s, n);
    size_t room = l->n < l->cap ? l->cap - l->n : 0;
    size_t w = log_escape(l->buf + (l->cap > l->n ? l->n : l->cap), room, s, n, quote);
    l->n += w;
}

/* printf for log fields: every %s / %.*s argument goes through log_escape();
 * numbers, characters and pointers are formatted as printf does. */
static void format_fields(struct line *l, const char *fmt, va_list ap)
{
    for (const char *f = fmt; *f; f++) {
        if (*f != '%') {
            char c = (unsigned char)*f < 0x20 ? ' ' : *f;
            line_put(l, &c, 1);
            continue;
        }
        int in_quotes = f > fmt && f[-1] == '"';
        char spec[32];
        size_t k = 0;
        spec[k++] = '%';
        f++;
        while (*f && strchr("-+ #0", *f) && k < 8)
            spec[k++] = *f++;
        if (*f == '*') {
            k += (size_t)snprintf(spec + k, sizeof spec - k, "%d", va_arg(ap, int));
            f++;
        } else {
            while (*f >= '0' && *f <= '9' && k < 16)
                spec[k++] = *f++;
        }
        int prec = -1;
        if (*f == '.') {
            f++;
            if (*f == '*') {
                prec = va_arg(ap, int);
                f++;
            } else {
                prec = 0;
                while (*f >= '0' && *f <= '9')
                    prec = prec * 10 + (*f++ - '0');
            }
            if (prec >= 0)
                k += (size_t)snprintf(spec + k, sizeof spec - k, ".%d", prec);
        }
        char len[3] = "";
        size_t ln = 0;
        while (*f && strchr("hlzjtL", *f) && ln < 2)
            len[ln++] = *f++;
        len[ln] = '\0';
        if (!*f)
            break;
        char conv = *f;
        if (conv == '%') {
            line_put(l, "%", 1);
            continue;
        }
        if (conv == 's') {
            const char *s = va_arg(ap, const char *);
            if (!s)
                s = "(null)";
            size_t n = prec >= 0 ? strnlen(s, (size_t)prec) : strlen(s);
            put_string(l, s, n, in_quotes);
            continue;
        }
        memcpy(spec + k, len, ln);
        k += ln;
        spec[k++] = conv;
        spec[k] = '\0';
        char num[64];
        int m;
        if (strchr("di", conv)) {
            if (!strcmp(len, "ll"))
                m = snprintf(num, sizeof num, spec, va_arg(ap, long long));
            else if (!strcmp(len, "l") || !strcmp(len, "z") || !strcmp(len, "t"))
                m = snprintf(num, sizeof num, spec, va_arg(ap, long));
            else if (!strcmp(len, "j"))
                m = snprintf(num, sizeof num, spec, va_arg(ap, intmax_t));
            else
                m = snprintf(num, sizeof num, spec, va_arg(ap, int));
        } else if (strchr("uxXo", conv)) {
            if (!strcmp(len, "ll"))
                m = snprintf(num, sizeof num, spec, va_arg(ap, unsigned long long));
            else if (!strcmp(len, "l") || !strcmp(len, "z") || !strcmp(len, "t"))
                m = snprintf(num, sizeof num, spec, va_arg(ap, unsigned long));
            else if (!strcmp(len, "j"))
                m = snprintf(num, sizeof num, spec, va_arg(ap, uintmax_t));
            else
                m = snprintf(num, sizeof num, spec, va_arg(ap, unsigned));
        } else if (strchr("fFeEgGaA", conv)) {
            m = !strcmp(len, "L") ? snprintf(num, sizeof num, spec, va_arg(ap, long double))
                                  : snprintf(num, sizeof num, spec, va_arg(ap, double));
        } else if (conv == 'c') {
            char c = (char)va_arg(ap, int);
            put_string(l, &c, 1, in_quotes);
            continue;
        } else if (conv == 'p') {
            m = snprintf(num, sizeof num, "%p", va_arg(ap, void *));
        } else { /* unknown conversion: written as is, no argument taken */
            line_put(l, spec, k);
            continue;
        }
        if (m > 0)
            line_put(l, num, (size_t)m < sizeof num ? (size_t)m : sizeof num - 1);
    }
}

size_t log_format(char *dst, size_t cap, const char *fmt, ...)
{
    struct line l = {dst, cap, 0};
    va_list ap;
    va_start(ap, fmt);
    format_fields(&l, fmt, ap);
    va_end(ap);
    return l.n;
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
        struct line l = {line + n, cap - n, 0};
        va_list ap;
        va_start(ap, fmt);
        format_fields(&l, fmt, ap);
        va_end(ap);
        n += l.n;
    }
    if (n > cap)
        n = cap; /* truncated */
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, n);
    (void)w; /* nowhere left to report a failed log write */
}
