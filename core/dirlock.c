/* core/dirlock.c: the run-directory lock of core/dirlock.h. */
#include "core/dirlock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

arl_status arl_dirlock_take(arl_dirlock *l, const char *dir, const char *who) {
    l->fd = -1;
    char path[4200];
    if (snprintf(path, sizeof path, "%s/%s", dir, ARL_DIRLOCK_FILE) >= (int)sizeof path)
        return arl_errorf(ARL_ERR_ARG, "%s: output directory path too long: %s", who, dir);
    const int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return arl_errorf(errno == ENOSPC ? ARL_ERR_FULL : ARL_ERR_IO,
                          "%s: cannot open the lock file %s: %s", who, path, strerror(errno));
    /* flock, not fcntl: a lock per open file, so a second take in this process is refused too */
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        const int e = errno;
        char pid[32] = "";
        const ssize_t n = e == EWOULDBLOCK ? pread(fd, pid, sizeof pid - 1, 0) : 0;
        pid[n > 0 ? n : 0] = 0;
        pid[strcspn(pid, "\n")] = 0;
        close(fd);
        if (e == EWOULDBLOCK)
            return arl_errorf(ARL_ERR_BUSY,
                              "%s: %s is in use by another process (pid %s): one run per "
                              "output directory at a time; wait for it to end, or choose "
                              "another output directory",
                              who, dir, pid[0] ? pid : "unknown");
        return arl_errorf(ARL_ERR_IO, "%s: cannot lock %s: %s", who, path, strerror(e));
    }
    char text[32];
    const int len = snprintf(text, sizeof text, "%ld\n", (long)getpid());
    /* the pid is for messages only: a failure to record it changes nothing */
    if (ftruncate(fd, 0) == 0) {
        const ssize_t w = pwrite(fd, text, (size_t)len, 0);
        (void)w;
    }
    l->fd = fd;
    return ARL_OK;
}

void arl_dirlock_release(arl_dirlock *l) {
    if (l->fd < 0) return;
    close(l->fd); /* drops the flock */
    l->fd = -1;
}
