/*
 * util.c - file and time helpers of the trainer CLI (start-up regime: any
 * failure exits with a message).
 */
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "trainer.h"

double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

uint8_t *read_file(const char *path, size_t *size) {
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0, "cannot open %s", path);
    struct stat sb;
    CHECK_SYS(fstat(fd, &sb), "cannot stat %s", path);
    uint8_t *buf = xmalloc((size_t)sb.st_size);
    size_t got = 0;
    while (got < (size_t)sb.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
        CHECK(r > 0, "read error on %s", path);
        got += (size_t)r;
    }
    close(fd);
    *size = got;
    return buf;
}

void fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    CHECK(fd >= 0, "cannot open directory %s", dir);
    CHECK_SYS(fsync(fd), "fsync %s", dir);
    close(fd);
}

void write_file_atomic(const char *path, const void *data, size_t size) {
    char tmp[4096], dcopy[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0, "cannot create %s (is the directory writable?)", tmp);
    const uint8_t *p = data;
    size_t done = 0;
    while (done < size) {
        ssize_t w = write(fd, p + done, size - done);
        CHECK(w > 0, "write error on %s (disk full?)", tmp);
        done += (size_t)w;
    }
    CHECK_SYS(fsync(fd), "fsync %s", tmp);
    close(fd);
    CHECK_SYS(rename(tmp, path), "rename %s -> %s", tmp, path);
    snprintf(dcopy, sizeof dcopy, "%s", path);
    fsync_dir(dirname(dcopy));
}

uint64_t parse_hex64(const char *s) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 16);
    CHECK(errno == 0 && *s && *end == 0 && strlen(s) <= 16, "'%s' is not a 64-bit hex value (16 hex digits)", s);
    return (uint64_t)v;
}

int default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 64 ? 64 : (int)n;
}

void path_join(char *dst, size_t cap, const char *a, const char *b) {
    int n = snprintf(dst, cap, "%s/%s", a, b);
    CHECK(n >= 0 && (size_t)n < cap, "path too long: %s/%s", a, b);
}
