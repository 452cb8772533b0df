/*
 * options_table.h - the rows of kvcoordd's options (options_table.c) and
 * what kvcoordd_options.c needs to read them.  One row is everything about
 * an option, as nginx's ngx_command_t arrays are: adding an option is
 * adding a row (and its field in struct options).
 */
#ifndef KVC_OPTIONS_TABLE_H
#define KVC_OPTIONS_TABLE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvcoordd_options.h"

enum opt_kind {
    OPT_FLAG,    /* no value; stores min into the int field */
    OPT_COUNT,   /* an integer in [min, max] into a uint32_t field */
    OPT_SIZE,    /* a SIZE (K/M/G suffix) in [min, max] into a uint64_t field */
    OPT_TEXT,    /* the value itself into a const char * field, once fn accepts it */
    OPT_SET,     /* fn parses the value into the field */
    OPT_HELP,    /* prints --help; exit 0 */
    OPT_VERSION, /* prints the version; exit 0 */
};

/* fn's contract: 0 accepted (OPT_SET: stored at field), else -1 with why
 * set to what follows "invalid --NAME 'VALUE'" in the error message. */
typedef int (*opt_fn)(void *field, const char *value, char *why, size_t cap);

struct opt_row {
    const char *name; /* long name, without "--" */
    char letter;      /* short option, 0 for none */
    enum opt_kind kind;
    const char *arg;          /* the value's name in --help ("N", "SIZE"); NULL: none */
    size_t off;               /* the field in struct options (not help, version) */
    uint64_t min, max;        /* OPT_COUNT, OPT_SIZE: the range accepted */
    uint64_t def;             /* OPT_COUNT, OPT_SIZE: the default, unless def_fn */
    uint64_t (*def_fn)(void); /* the default found at start (the library's, say) */
    const char *def_str;      /* OPT_TEXT, OPT_SET: the default, taken as a given value */
    const char *def_text;     /* --help's "default ..." when not def/def_str; "" none */
    const char *noun; /* OPT_COUNT: what is expected; NULL: "an integer"; "": the range alone */
    const char *why;  /* appended to a range error: where the range comes from */
    opt_fn fn;        /* OPT_TEXT: check (NULL: any); OPT_SET: parse and store */
    const char *help; /* the --help text, wrapped by usage(); the default and
                             range are appended from the fields above */
};

extern const struct opt_row opt_rows[];
extern const size_t opt_nrows;

/* --help's text before the options and after them. */
extern const char opt_usage_head[], opt_usage_tail[];

/* --version's answer. */
void opt_print_version(FILE *f);

#endif /* KVC_OPTIONS_TABLE_H */
