/*
 * json_scan.h - a strict RFC 8259 validator that builds no tree.
 *
 * kvc__json_scan() reads one JSON text once, checks it completely (grammar,
 * UTF-8, escapes and surrogate pairs, nesting depth, integer range) and, on
 * the way, records where the values of a few object members the caller
 * asked for ("watches") begin and end, their type and, for containers, how
 * many members they have.  Nothing is copied or re-encoded: a caller keeps
 * the bytes of a validated value exactly as they were sent (numbers stay
 * as written: 0.1 stays 0.1, 1E5 stays 1E5).
 *
 * What it accepts, beyond the grammar:
 *   - integers (no fraction, no exponent) from -2^63 to 2^64-1; larger
 *     ones are refused ("integer out of range"), so every integer fits an
 *     int64 or a uint64;
 *   - reals of any magnitude (they are kept as text, never converted);
 *   - "\u0000" inside strings (RFC 8259 allows it; callers that need a C
 *     string check the decoded value);
 *   - at most KVC_JSON_MAX_DEPTH nested arrays and objects;
 *   - a duplicate key: the last occurrence is the one a watch records (as
 *     jansson and Python read it).
 * Whitespace is space, tab, LF and CR only; the text is one value with
 * optional whitespace around it.
 *
 * Thread safety: none needed (no state outside the arguments).  Never
 * allocates, never prints, never aborts.  Used by libkvcoord (validating a
 * weights_info_dict) and kvcoordd (the registration body); compiled into
 * libkvcoord with hidden visibility (kvcoordd links the static library).
 */
#ifndef KVC_JSON_SCAN_H
#define KVC_JSON_SCAN_H

#include <stddef.h>
#include <stdint.h>

#define KVC_JSON_MAX_DEPTH 2048 /* same as jansson's JSON_PARSER_MAX_DEPTH */

enum kvc_json_type {
    KVC_JSON_NONE = 0, /* a watch not found */
    KVC_JSON_OBJECT,
    KVC_JSON_ARRAY,
    KVC_JSON_STRING,
    KVC_JSON_INTEGER,
    KVC_JSON_REAL,
    KVC_JSON_TRUE,
    KVC_JSON_FALSE,
    KVC_JSON_NULL,
};

/* One member to locate.  parent is the index (in the same array) of the
 * watch whose value is the object holding this key, or -1 for the
 * top-level object; a watch must come after its parent.  key is compared
 * with the decoded key (escapes resolved), byte for byte.  The scanner
 * fills the rest: type (KVC_JSON_NONE when absent), the value's bytes
 * [start, end) as offsets into the text, members (for an object or
 * array: its number of members or elements), and seen: how many times the
 * key occurred in its object (2 or more: a duplicate key, whose last
 * occurrence is the one recorded; a caller may refuse it). */
struct kvc_json_watch {
    int parent;
    const char *key;
    enum kvc_json_type type;
    size_t start, end;
    size_t members;
    unsigned seen;
};

/* Why a text was refused: the byte offset of the offending character (the
 * text's length when it ended too soon), its 1-based line and column
 * (column counted in characters), and a reason in words. */
struct kvc_json_error {
    size_t offset;
    unsigned line, column;
    char text[80];
};

/* The top-level value's type and member count, on success. */
struct kvc_json_root {
    enum kvc_json_type type;
    size_t members;
};

/* Validate text[0..len) as one JSON text; fill watch[0..nwatch) (may be
 * NULL with nwatch 0) and *root (may be NULL).  Returns 0 when valid, -1
 * (and *err, which may be NULL, filled) when not.  A NUL byte in the text
 * is invalid wherever it appears. */
int kvc__json_scan(const char *text, size_t len, struct kvc_json_watch *watch, size_t nwatch,
                   struct kvc_json_root *root, struct kvc_json_error *err);

/* Decode the string value text[start, end) (a span a watch recorded, quotes
 * included, already validated) into out[0..cap), NUL-terminated.  Returns
 * the decoded length, or -1 when it does not fit in cap - 1 bytes.
 * *has_nul (may be NULL) is set when the value contains U+0000. */
long kvc__json_string(const char *text, size_t start, size_t end, char *out, size_t cap,
                      int *has_nul);

/* The value of the integer text[start, end) (validated: -2^63..2^64-1).
 * *negative is set for a value below zero ("-0" is zero, not negative);
 * *value receives its magnitude. */
void kvc__json_integer(const char *text, size_t start, size_t end, int *negative, uint64_t *value);

#endif
