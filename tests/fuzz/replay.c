/*
 * replay.c - main() for a fuzz target outside libFuzzer: runs every file
 * named on the command line, and every file in every directory named (in
 * name order), through LLVMFuzzerTestOneInput() once.  A broken invariant
 * aborts (the test fails, naming the file that was running); the sanitizer
 * builds also catch memory errors this way.  So every build replays the
 * seed corpus and the crash regressions kept in tests/fuzz/<target>/.
 *
 *   fuzz_http_replay tests/fuzz/http [more dirs or files...]
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_common.h"

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, len = 0;
    uint8_t *data = malloc(cap);
    size_t n;
    while (data && (n = fread(data + len, 1, cap - len, f)) > 0) {
        len += n;
        if (len == cap) {
            uint8_t *bigger = realloc(data, cap *= 2);
            if (!bigger)
                free(data);
            data = bigger;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!data || bad) {
        fprintf(stderr, "replay: %s: read failed\n", path);
        free(data);
        return -1;
    }
    /* Exactly len bytes in their own allocation: ASan sees a read past the
     * input's end as the fuzzer would. */
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact) {
        free(data);
        return -1;
    }
    memcpy(exact, data, len);
    free(data);
    fprintf(stderr, "replay: %s (%zu bytes)\n", path, len);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Run every regular file in dir; returns the count, or -1. */
static int run_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
        return -1;
    }
    char **names = NULL;
    size_t count = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        if (count == cap) {
            char **more = realloc(names, (cap = cap ? cap * 2 : 64) * sizeof *names);
            if (!more)
                break;
            names = more;
        }
        size_t plen = strlen(dir) + strlen(de->d_name) + 2;
        if (!(names[count] = malloc(plen)))
            break;
        snprintf(names[count], plen, "%s/%s", dir, de->d_name);
        count++;
    }
    closedir(d);
    qsort(names, count, sizeof *names, by_name);
    int ran = 0;
    for (size_t i = 0; i < count; i++) {
        struct stat st;
        if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) {
            if (run_file(names[i]) == 0)
                ran++;
            else
                ran = -1000000;
        }
        free(names[i]);
    }
    free(names);
    return ran < 0 ? -1 : ran;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR_OR_FILE...\n", argv[0]);
        return 2;
    }
    int total = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st)) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            return 1;
        }
        int n = S_ISDIR(st.st_mode) ? run_dir(argv[i]) : run_file(argv[i]) == 0 ? 1 : -1;
        if (n < 0)
            return 1;
        total += n;
    }
    if (total == 0) {
        fprintf(stderr, "replay: no inputs found\n");
        return 1;
    }
    printf("replay: %d inputs, no invariant broken\n", total);
    return 0;
}
