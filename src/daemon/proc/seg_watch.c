/*
 * seg_watch.c - the segment file watch; see seg_watch.h.
 */
#include "seg_watch.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

struct seg_watch {
    char path[KVC_NAME_MAX + 16];
    int fd; /* the file the segment maps (O_RDWR: to undo a size change) */
    dev_t dev;
    ino_t ino;
    off_t size;  /* the mapped size */
    mode_t mode; /* permission bits */
};

int seg_watch_open(struct seg_watch **out, kvc_segment *seg, const char *name, char *err,
                   size_t errcap)
{
    kvc_segment_info si;
    if (kvc_segment_stat(seg, &si)) {
        snprintf(err, errcap, "%s", kvc_last_error());
        return -1;
    }
    struct seg_watch *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    snprintf(w->path, sizeof w->path, "/dev/shm/%s", name);
    struct stat st;
    w->fd = open(w->path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (w->fd < 0 || fstat(w->fd, &st)) {
        snprintf(err, errcap, "open(%s): %s", w->path, strerror(errno));
        seg_watch_close(w);
        return -1;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != si.total_bytes) {
        snprintf(err, errcap, "%s changed while it was opened (%lld bytes, the segment maps %llu)",
                 w->path, (long long)st.st_size, (unsigned long long)si.total_bytes);
        seg_watch_close(w);
        return -1;
    }
    w->dev = st.st_dev;
    w->ino = st.st_ino;
    w->size = st.st_size;
    w->mode = st.st_mode & 07777;
    *out = w;
    return 0;
}

int seg_watch_check(struct seg_watch *w, char *msg, size_t cap)
{
    struct stat st, byname;
    if (fstat(w->fd, &st)) {
        snprintf(msg, cap, "fstat(%s): %s", w->path, strerror(errno));
        return -1;
    }
    if (st.st_size < w->size) {
        snprintf(msg, cap,
                 "segment file %s truncated from %lld to %lld bytes under the daemon: the pages "
                 "past the end are lost for every attached process; restart the workers too",
                 w->path, (long long)w->size, (long long)st.st_size);
        return -1;
    }
    int named = stat(w->path, &byname) == 0;
    if (!named || st.st_nlink == 0) {
        if (named && (byname.st_dev != w->dev || byname.st_ino != w->ino))
            snprintf(msg, cap,
                     "segment file %s replaced by another file (inode %llu; the attached "
                     "processes map inode %llu) under the daemon; restart the workers too",
                     w->path, (unsigned long long)byname.st_ino, (unsigned long long)w->ino);
        else
            snprintf(msg, cap,
                     "segment file %s unlinked under the daemon (kvcoord-diag unlink, rm?): "
                     "new workers could not attach and a new daemon would serve another "
                     "table; restart the workers too",
                     w->path);
        return -1;
    }
    if (byname.st_dev != w->dev || byname.st_ino != w->ino) {
        snprintf(msg, cap,
                 "segment file %s replaced by another file (inode %llu; the attached processes "
                 "map inode %llu) under the daemon; restart the workers too",
                 w->path, (unsigned long long)byname.st_ino, (unsigned long long)w->ino);
        return -1;
    }
    int undone = 0;
    if (st.st_size > w->size) {
        if (ftruncate(w->fd, w->size))
            log_event(LOG_ERROR, "segment_file_changed",
                      "path=%s change=extended from=%lld to=%lld action=none err=\"ftruncate: %s\"",
                      w->path, (long long)w->size, (long long)st.st_size, strerror(errno));
        else
            log_event(LOG_ERROR, "segment_file_changed",
                      "path=%s change=extended from=%lld to=%lld action=restored_size", w->path,
                      (long long)w->size, (long long)st.st_size);
        undone = 1;
    }
    if ((st.st_mode & 07777) != w->mode) {
        if (fchmod(w->fd, w->mode))
            log_event(LOG_ERROR, "segment_file_changed",
                      "path=%s change=mode from=%04o to=%04o action=none err=\"fchmod: %s\"",
                      w->path, (unsigned)w->mode, (unsigned)(st.st_mode & 07777), strerror(errno));
        else
            log_event(LOG_ERROR, "segment_file_changed",
                      "path=%s change=mode from=%04o to=%04o action=restored_mode", w->path,
                      (unsigned)w->mode, (unsigned)(st.st_mode & 07777));
        undone = 1;
    }
    return undone;
}

void seg_watch_close(struct seg_watch *w)
{
    if (!w)
        return;
    if (w->fd >= 0)
        close(w->fd);
    free(w);
}
