/*
** The persistent compile cache: an LMDB environment holding checksummed
** records under 16-byte keys, in a few tables.
**
** File layout: <dir>/cache.mdb and <dir>/cache.mdb-lock (MDB_NOSUBDIR,
** MDB_NOTLS, no WRITEMAP). The directory is created with mode 0700; one
** writable by other users, or owned by someone else, is refused.
**
** Record = 48-byte header {u32 magic "TNCR", u16 format version, u16 flags,
** u64 payload length, u64 XXH3-64 of the payload, u64 created, u64 last
** used, u64 hit count} + payload (little-endian, times in ns since the
** epoch). A record whose header or checksum is wrong is deleted and reads
** as a miss. Last-used times and hit counts from reads are batched in memory
** and written with the next write transaction (or tn_cache_flush), so reads
** never write.
**
** Size: the map starts at co_initial_map and doubles on MDB_MAP_FULL up to
** co_max_bytes, which the data file never exceeds. A put that would take
** the pages of the records past 7/8 of the limit first evicts least
** recently used records down to 6/8; the last eighth stays free for LMDB's
** own bookkeeping, so that an eviction can always run.
**
** Damage: LMDB keeps no page checksums, and a damaged B-tree page can make
** it read outside the file and crash the process. So, with co_verify, an
** existing file is first walked by a forked child (every table, every
** value's bounds, LMDB's free list); if the child dies, times out or finds
** damage, the parent never maps the file. A probe costs a fork, so a file
** that passed one, or that this library last wrote, is stamped
** (cache.mdb.verified: device, inode, size, mtime, ctime); an open whose
** file still matches its stamp skips the probe. That file, an environment LMDB
** rejects on open (MDB_INVALID, MDB_CORRUPTED, MDB_PANIC,
** MDB_VERSION_MISMATCH) and one with another format version of ours are
** moved aside as cache.mdb.corrupt-<time> and a fresh store is created;
** tn_cache_take_notice says so. Damage LMDB reports later (MDB_CORRUPTED,
** MDB_PAGE_NOTFOUND, MDB_PANIC) poisons the handle (TN_EPOISONED) and moves
** the file aside when the handle is closed. Not covered: another program
** writing garbage into the file while this process has it open.
**
** Files removed under an open handle: every operation first checks that the
** data file and LMDB's lock file at the path are still the ones the handle
** opened. A lock file removed (rm *-lock) would let the next process write
** beside this one with a lock table of its own; the handle is poisoned
** instead (TN_EPOISONED), and opening the path again uses the new files.
**
** Threads and processes: a handle may be used from any thread. Opening a
** path already open in this process returns the same handle (counted).
** After fork() the child's first call opens its own environment (the
** parent's is left untouched, as LMDB requires). Callers holding a
** Python GIL must release it around every call here.
*/
#ifndef TN_CACHE_H
#define TN_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "../tn_common.h"

#define TN_CACHE_FORMAT_VERSION 1
#define TN_CACHE_KEY_LEN 16
#define TN_CACHE_HEADER_LEN 48

/* Tables. */
#define TN_CACHE_ARTIFACTS 0  /* graph key -> lowered artifact */
#define TN_CACHE_TRACES    1  /* trace key -> guard set + graph key */
#define TN_CACHE__TABLES   2

typedef struct tn_cache tn_cache;

typedef struct tn_cache_options {
  uint64_t co_initial_map;  /* initial map size in bytes (0: 32 MiB) */
  uint64_t co_max_bytes;    /* size limit in bytes (0: 1 GiB) */
  int co_verify;            /* walk an existing file in a child process before use */
} tn_cache_options;

typedef struct tn_cache_info {
  uint64_t cs_entries;      /* records in all tables */
  uint64_t cs_bytes;        /* bytes of pages the tables use */
  uint64_t cs_map_bytes;    /* current map size */
  uint64_t cs_file_bytes;   /* size of the data file */
  uint64_t cs_max_bytes;    /* the configured limit */
  uint64_t cs_hits;         /* since open, in this process */
  uint64_t cs_misses;
  uint64_t cs_puts;
  uint64_t cs_evictions;
  uint64_t cs_corrupt;      /* records dropped for a bad header or checksum */
  uint64_t cs_map_grows;
  uint64_t cs_probes;       /* probes of the file this handle's opens ran (none when its stamp vouched) */
} tn_cache_info;

/* Opens (creating if needed) the cache in directory dir. On error *out is
** NULL and err holds a message naming the path: TN_EPERM (directory
** writable by others or not ours), TN_EIO (cannot create or open),
** TN_ESTORE (LMDB error), TN_ENOMEM, TN_EINVAL (bad options). */
int tn_cache_open(const char *dir, const tn_cache_options *opt, tn_cache **out,
                  char *err, size_t errlen);

/* Drops one reference; the last one flushes pending touches and closes the
** environment. NULL is fine. */
void tn_cache_close(tn_cache *c);

/* Looks key up in table. On a hit *val is a malloc'd copy of the payload
** (free() it) of *len bytes. TN_ENOTFOUND on a miss, including a record
** dropped as corrupt; TN_EPOISONED; TN_ESTORE; TN_ENOMEM. */
int tn_cache_get(tn_cache *c, int table, const uint8_t key[TN_CACHE_KEY_LEN],
                 void **val, size_t *len);

/* Stores (replacing) key -> val in table, growing the map or evicting as
** needed. TN_ETOOBIG when the record cannot fit under the limit, TN_EFULL
** when eviction could not make room, TN_EPOISONED, TN_ESTORE, TN_ENOMEM. */
int tn_cache_put(tn_cache *c, int table, const uint8_t key[TN_CACHE_KEY_LEN],
                 const void *val, size_t len);

/* Stores val under key in table, as tn_cache_put does, only if the payload
** stored there now is old (old_len bytes; NULL: only if there is none, a
** damaged record counting as none), compared in the write transaction: a
** read-modify-write that loses no concurrent writer's update. TN_ECHANGED
** when it is not (nothing stored, the handle stays usable: read again and
** retry); otherwise as tn_cache_put. */
int tn_cache_replace(tn_cache *c, int table, const uint8_t key[TN_CACHE_KEY_LEN],
                     const void *old, size_t old_len, const void *val, size_t len);

/* Deletes key from table; TN_ENOTFOUND if absent. */
int tn_cache_delete(tn_cache *c, int table, const uint8_t key[TN_CACHE_KEY_LEN]);

/* Deletes every record of every table. */
int tn_cache_clear(tn_cache *c);

/* Writes pending last-used times and hit counts. */
int tn_cache_flush(tn_cache *c);

/* Fills *st. */
int tn_cache_stats(tn_cache *c, tn_cache_info *st);

/* The record decoder: checks a record as the store holds it (header and
** payload, len bytes at rec; the layout above): magic, format version,
** payload length and checksum. Returns the payload length (the payload
** starts at rec + TN_CACHE_HEADER_LEN), or -1 for a record that reads as a
** miss (NULL rec included). Reads nothing outside [rec, rec + len). */
int64_t tn_cache_record_check(const void *rec, size_t len);

/* Path of the data file. */
const char *tn_cache_path(const tn_cache *c);

/* Message of the error that poisoned c, or of the last failed call; "" if
** none. Valid until the next call on c from any thread. */
const char *tn_cache_errmsg(tn_cache *c);

/* A one-time notice from open (e.g. a damaged file moved aside), or "".
** Reading it clears it. Copies it into buf (size len). */
void tn_cache_take_notice(tn_cache *c, char *buf, size_t len);

#endif /* TN_CACHE_H */
