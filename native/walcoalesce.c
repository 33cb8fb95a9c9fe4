/*
 * walcoalesce: a SQLite VFS that writes a commit's WAL frames with one write call.
 *
 * SQLite appends a transaction's frames to the WAL with two write calls per frame (its
 * 24-byte header, then the page) and, with synchronous = NORMAL, no sync. Under many small
 * commits those calls are a good part of what a COMMIT costs, more so on virtual machines,
 * where a system call is dear (docs/decisions/018-wal-writes.md). This VFS wraps the
 * default one and, for WAL files only, gathers writes that continue exactly where the last
 * write to the file ended, and hands them on in one call (in chunks the unix VFS accepts):
 *
 *  - as soon as the page of a commit frame (a frame header whose "database size" field is
 *    set) has been gathered: COMMIT has then written everything, with any error its own,
 *    before SQLite publishes the new frames in the WAL index;
 *  - before any other operation on the WAL file (read, sync, truncate, size, lock, file
 *    control), before a write anywhere else, and past GATHER_LIMIT bytes;
 *  - and, as a last guard, when SQLite is about to publish a new WAL-index header (the
 *    database file's shared-memory barrier) with anything still gathered.
 *
 * What is gathered belongs to the write transaction in progress, and is dropped, never
 * written, where SQLite has given that transaction up:
 *
 *  - when a write call fails (ENOSPC, EIO, a short write). SQLite then abandons the frame
 *    set it was writing (its in-memory WAL end does not move) and rolls the transaction
 *    back. Written later, the frames of a commit the caller was told had failed would be in
 *    the file with their commit frame, and crash recovery would replay them;
 *  - when the connection gives up the WAL's write lock: a commit leaves nothing gathered, so
 *    what is left is a rolled-back transaction's, which must not land later over what the
 *    next writer (another connection) commits at those offsets;
 *  - when the WAL file closes (its connection holds no write lock by then).
 *
 * Gathered bytes that fail to leave on any other operation (a read, a sync, a size) stay
 * gathered for the next one to retry: SQLite may carry on with the transaction after such
 * an error, and it believes those frames written. Order and content of what reaches the
 * file are unchanged, and nothing is published before it is written: readers, the
 * checkpointer and crash recovery see what they saw before. A WAL is gathered only when its
 * database file was opened through this VFS and the device has powersafe overwrite (else
 * SQLite pads commits to a sector, splitting a frame around a sync). Everything else (the
 * database file, journals, shared memory) passes straight through.
 */
#include "sqlite3ext.h"
SQLITE_EXTENSION_INIT1
#include <stdlib.h>
#include <string.h>

#define WAL_FRAME_HEADER 24
/* Past this, gathered bytes are written before more are taken. */
#define GATHER_LIMIT (4 * 1024 * 1024)
/* The unix VFS writes at most 128 KiB - 1 bytes per call (it masks the length). */
#define WRITE_CHUNK (96 * 1024)

typedef struct GatherFile GatherFile;
struct GatherFile {
  sqlite3_file base;
  sqlite3_file *real;  /* the wrapped VFS's file, allocated right after this struct */
  int isWal;
  GatherFile *db;      /* WAL file: its database file (for the barrier guard) */
  GatherFile *wal;     /* database file: its open WAL file, if any */
  unsigned char *buf;  /* gathered bytes, for the file from offset `start` */
  int used, size;
  sqlite3_int64 start;
  sqlite3_int64 end;   /* where the last write to the file ended; -1 before the first */
  int commitFrame;     /* the last write was a commit frame's header: its page completes it */
};

static sqlite3_vfs gatherVfs;
static sqlite3_vfs *realVfs;

static int writeThrough(GatherFile *f, const void *data, int n, sqlite3_int64 off) {
  int rc = SQLITE_OK, done = 0;
  while (rc == SQLITE_OK && done < n) {
    int part = n - done < WRITE_CHUNK ? n - done : WRITE_CHUNK;
    rc = f->real->pMethods->xWrite(f->real, (const unsigned char *)data + done, part, off + done);
    done += part;
  }
  return rc;
}

/* Lets go of what is gathered, unwritten; the next write then starts a new run. */
static void dropGathered(GatherFile *f) {
  if (f->used > 0) f->end = -1;
  f->used = 0;
  f->commitFrame = 0;
}

/*
 * Writes what is gathered. On failure the bytes stay gathered: the caller decides whether
 * they are retried (an operation SQLite may go on from) or dropped (a failed write).
 */
static int flushGathered(GatherFile *f) {
  int rc;
  if (f->used == 0) return SQLITE_OK;
  rc = writeThrough(f, f->buf, f->used, f->start);
  if (rc == SQLITE_OK) f->used = 0;
  return rc;
}

/*
 * A failed WAL write: what is gathered (the frame set being written, and earlier ones of the
 * same transaction) is dropped. What a partial write left in the file is a prefix of it,
 * without a whole commit frame, beyond the WAL's published end: recovery ignores it and the
 * next writer overwrites it, as with SQLite's own writes.
 */
static int writeFailed(GatherFile *f, int rc) {
  dropGathered(f);
  f->end = -1;
  return rc;
}

static int gWrite(sqlite3_file *p, const void *data, int n, sqlite3_int64 off) {
  GatherFile *f = (GatherFile *)p;
  int rc, completesCommit;
  if (!f->isWal) return f->real->pMethods->xWrite(f->real, data, n, off);
  completesCommit = f->commitFrame;
  f->commitFrame = n == WAL_FRAME_HEADER && (((const unsigned char *)data)[4] | ((const unsigned char *)data)[5] |
                                             ((const unsigned char *)data)[6] | ((const unsigned char *)data)[7]) != 0;
  /* Only appends are gathered: a write anywhere else (SQLite rewriting a frame in place or
   * a frame header's checksum, a new WAL header) goes straight through, after what was
   * gathered; so does one past the limit, or one the buffer cannot grow for. */
  if (off == f->end && f->used + n <= GATHER_LIMIT && f->used + n > f->size) {
    int size = f->size ? f->size : 128 * 1024;
    unsigned char *grown;
    while (size < f->used + n) size *= 2;
    grown = sqlite3_realloc(f->buf, size);
    if (grown) {
      f->buf = grown;
      f->size = size;
    }
  }
  if (off != f->end || f->used + n > GATHER_LIMIT || f->used + n > f->size) {
    rc = flushGathered(f);
    if (rc == SQLITE_OK) rc = writeThrough(f, data, n, off);
    if (rc != SQLITE_OK) return writeFailed(f, rc);
    f->end = off + n;
    return SQLITE_OK;
  }
  if (f->used == 0) f->start = off;
  memcpy(f->buf + f->used, data, n);
  f->used += n;
  f->end = off + n;
  if (!completesCommit) return SQLITE_OK;
  rc = flushGathered(f);
  return rc == SQLITE_OK ? SQLITE_OK : writeFailed(f, rc);
}

/* Every other WAL operation first writes what was gathered. */
#define FLUSH_OR_RETURN(f)              \
  do {                                  \
    int flushed = flushGathered(f);     \
    if (flushed != SQLITE_OK) return flushed; \
  } while (0)

static int gClose(sqlite3_file *p) {
  GatherFile *f = (GatherFile *)p;
  int rc;
  dropGathered(f);
  if (f->db) f->db->wal = 0;
  if (f->wal) f->wal->db = 0;
  rc = f->real->pMethods->xClose(f->real);
  sqlite3_free(f->buf);
  f->buf = 0;
  return rc;
}

static int gRead(sqlite3_file *p, void *out, int n, sqlite3_int64 off) {
  GatherFile *f = (GatherFile *)p;
  FLUSH_OR_RETURN(f);
  return f->real->pMethods->xRead(f->real, out, n, off);
}

static int gTruncate(sqlite3_file *p, sqlite3_int64 size) {
  GatherFile *f = (GatherFile *)p;
  FLUSH_OR_RETURN(f);
  if (f->end > size) f->end = -1;
  return f->real->pMethods->xTruncate(f->real, size);
}

static int gSync(sqlite3_file *p, int flags) {
  GatherFile *f = (GatherFile *)p;
  FLUSH_OR_RETURN(f);
  return f->real->pMethods->xSync(f->real, flags);
}

static int gFileSize(sqlite3_file *p, sqlite3_int64 *size) {
  GatherFile *f = (GatherFile *)p;
  FLUSH_OR_RETURN(f);
  return f->real->pMethods->xFileSize(f->real, size);
}

static int gLock(sqlite3_file *p, int level) {
  GatherFile *f = (GatherFile *)p;
  FLUSH_OR_RETURN(f);
  return f->real->pMethods->xLock(f->real, level);
}

static int gUnlock(sqlite3_file *p, int level) {
  GatherFile *f = (GatherFile *)p;
  FLUSH_OR_RETURN(f);
  return f->real->pMethods->xUnlock(f->real, level);
}

static int gCheckReservedLock(sqlite3_file *p, int *out) {
  GatherFile *f = (GatherFile *)p;
  return f->real->pMethods->xCheckReservedLock(f->real, out);
}

static int gFileControl(sqlite3_file *p, int op, void *arg) {
  GatherFile *f = (GatherFile *)p;
  int rc;
  FLUSH_OR_RETURN(f);
  rc = f->real->pMethods->xFileControl(f->real, op, arg);
  if (op == SQLITE_FCNTL_VFSNAME && rc == SQLITE_OK) *(char **)arg = sqlite3_mprintf("walcoalesce/%z", *(char **)arg);
  return rc;
}

static int gSectorSize(sqlite3_file *p) {
  GatherFile *f = (GatherFile *)p;
  return f->real->pMethods->xSectorSize(f->real);
}

static int gDeviceCharacteristics(sqlite3_file *p) {
  GatherFile *f = (GatherFile *)p;
  return f->real->pMethods->xDeviceCharacteristics(f->real);
}

static int gShmMap(sqlite3_file *p, int region, int size, int extend, void volatile **out) {
  GatherFile *f = (GatherFile *)p;
  return f->real->pMethods->xShmMap(f->real, region, size, extend, out);
}

/* Slot 0 of the WAL-index locks is the WAL's write lock. */
#define WAL_WRITE_LOCK_SLOT 0

static int gShmLock(sqlite3_file *p, int offset, int n, int flags) {
  GatherFile *f = (GatherFile *)p;
  /* Giving up the write lock ends the write transaction: what is still gathered belongs to
   * one that did not commit, and nothing refers to it. */
  if (offset == WAL_WRITE_LOCK_SLOT && (flags & SQLITE_SHM_UNLOCK) && (flags & SQLITE_SHM_EXCLUSIVE) && f->wal) dropGathered(f->wal);
  return f->real->pMethods->xShmLock(f->real, offset, n, flags);
}

/*
 * SQLite calls the barrier between the two copies of a new WAL-index header. Frames are
 * written when their commit frame is (above), so nothing is gathered here; should anything
 * be, it is written now, and if that fails the process stops rather than publish frames
 * that are not in the file (the transaction was never acknowledged; recovery drops it).
 */
static void gShmBarrier(sqlite3_file *p) {
  GatherFile *f = (GatherFile *)p;
  if (f->wal && f->wal->used > 0 && flushGathered(f->wal) != SQLITE_OK) abort();
  f->real->pMethods->xShmBarrier(f->real);
}

static int gShmUnmap(sqlite3_file *p, int deleteFlag) {
  GatherFile *f = (GatherFile *)p;
  return f->real->pMethods->xShmUnmap(f->real, deleteFlag);
}

static int gFetch(sqlite3_file *p, sqlite3_int64 off, int n, void **out) {
  GatherFile *f = (GatherFile *)p;
  *out = 0;
  FLUSH_OR_RETURN(f);
  return f->real->pMethods->xFetch(f->real, off, n, out);
}

static int gUnfetch(sqlite3_file *p, sqlite3_int64 off, void *ptr) {
  GatherFile *f = (GatherFile *)p;
  return f->real->pMethods->xUnfetch(f->real, off, ptr);
}

static const sqlite3_io_methods gatherMethods = {
  3, gClose, gRead, gWrite, gTruncate, gSync, gFileSize, gLock, gUnlock, gCheckReservedLock,
  gFileControl, gSectorSize, gDeviceCharacteristics, gShmMap, gShmLock, gShmBarrier, gShmUnmap,
  gFetch, gUnfetch,
};

static int gOpen(sqlite3_vfs *vfs, sqlite3_filename name, sqlite3_file *p, int flags, int *outFlags) {
  GatherFile *f = (GatherFile *)p;
  int rc;
  (void)vfs;
  memset(f, 0, sizeof(*f));
  f->end = -1;
  f->real = (sqlite3_file *)&f[1];
  rc = realVfs->xOpen(realVfs, name, f->real, flags, outFlags);
  if (f->real->pMethods == 0) {
    /* The wrapped open left nothing to close: neither do we. */
    p->pMethods = 0;
    return rc;
  }
  p->pMethods = &gatherMethods;
  if (rc == SQLITE_OK && (flags & SQLITE_OPEN_WAL) && name) {
    sqlite3_file *db = sqlite3_database_file_object(name);
    /* Gathered only when the database file is ours (the barrier guard and the write-lock
     * flush need it) and SQLite never splits a frame to pad a commit to a sector, which it
     * does, with a sync in the middle, on a device without powersafe overwrite. */
    if (db && db->pMethods == &gatherMethods && (db->pMethods->xDeviceCharacteristics(db) & SQLITE_IOCAP_POWERSAFE_OVERWRITE)) {
      f->isWal = 1;
      f->db = (GatherFile *)db;
      f->db->wal = f;
    }
  }
  return rc;
}

static int gDelete(sqlite3_vfs *v, const char *n, int s) { (void)v; return realVfs->xDelete(realVfs, n, s); }
static int gAccess(sqlite3_vfs *v, const char *n, int fl, int *o) { (void)v; return realVfs->xAccess(realVfs, n, fl, o); }
static int gFullPathname(sqlite3_vfs *v, const char *n, int k, char *o) { (void)v; return realVfs->xFullPathname(realVfs, n, k, o); }
static void *gDlOpen(sqlite3_vfs *v, const char *n) { (void)v; return realVfs->xDlOpen(realVfs, n); }
static void gDlError(sqlite3_vfs *v, int k, char *o) { (void)v; realVfs->xDlError(realVfs, k, o); }
static void (*gDlSym(sqlite3_vfs *v, void *h, const char *s))(void) { (void)v; return realVfs->xDlSym(realVfs, h, s); }
static void gDlClose(sqlite3_vfs *v, void *h) { (void)v; realVfs->xDlClose(realVfs, h); }
static int gRandomness(sqlite3_vfs *v, int k, char *o) { (void)v; return realVfs->xRandomness(realVfs, k, o); }
static int gSleep(sqlite3_vfs *v, int us) { (void)v; return realVfs->xSleep(realVfs, us); }
static int gCurrentTime(sqlite3_vfs *v, double *o) { (void)v; return realVfs->xCurrentTime(realVfs, o); }
static int gGetLastError(sqlite3_vfs *v, int k, char *o) { (void)v; return realVfs->xGetLastError(realVfs, k, o); }
static int gCurrentTimeInt64(sqlite3_vfs *v, sqlite3_int64 *o) { (void)v; return realVfs->xCurrentTimeInt64(realVfs, o); }

static int registerOnce(void) {
  if (sqlite3_vfs_find("walcoalesce") != 0) return SQLITE_OK_LOAD_PERMANENTLY;
  realVfs = sqlite3_vfs_find(0);
  if (realVfs == 0 || realVfs == &gatherVfs || realVfs->iVersion < 2) return SQLITE_ERROR;
  gatherVfs.iVersion = 2;
  gatherVfs.szOsFile = (int)sizeof(GatherFile) + realVfs->szOsFile;
  gatherVfs.mxPathname = realVfs->mxPathname;
  gatherVfs.zName = "walcoalesce";
  gatherVfs.xOpen = gOpen;
  gatherVfs.xDelete = gDelete;
  gatherVfs.xAccess = gAccess;
  gatherVfs.xFullPathname = gFullPathname;
  gatherVfs.xDlOpen = gDlOpen;
  gatherVfs.xDlError = gDlError;
  gatherVfs.xDlSym = gDlSym;
  gatherVfs.xDlClose = gDlClose;
  gatherVfs.xRandomness = gRandomness;
  gatherVfs.xSleep = gSleep;
  gatherVfs.xCurrentTime = gCurrentTime;
  gatherVfs.xGetLastError = gGetLastError;
  gatherVfs.xCurrentTimeInt64 = gCurrentTimeInt64;
  if (sqlite3_vfs_register(&gatherVfs, 1) != SQLITE_OK) return SQLITE_ERROR;
  return SQLITE_OK_LOAD_PERMANENTLY;
}

/* Registers the VFS as the process's default (once; threads may load it together), and stays loaded. */
int sqlite3_walcoalesce_init(sqlite3 *db, char **err, const sqlite3_api_routines *api) {
  sqlite3_mutex *mutex;
  int rc;
  (void)db;
  (void)err;
  SQLITE_EXTENSION_INIT2(api);
  mutex = sqlite3_mutex_alloc(SQLITE_MUTEX_STATIC_APP1);
  sqlite3_mutex_enter(mutex);
  rc = registerOnce();
  sqlite3_mutex_leave(mutex);
  return rc;
}
