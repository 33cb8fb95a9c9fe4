/*
 * walfault: an LD_PRELOAD shim that makes writes to a SQLite write-ahead log ("-wal" file)
 * fail on command, for the fault tests (test/faults/walWriteFaults.test.ts).
 *
 * The command is the content of the file named by $WALFAULT_CONTROL, read at every write to
 * a -wal file:
 *
 *   <action> <target> <skip>
 *
 *   action  enospc  the write fails with ENOSPC and writes nothing
 *           eio     the write fails with EIO and writes nothing
 *           short   the first half of the bytes is written and the call returns that count
 *                   (a short write); the next write to the file then fails with ENOSPC
 *           kill    the first half of the bytes is written, then the process kills itself
 *                   with SIGKILL (a crash in the middle of the write)
 *   target  next    any write to the -wal file
 *           commit  a write that completes a commit frame (the last byte of the page of a
 *                   frame whose header carries a database size): the gathered write of a
 *                   commit, or with SQLite's own writes the page after a commit frame's header
 *   skip    how many matching writes pass before the one that fails (0: the first)
 *
 * The command fires once: the shim then replaces it with a line saying what it did
 * ("fired <action> <target> off=<offset> len=<length> wrote=<bytes>"), which the test reads.
 * An empty or missing file: nothing happens. Everything but -wal files passes untouched.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);
typedef ssize_t (*writev_fn)(int, const struct iovec *, int);
typedef ssize_t (*pwritev_fn)(int, const struct iovec *, int, off_t);
typedef ssize_t (*pwritev2_fn)(int, const struct iovec *, int, off_t, int);

static write_fn real_write;
static pwrite_fn real_pwrite, real_pwrite64;
static writev_fn real_writev;
static pwritev_fn real_pwritev, real_pwritev64;
static pwritev2_fn real_pwritev2;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

#define MAX_FD 4096
#define WAL_HEADER 32
#define FRAME_HEADER 24
/* Per -wal descriptor: where the frame whose header said "commit" ends, when a later write
 * (SQLite's own page write after the header) has yet to complete it; 0 when none. */
static off_t commitEnd[MAX_FD];
/* A short write happened: the next write to this descriptor fails with ENOSPC. */
static int failNext[MAX_FD];
/* Matching writes seen for the current command (compared with its skip count). */
static int seen;

static void resolve(void) {
  if (real_write) return;
  real_write = (write_fn)dlsym(RTLD_NEXT, "write");
  real_pwrite = (pwrite_fn)dlsym(RTLD_NEXT, "pwrite");
  real_pwrite64 = (pwrite_fn)dlsym(RTLD_NEXT, "pwrite64");
  real_writev = (writev_fn)dlsym(RTLD_NEXT, "writev");
  real_pwritev = (pwritev_fn)dlsym(RTLD_NEXT, "pwritev");
  real_pwritev64 = (pwritev_fn)dlsym(RTLD_NEXT, "pwritev64");
  real_pwritev2 = (pwritev2_fn)dlsym(RTLD_NEXT, "pwritev2");
}

static int isWal(int fd) {
  char link[64], path[4096];
  ssize_t n;
  if (fd < 0 || fd >= MAX_FD) return 0;
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  n = readlink(link, path, sizeof path - 1);
  if (n < 4) return 0;
  path[n] = 0;
  return strcmp(path + n - 4, "-wal") == 0;
}

/* The command, or 0 when there is none. */
static int readCommand(char *action, char *target, int *skip) {
  const char *control = getenv("WALFAULT_CONTROL");
  char text[256];
  ssize_t n;
  int fd;
  if (!control) return 0;
  fd = open(control, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  n = read(fd, text, sizeof text - 1);
  close(fd);
  if (n <= 0) return 0;
  text[n] = 0;
  *skip = 0;
  if (sscanf(text, "%15s %15s %d", action, target, skip) < 2) return 0;
  if (strcmp(action, "enospc") && strcmp(action, "eio") && strcmp(action, "short") && strcmp(action, "kill")) return 0;
  if (strcmp(target, "next") && strcmp(target, "commit")) return 0;
  return 1;
}

static void report(const char *line) {
  const char *control = getenv("WALFAULT_CONTROL");
  int fd = open(control, O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) return;
  if (real_write(fd, line, strlen(line)) < 0) {
    /* Nothing to do: the test then sees the command unchanged and fails. */
  }
  close(fd);
}

static unsigned pageSizeOf(int fd) {
  unsigned char h[WAL_HEADER];
  unsigned size;
  if (pread(fd, h, sizeof h, 0) != (ssize_t)sizeof h) return 0;
  size = ((unsigned)h[8] << 24) | ((unsigned)h[9] << 16) | ((unsigned)h[10] << 8) | h[11];
  if (size == 1) size = 65536;
  return size >= 512 && size <= 65536 && (size & (size - 1)) == 0 ? size : 0;
}

/*
 * Whether the write [off, off+len) completes a commit frame. Also remembers a commit frame's
 * header written without its page, for the write that brings the page.
 */
static int completesCommit(int fd, const unsigned char *data, size_t len, off_t off) {
  off_t end = off + (off_t)len, frame, first;
  unsigned page = pageSizeOf(fd);
  int completes = 0;
  if (commitEnd[fd] > off && commitEnd[fd] <= end) {
    completes = 1;
    commitEnd[fd] = 0;
  }
  if (page == 0 || end <= WAL_HEADER) return completes;
  /* The first frame header at or after off. */
  first = off <= WAL_HEADER ? WAL_HEADER : WAL_HEADER + ((off - WAL_HEADER + FRAME_HEADER + page - 1) / (FRAME_HEADER + page)) * (FRAME_HEADER + page);
  for (frame = first; frame + FRAME_HEADER <= end; frame += FRAME_HEADER + page) {
    const unsigned char *h = data + (frame - off);
    if ((h[4] | h[5] | h[6] | h[7]) == 0) continue;
    if (frame + FRAME_HEADER + page <= end) completes = 1;
    else commitEnd[fd] = frame + FRAME_HEADER + page;
  }
  return completes;
}

/*
 * Decides what happens to a write of `len` bytes at `off` on `fd`: returns 1 when the shim
 * answered it (the result in *result, errno set), 0 when it goes ahead as asked.
 * `half` writes the first `n` bytes for real (the short write and the crash).
 */
static int intercept(int fd, const unsigned char *data, size_t len, off_t off, ssize_t *result, ssize_t (*half)(int, const void *, size_t, off_t)) {
  char action[16], target[16], line[256];
  int skip, matches, answered = 0, saved;
  ssize_t wrote = 0;
  if (!isWal(fd)) return 0;
  pthread_mutex_lock(&lock);
  if (failNext[fd]) {
    failNext[fd] = 0;
    pthread_mutex_unlock(&lock);
    *result = -1;
    errno = ENOSPC;
    return 1;
  }
  /* Always, so that a commit frame's header written before the command still counts. */
  matches = completesCommit(fd, data, len, off);
  if (!readCommand(action, target, &skip)) {
    seen = 0;
    pthread_mutex_unlock(&lock);
    return 0;
  }
  if (strcmp(target, "next") == 0) matches = 1;
  if (matches && seen++ >= skip) {
    seen = 0;
    answered = 1;
    if (strcmp(action, "enospc") == 0 || strcmp(action, "eio") == 0) {
      *result = -1;
      saved = action[0] == 'e' && action[1] == 'n' ? ENOSPC : EIO;
    } else {
      wrote = half(fd, data, len / 2, off);
      *result = wrote;
      saved = 0;
      if (strcmp(action, "short") == 0) failNext[fd] = 1;
    }
    snprintf(line, sizeof line, "fired %s %s off=%lld len=%zu wrote=%zd\n", action, target, (long long)off, len, wrote < 0 ? 0 : wrote);
    report(line);
    if (strcmp(action, "kill") == 0) kill(getpid(), SIGKILL);
    errno = saved;
  }
  pthread_mutex_unlock(&lock);
  return answered;
}

static ssize_t halfPwrite(int fd, const void *data, size_t n, off_t off) { return real_pwrite64(fd, data, n, off); }
static ssize_t halfWrite(int fd, const void *data, size_t n, off_t off) {
  (void)off;
  return real_write(fd, data, n);
}

ssize_t pwrite64(int fd, const void *data, size_t len, off_t off) {
  ssize_t result;
  resolve();
  if (intercept(fd, data, len, off, &result, halfPwrite)) return result;
  return real_pwrite64(fd, data, len, off);
}

ssize_t pwrite(int fd, const void *data, size_t len, off_t off) {
  ssize_t result;
  resolve();
  if (intercept(fd, data, len, off, &result, halfPwrite)) return result;
  return real_pwrite(fd, data, len, off);
}

ssize_t write(int fd, const void *data, size_t len) {
  ssize_t result;
  resolve();
  if (isWal(fd)) {
    off_t off = lseek(fd, 0, SEEK_CUR);
    if (off >= 0 && intercept(fd, data, len, off, &result, halfWrite)) return result;
  }
  return real_write(fd, data, len);
}

/* The vectored calls: one buffer of what they would write, through the same decision. */
static unsigned char *flatten(const struct iovec *iov, int count, size_t *len) {
  size_t total = 0, at = 0;
  unsigned char *buf;
  int i;
  for (i = 0; i < count; i++) total += iov[i].iov_len;
  buf = malloc(total ? total : 1);
  if (!buf) return 0;
  for (i = 0; i < count; i++) {
    memcpy(buf + at, iov[i].iov_base, iov[i].iov_len);
    at += iov[i].iov_len;
  }
  *len = total;
  return buf;
}

static int interceptVector(int fd, const struct iovec *iov, int count, off_t off, ssize_t *result, int positioned) {
  size_t len;
  unsigned char *buf;
  int answered;
  if (!isWal(fd)) return 0;
  if (!positioned) off = lseek(fd, 0, SEEK_CUR);
  buf = flatten(iov, count, &len);
  if (!buf || off < 0) {
    free(buf);
    return 0;
  }
  answered = intercept(fd, buf, len, off, result, positioned ? halfPwrite : halfWrite);
  free(buf);
  return answered;
}

ssize_t writev(int fd, const struct iovec *iov, int count) {
  ssize_t result;
  resolve();
  if (interceptVector(fd, iov, count, 0, &result, 0)) return result;
  return real_writev(fd, iov, count);
}

ssize_t pwritev(int fd, const struct iovec *iov, int count, off_t off) {
  ssize_t result;
  resolve();
  if (interceptVector(fd, iov, count, off, &result, 1)) return result;
  return real_pwritev(fd, iov, count, off);
}

ssize_t pwritev64(int fd, const struct iovec *iov, int count, off_t off) {
  ssize_t result;
  resolve();
  if (interceptVector(fd, iov, count, off, &result, 1)) return result;
  return real_pwritev64(fd, iov, count, off);
}

ssize_t pwritev2(int fd, const struct iovec *iov, int count, off_t off, int flags) {
  ssize_t result;
  resolve();
  if (off != -1 && interceptVector(fd, iov, count, off, &result, 1)) return result;
  if (off == -1 && interceptVector(fd, iov, count, 0, &result, 0)) return result;
  return real_pwritev2(fd, iov, count, off, flags);
}
