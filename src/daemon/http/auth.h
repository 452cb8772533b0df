/*
 * auth.h - kvcoordd's bearer-token check for mutating routes.
 *
 * Where the token comes from (decided once, at auth_init()):
 *   1. --auth-token-file FILE: the file's contents, less one trailing
 *      newline ("\n" or "\r\n").  The file wins over the environment: an
 *      operator who names a file means that file.
 *   2. else the environment variable KVCOORD_AUTH_TOKEN, verbatim (one
 *      trailing newline trimmed too).
 *   3. neither: auth is OFF and every request is allowed (the default,
 *      for loopback-only deployments; the daemon logs a warning when it
 *      listens on a non-loopback address without a token).
 *
 * A configured but EMPTY token (an empty file, or KVCOORD_AUTH_TOKEN set to
 * "") fails closed: auth is on and every mutating request is denied.
 *
 * The token file must be a regular file that is neither readable nor
 * writable by "other" (mode & 0007 == 0): a world-readable token is refused
 * with an error (the daemon exits 1 at start; a reload keeps the old token),
 * as ssh refuses a world-readable key.  Group access is allowed (a service
 * group may share it).  Tokens longer than AUTH_TOKEN_MAX bytes, or holding
 * bytes outside printable ASCII 0x21..0x7e (a space or control character
 * could never arrive intact in an HTTP header) are refused the same way.
 *
 * auth_check() parses an Authorization header value: the scheme "Bearer"
 * matched case-insensitively, one or more spaces, the token, optional
 * trailing spaces/tabs.  The comparison runs over AUTH_TOKEN_MAX bytes
 * whatever the lengths of the two tokens, with no early exit (the length
 * difference is folded into the result), so its time says nothing about
 * the configured token.
 *
 * Threads: auth_check() and auth_reload() must not run at the same time on
 * one struct auth; kvcoordd calls both from its event loop thread (SIGHUP
 * arrives on the loop's signalfd, and the check runs at dispatch, before a
 * large registration is handed to the helper thread).
 * No logging here: functions return codes and a message in err.
 */
#ifndef KVC_AUTH_H
#define KVC_AUTH_H

#include <stddef.h>

/* Longest token accepted, in bytes. */
#define AUTH_TOKEN_MAX 1024

/* Environment variable read when no token file is given. */
#define AUTH_ENV "KVCOORD_AUTH_TOKEN"

enum auth_source {
    AUTH_SRC_NONE = 0, /* no token configured: auth off */
    AUTH_SRC_FILE = 1, /* --auth-token-file */
    AUTH_SRC_ENV = 2   /* KVCOORD_AUTH_TOKEN */
};

/* auth_check() outcome.  AUTH_ALLOW is 0; every other value denies (the
 * daemon answers 401 {"detail":"Unauthorized"} with WWW-Authenticate:
 * Bearer).  The reason is for debug logs only, never for the client. */
enum auth_result {
    AUTH_ALLOW = 0,
    AUTH_DENY_MISSING = 1,     /* no Authorization header */
    AUTH_DENY_SCHEME = 2,      /* not "Bearer <token>" (Basic, malformed, ...) */
    AUTH_DENY_TOKEN = 3,       /* wrong token */
    AUTH_DENY_EMPTY_CONFIG = 4 /* the configured token is empty: fail closed */
};

struct auth {
    enum auth_source source;
    char path[4096];                     /* token file (AUTH_SRC_FILE) */
    unsigned char token[AUTH_TOKEN_MAX]; /* zero-padded to AUTH_TOKEN_MAX */
    size_t token_len;                    /* 0: empty configured token */
    unsigned long reloads;               /* successful auth_reload() re-reads */
};

/* Configure a: token_file (may be NULL) wins; else env_value (the value of
 * KVCOORD_AUTH_TOKEN, NULL when unset: pass getenv(AUTH_ENV)); else auth off.
 * Returns 0, or -1 with a message in err (unreadable, world-readable or not
 * regular file, token too long or with bad bytes); a is then off.  For the
 * file, err is the reason alone ("mode 0644 gives access to others; ..."),
 * without the file's name, which the caller logs as a field of its own (so
 * a long path never crowds out the reason); for the environment it starts
 * with "KVCOORD_AUTH_TOKEN: ".  Never blocks: a FIFO or device in the
 * file's place is refused as not a regular file, not waited on. */
int auth_init(struct auth *a, const char *token_file, const char *env_value, char *err,
              size_t errcap);

/* Re-read the token file (SIGHUP).  Returns 1 when the file was re-read,
 * 0 when there is nothing to re-read (auth off, or the token came from the
 * environment), -1 on error with the reason in err (as auth_init's, without
 * the file's name: a->path): the previous token stays in force (a bad edit
 * never turns auth off).  Never blocks, as auth_init. */
int auth_reload(struct auth *a, char *err, size_t errcap);

/* Non-zero when mutating requests need a token. */
int auth_enabled(const struct auth *a);

/* Check the value of a request's Authorization header (NUL-terminated;
 * NULL: no header).  Auth off: always AUTH_ALLOW. */
enum auth_result auth_check(const struct auth *a, const char *value);

/* The same for value[0..len), not NUL-terminated (value NULL: no header). */
enum auth_result auth_check_n(const struct auth *a, const char *value, size_t len);

/* Short name of a result ("allow", "missing", "scheme", "token",
 * "empty_config"), for logs. */
const char *auth_result_name(enum auth_result r);

/* Name of a source ("none", "file", "env"). */
const char *auth_source_name(enum auth_source s);

/* Wipe the token from memory. */
void auth_clear(struct auth *a);

#endif /* KVC_AUTH_H */
