/*
 * auth.c - bearer-token check for kvcoordd's mutating routes; see auth.h.
 */
#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

/* Trim one trailing "\n" or "\r\n" from s[0..*len). */
static void trim_newline(const char *s, size_t *len)
{
    if (*len && s[*len - 1] == '\n') {
        (*len)--;
        if (*len && s[*len - 1] == '\r')
            (*len)--;
    }
}

/* A token may hold only visible ASCII: anything else could not arrive intact
 * in a header (spaces and tabs would be taken as separators or trimmed).
 * The message starts with prefix. */
static int token_bytes_ok(const char *s, size_t len, char *err, size_t errcap, const char *prefix)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x21 || c > 0x7e) {
            snprintf(err, errcap,
                     "%sbyte %zu of the token is 0x%02x (only visible ASCII "
                     "0x21..0x7e is accepted; one trailing newline is trimmed)",
                     prefix, i, c);
            return -1;
        }
    }
    return 0;
}

/* Store token[0..len) zero-padded into a (len <= AUTH_TOKEN_MAX). */
static void set_token(struct auth *a, const char *token, size_t len)
{
    memset(a->token, 0, sizeof a->token);
    memcpy(a->token, token, len);
    a->token_len = len;
}

/* Read and validate the token file at path into buf; *len receives the
 * token's length.  Returns 0 or -1 with the reason in err, without the
 * path (the caller names the file: a long path must not crowd out the
 * reason).  O_NONBLOCK: a FIFO (or a device) put in the file's place must
 * not block the caller (the event loop, on SIGHUP) until a writer comes; it
 * is refused as not a regular file. */
static int read_token_file(const char *path, char *buf, size_t *len, char *err, size_t errcap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        snprintf(err, errcap, "open: %s", strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st)) {
        snprintf(err, errcap, "fstat: %s", strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errcap, "not a regular file");
        close(fd);
        return -1;
    }
    if (st.st_mode & 0007) {
        snprintf(err, errcap,
                 "mode %04o gives access to others; refusing it (chmod o-rwx on the file)",
                 (unsigned)(st.st_mode & 07777));
        close(fd);
        return -1;
    }
    /* Room for the longest token, "\r\n", and one byte more to see it is too long. */
    size_t cap = AUTH_TOKEN_MAX + 3, n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            snprintf(err, errcap, "read: %s", strerror(errno));
            close(fd);
            return -1;
        }
        if (r == 0 || (n += (size_t)r) == cap)
            break;
    }
    close(fd);
    trim_newline(buf, &n);
    if (n > AUTH_TOKEN_MAX) {
        snprintf(err, errcap, "token longer than %d bytes", AUTH_TOKEN_MAX);
        return -1;
    }
    if (token_bytes_ok(buf, n, err, errcap, ""))
        return -1;
    *len = n;
    return 0;
}

int auth_init(struct auth *a, const char *token_file, const char *env_value, char *err,
              size_t errcap)
{
    memset(a, 0, sizeof *a);
    if (token_file) {
        if (strlen(token_file) >= sizeof a->path) {
            snprintf(err, errcap, "auth token file name too long");
            return -1;
        }
        char buf[AUTH_TOKEN_MAX + 3];
        size_t len;
        if (read_token_file(token_file, buf, &len, err, errcap))
            return -1;
        snprintf(a->path, sizeof a->path, "%s", token_file);
        set_token(a, buf, len);
        memset(buf, 0, sizeof buf);
        a->source = AUTH_SRC_FILE;
        return 0;
    }
    if (env_value) {
        size_t len = strlen(env_value);
        trim_newline(env_value, &len);
        if (len > AUTH_TOKEN_MAX) {
            snprintf(err, errcap, AUTH_ENV ": token longer than %d bytes", AUTH_TOKEN_MAX);
            return -1;
        }
        if (token_bytes_ok(env_value, len, err, errcap, AUTH_ENV ": "))
            return -1;
        set_token(a, env_value, len);
        a->source = AUTH_SRC_ENV;
        return 0;
    }
    a->source = AUTH_SRC_NONE;
    return 0;
}

int auth_reload(struct auth *a, char *err, size_t errcap)
{
    if (a->source != AUTH_SRC_FILE)
        return 0;
    char buf[AUTH_TOKEN_MAX + 3];
    size_t len;
    if (read_token_file(a->path, buf, &len, err, errcap))
        return -1; /* the previous token stays in force */
    set_token(a, buf, len);
    memset(buf, 0, sizeof buf);
    a->reloads++;
    return 1;
}

int auth_enabled(const struct auth *a) { return a->source != AUTH_SRC_NONE; }

/* Compare given[0..glen) with the configured token over AUTH_TOKEN_MAX
 * bytes, whatever either length: no early exit, the length difference
 * folded into the same accumulator.  Returns 1 when equal. */
static int token_equal(const struct auth *a, const char *given, size_t glen)
{
    unsigned char pad[AUTH_TOKEN_MAX];
    memset(pad, 0, sizeof pad);
    memcpy(pad, given, glen); /* glen <= AUTH_TOKEN_MAX: checked by the caller */
    volatile uint64_t acc = (uint64_t)(glen ^ a->token_len);
    for (size_t i = 0; i < AUTH_TOKEN_MAX; i++)
        acc |= (uint64_t)(pad[i] ^ a->token[i]);
    return acc == 0;
}

enum auth_result auth_check_n(const struct auth *a, const char *value, size_t len)
{
    if (a->source == AUTH_SRC_NONE)
        return AUTH_ALLOW;
    if (a->token_len == 0)
        return AUTH_DENY_EMPTY_CONFIG; /* fail closed */
    if (!value)
        return AUTH_DENY_MISSING;
    size_t i = 0;
    while (i < len && (value[i] == ' ' || value[i] == '\t'))
        i++;
    /* auth-scheme (RFC 9110 11.1: case-insensitive) then 1*SP */
    static const char scheme[] = "bearer";
    size_t sl = sizeof scheme - 1;
    if (len - i <= sl || strncasecmp(value + i, scheme, sl) != 0 || value[i + sl] != ' ')
        return AUTH_DENY_SCHEME;
    i += sl;
    while (i < len && value[i] == ' ')
        i++;
    size_t end = len;
    while (end > i && (value[end - 1] == ' ' || value[end - 1] == '\t'))
        end--;
    size_t glen = end - i;
    if (glen == 0)
        return AUTH_DENY_SCHEME;
    /* Longer than any configured token can be: depends on the client's own
     * input and a public constant only, so answering early leaks nothing. */
    if (glen > AUTH_TOKEN_MAX)
        return AUTH_DENY_TOKEN;
    return token_equal(a, value + i, glen) ? AUTH_ALLOW : AUTH_DENY_TOKEN;
}

enum auth_result auth_check(const struct auth *a, const char *value)
{
    return auth_check_n(a, value, value ? strlen(value) : 0);
}

const char *auth_result_name(enum auth_result r)
{
    switch (r) {
    case AUTH_ALLOW: return "allow";
    case AUTH_DENY_MISSING: return "missing";
    case AUTH_DENY_SCHEME: return "scheme";
    case AUTH_DENY_TOKEN: return "token";
    case AUTH_DENY_EMPTY_CONFIG: return "empty_config";
    }
    return "unknown";
}

const char *auth_source_name(enum auth_source s)
{
    switch (s) {
    case AUTH_SRC_NONE: return "none";
    case AUTH_SRC_FILE: return "file";
    case AUTH_SRC_ENV: return "env";
    }
    return "unknown";
}

void auth_clear(struct auth *a)
{
    volatile unsigned char *p = a->token;
    for (size_t i = 0; i < sizeof a->token; i++)
        p[i] = 0;
    a->token_len = 0;
    a->source = AUTH_SRC_NONE;
}
