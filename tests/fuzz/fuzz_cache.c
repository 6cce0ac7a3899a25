/*
** libFuzzer target: the cache record decoder (tn_cache_record_check) and
** the store's handling of whatever bytes it finds under a key.
**
** Input: one flags byte, then the bytes of a stored record.
**   bit 0      repair: give the record a valid magic, version, length and
**              checksum first, so the fuzzer explores valid records too
**              (times, hit counts, payloads of any size)
**   bit 1      table (artifacts or traces)
**   bits 2-3   which of four keys the record lies under
**   bit 4      store: write the record raw into a real store (as damage or
**              an older writer would leave it) and go through the cache's
**              API: get, a second put that may evict, flush, stats
**   bits 5-7   size of that second record (0 to 192 KiB, past 1/8 of the
**              1 MiB limit at the top)
**
** The decoder accepts a record exactly when its header is whole, its magic,
** version and length are right and its checksum matches the payload; the
** store returns an accepted record's payload byte for byte, and reads any
** other as a miss and deletes it — never a crash, never a wrong payload.
**
** Built and run by `make fuzz-c` (tests/fuzz/README.md).
*/
#include <errno.h>
#include <ftw.h>
#include <lmdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "cache/cache.h"

#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "fuzz_cache: %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                        \
      fputc('\n', stderr);                                                 \
      abort();                                                             \
    }                                                                      \
  } while (0)

#define LIMIT (1u << 20)

static char dir[256];
static char path[300];
static const char *const tables[2] = {"artifacts", "traces"};

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(p);
}

static void rm_dir(void)
{
  nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
  (void)argc;
  (void)argv;
  const char *base = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/tn_fuzz_cache.XXXXXX", base && base[0] ? base : "/tmp");
  CHECK(mkdtemp(dir) != NULL, "mkdtemp %s: %s", dir, strerror(errno));
  snprintf(path, sizeof path, "%s/cache.mdb", dir);
  atexit(rm_dir);
  return 0;
}

static uint64_t le(const uint8_t *p, int n)
{
  uint64_t v = 0;
  for (int i = 0; i < n; i++)
    v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
  for (int i = 0; i < n; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

/* What the header says, read here independently of the decoder. */
static int header_valid(const uint8_t *rec, size_t n)
{
  return n >= TN_CACHE_HEADER_LEN && memcmp(rec, "TNCR", 4) == 0 &&
         le(rec + 4, 2) == TN_CACHE_FORMAT_VERSION && le(rec + 8, 8) == n - TN_CACHE_HEADER_LEN &&
         le(rec + 16, 8) == XXH3_64bits(rec + TN_CACHE_HEADER_LEN, n - TN_CACHE_HEADER_LEN);
}

static void make_key(uint8_t key[TN_CACHE_KEY_LEN], int slot)
{
  memset(key, 0xA0 + slot, TN_CACHE_KEY_LEN);
}

/* Writes rec under key in table straight through LMDB, as the cache's file
** would hold it after damage. The cache must not be open meanwhile (LMDB
** forbids two environments on one file in a process). */
static void raw_put(int table, const uint8_t *key, const uint8_t *rec, size_t n)
{
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi dbi;
  CHECK(mdb_env_create(&env) == 0, "env");
  mdb_env_set_maxdbs(env, 4);
  mdb_env_set_mapsize(env, LIMIT);
  int mrc = mdb_env_open(env, path, MDB_NOSUBDIR | MDB_NOTLS | MDB_NOSYNC, 0600);
  CHECK(mrc == 0, "raw open %s: %s", path, mdb_strerror(mrc));
  CHECK(mdb_txn_begin(env, NULL, 0, &txn) == 0, "raw txn");
  CHECK(mdb_dbi_open(txn, tables[table], MDB_CREATE, &dbi) == 0, "raw dbi");
  MDB_val k = {TN_CACHE_KEY_LEN, (void *)key}, v = {n, (void *)rec};
  mrc = mdb_put(txn, dbi, &k, &v, 0);
  if (mrc == MDB_MAP_FULL) { /* the store is full of earlier records: start again */
    mdb_txn_abort(txn);
    mdb_env_close(env);
    rm_dir();
    CHECK(mkdir(dir, 0700) == 0, "mkdir %s: %s", dir, strerror(errno));
    raw_put(table, key, rec, n);
    return;
  }
  CHECK(mrc == 0, "raw put: %s", mdb_strerror(mrc));
  CHECK(mdb_txn_commit(txn) == 0, "raw commit");
  mdb_env_close(env);
}

static void through_store(int table, int slot, const uint8_t *rec, size_t n, int64_t plen, size_t second)
{
  uint8_t key[TN_CACHE_KEY_LEN], key2[TN_CACHE_KEY_LEN];
  char err[TN_ERRMSG_LEN];
  tn_cache *c = NULL;
  tn_cache_options opt = {64u << 10, LIMIT, 0};
  void *val = NULL;
  size_t len = 0;

  make_key(key, slot);
  raw_put(table, key, rec, n);
  int rc = tn_cache_open(dir, &opt, &c, err, sizeof err);
  CHECK(rc == TN_OK, "open: %s", err);
  tn_cache_info before, after;
  CHECK(tn_cache_stats(c, &before) == TN_OK, "stats");

  rc = tn_cache_get(c, table, key, &val, &len);
  if (plen >= 0) {
    CHECK(rc == TN_OK, "a valid record reads as %s", tn_strerror(rc));
    CHECK(len == (size_t)plen && (len == 0 || memcmp(val, rec + TN_CACHE_HEADER_LEN, len) == 0),
          "the payload differs");
  } else {
    CHECK(rc == TN_ENOTFOUND, "a damaged record reads as %s", tn_strerror(rc));
    CHECK(val == NULL && len == 0, "a miss returned a value");
    CHECK(tn_cache_stats(c, &after) == TN_OK && after.cs_corrupt == before.cs_corrupt + 1,
          "a damaged record is not counted");
    CHECK(tn_cache_get(c, table, key, &val, &len) == TN_ENOTFOUND, "a damaged record was kept");
  }
  free(val);
  val = NULL;

  /* a second record, maybe big enough to evict (which reads every record's header) */
  uint8_t *big = calloc(second ? second : 1, 1);
  CHECK(big != NULL, "calloc");
  for (size_t i = 0; i < second; i++)
    big[i] = (uint8_t)(i * 131 + slot);
  make_key(key2, (slot + 1) & 3);
  rc = tn_cache_put(c, table ^ 1, key2, big, second);
  if (second > LIMIT / 8) {
    CHECK(rc == TN_ETOOBIG, "an oversized put gave %s", tn_strerror(rc));
  } else {
    CHECK(rc == TN_OK, "put of %zu bytes: %s (%s)", second, tn_strerror(rc), tn_cache_errmsg(c));
    CHECK(tn_cache_get(c, table ^ 1, key2, &val, &len) == TN_OK, "the record just put is gone");
    CHECK(len == second && (len == 0 || memcmp(val, big, len) == 0), "the record just put differs");
    free(val);
  }
  free(big);
  CHECK(tn_cache_flush(c) == TN_OK, "flush: %s", tn_cache_errmsg(c));
  CHECK(tn_cache_stats(c, &after) == TN_OK, "stats");
  CHECK(after.cs_file_bytes <= LIMIT, "the file grew past the limit");
  tn_cache_close(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size < 1)
    return 0;
  int flags = data[0];
  size_t n = size - 1;
  uint8_t *rec = malloc(n ? n : 1); /* exactly n bytes: an overread is ASan's to see */
  CHECK(rec != NULL, "malloc");
  memcpy(rec, data + 1, n);
  if ((flags & 1) && n >= TN_CACHE_HEADER_LEN) {
    memcpy(rec, "TNCR", 4);
    put_le(rec + 4, TN_CACHE_FORMAT_VERSION, 2);
    put_le(rec + 8, n - TN_CACHE_HEADER_LEN, 8);
    put_le(rec + 16, XXH3_64bits(rec + TN_CACHE_HEADER_LEN, n - TN_CACHE_HEADER_LEN), 8);
  }

  int64_t plen = tn_cache_record_check(rec, n);
  int valid = header_valid(rec, n);
  CHECK((plen >= 0) == valid, "decoder says %lld, the header says %s", (long long)plen,
        valid ? "valid" : "invalid");
  CHECK(plen < 0 || (size_t)plen == n - TN_CACHE_HEADER_LEN, "payload length %lld of %zu", (long long)plen, n);
  CHECK(!((flags & 1) && n >= TN_CACHE_HEADER_LEN) || plen >= 0, "a repaired record is refused");
  CHECK(tn_cache_record_check(NULL, n) == -1, "NULL accepted");

  if ((flags & 16) && n <= LIMIT / 8) {
    static const size_t seconds[8] = {0, 1, 1000, 16384, 40000, 65536, 100000, 196608};
    through_store((flags >> 1) & 1, (flags >> 2) & 3, rec, n, plen, seconds[flags >> 5]);
  }
  free(rec);
  return 0;
}
