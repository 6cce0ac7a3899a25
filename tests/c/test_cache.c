/*
** Check suite of csrc/cache: records, checksums, map growth, LRU eviction,
** damaged files, permissions, fork and concurrent writers.
*/
#include <dirent.h>
#include <fcntl.h>
#include <lmdb.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache/cache.h"
#include "tn_check.h"

/* -- Fixtures ---------------------------------------------------------------- */

static char dir[256];

static void setup(void)
{
  snprintf(dir, sizeof dir, "/tmp/tn_cache_test.XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void)
{
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
}

static tn_cache *open_cache(uint64_t initial, uint64_t max)
{
  tn_cache_options opt = {initial, max, 1};
  tn_cache *c;
  char err[8192];
  int rc = tn_cache_open(dir, &opt, &c, err, sizeof err);
  ck_assert_msg(rc == TN_OK, "open: %d %s", rc, err);
  return c;
}

static void make_key(uint8_t key[16], uint32_t tag, uint32_t i)
{
  memset(key, 0, 16);
  memcpy(key, &tag, 4);
  memcpy(key + 4, &i, 4);
}

static void fill(uint8_t *buf, size_t n, uint32_t seed)
{
  for (size_t i = 0; i < n; i++)
    buf[i] = (uint8_t)(seed * 31 + i * 7);
}

static int has(tn_cache *c, uint32_t tag, uint32_t i)
{
  uint8_t key[16];
  void *v;
  size_t len;
  make_key(key, tag, i);
  int rc = tn_cache_get(c, TN_CACHE_ARTIFACTS, key, &v, &len);
  ck_assert_msg(rc == TN_OK || rc == TN_ENOTFOUND, "get rc %d: %s", rc, tn_cache_errmsg(c));
  free(v);
  return rc == TN_OK;
}

static void put_n(tn_cache *c, uint32_t tag, uint32_t i, size_t n)
{
  uint8_t key[16], *buf = malloc(n);
  make_key(key, tag, i);
  fill(buf, n, i);
  int rc = tn_cache_put(c, TN_CACHE_ARTIFACTS, key, buf, n);
  ck_assert_msg(rc == TN_OK, "put %u/%u: %d %s", tag, i, rc, tn_cache_errmsg(c));
  free(buf);
}

static char *data_path(void)
{
  static char p[300];
  snprintf(p, sizeof p, "%s/cache.mdb", dir);
  return p;
}

static int count_corrupt_files(void)
{
  DIR *d = opendir(dir);
  struct dirent *e;
  int n = 0;
  while (d && (e = readdir(d)))
    n += strstr(e->d_name, "cache.mdb.corrupt-") != NULL;
  if (d)
    closedir(d);
  return n;
}

/* -- Records ------------------------------------------------------------------ */

START_TEST(test_put_get_round_trip)
{
  tn_cache *c = open_cache(0, 0);
  uint8_t key[16], big[100000];
  void *v;
  size_t len;
  fill(big, sizeof big, 3);
  make_key(key, 1, 1);
  ck_assert_int_eq(tn_cache_get(c, TN_CACHE_ARTIFACTS, key, &v, &len), TN_ENOTFOUND);
  ck_assert_int_eq(tn_cache_put(c, TN_CACHE_ARTIFACTS, key, big, sizeof big), TN_OK);
  ck_assert_int_eq(tn_cache_get(c, TN_CACHE_ARTIFACTS, key, &v, &len), TN_OK);
  ck_assert_uint_eq(len, sizeof big);
  ck_assert_mem_eq(v, big, sizeof big);
  free(v);
  /* tables are separate; empty payloads are fine */
  ck_assert_int_eq(tn_cache_get(c, TN_CACHE_TRACES, key, &v, &len), TN_ENOTFOUND);
  ck_assert_int_eq(tn_cache_put(c, TN_CACHE_TRACES, key, NULL, 0), TN_OK);
  ck_assert_int_eq(tn_cache_get(c, TN_CACHE_TRACES, key, &v, &len), TN_OK);
  ck_assert_uint_eq(len, 0);
  free(v);
  tn_cache_info st;
  ck_assert_int_eq(tn_cache_stats(c, &st), TN_OK);
  ck_assert_uint_eq(st.cs_entries, 2);
  ck_assert_uint_eq(st.cs_hits, 2);
  ck_assert_uint_eq(st.cs_misses, 2);
  ck_assert_uint_eq(st.cs_puts, 2);
  ck_assert_uint_gt(st.cs_bytes, sizeof big);
  ck_assert_int_eq(tn_cache_delete(c, TN_CACHE_TRACES, key), TN_OK);
  ck_assert_int_eq(tn_cache_delete(c, TN_CACHE_TRACES, key), TN_ENOTFOUND);
  ck_assert_int_eq(tn_cache_clear(c), TN_OK);
  ck_assert_int_eq(tn_cache_stats(c, &st), TN_OK);
  ck_assert_uint_eq(st.cs_entries, 0);
  ck_assert_int_eq(tn_cache_put(c, 7, key, big, 1), TN_EINVAL);
  tn_cache_close(c);
}
END_TEST

START_TEST(test_persists_and_directory_mode)
{
  struct stat st;
  char sub[300];
  snprintf(sub, sizeof sub, "%s/a/b", dir);
  tn_cache_options opt = {0, 0, 1};
  tn_cache *c;
  char err[8192];
  ck_assert_int_eq(tn_cache_open(sub, &opt, &c, err, sizeof err), TN_OK);
  ck_assert_int_eq(stat(sub, &st), 0);
  ck_assert_int_eq(st.st_mode & 0777, 0700);
  uint8_t key[16];
  make_key(key, 2, 2);
  ck_assert_int_eq(tn_cache_put(c, TN_CACHE_ARTIFACTS, key, "abc", 3), TN_OK);
  tn_cache_close(c);
  ck_assert_int_eq(tn_cache_open(sub, &opt, &c, err, sizeof err), TN_OK);
  void *v;
  size_t len;
  ck_assert_int_eq(tn_cache_get(c, TN_CACHE_ARTIFACTS, key, &v, &len), TN_OK);
  ck_assert_mem_eq(v, "abc", 3);
  free(v);
  tn_cache_close(c);
}
END_TEST

START_TEST(test_refuses_group_writable_directory)
{
  tn_cache_options opt = {0, 0, 1};
  tn_cache *c;
  char err[8192];
  ck_assert_int_eq(chmod(dir, 0777), 0);
  ck_assert_int_eq(tn_cache_open(dir, &opt, &c, err, sizeof err), TN_EPERM);
  ck_assert_ptr_null(c);
  ck_assert_ptr_nonnull(strstr(err, "writable by other users"));
  ck_assert_ptr_nonnull(strstr(err, dir));
  ck_assert_ptr_nonnull(strstr(err, "chmod 700"));
  ck_assert_int_eq(chmod(dir, 01777), 0); /* sticky, as /tmp: its mode as ls shows it */
  ck_assert_int_eq(tn_cache_open(dir, &opt, &c, err, sizeof err), TN_EPERM);
  ck_assert_ptr_nonnull(strstr(err, "mode 1777"));
  ck_assert_int_eq(chmod(dir, 0700), 0);
  ck_assert_int_eq(tn_cache_open(dir, &opt, &c, err, sizeof err), TN_OK);
  tn_cache_close(c);
}
END_TEST

/* A directory where LMDB's lock file goes: the words named the data file, which was fine ("cannot open cache
** .../cache.mdb: Is a directory"). They name the lock file's path. */
START_TEST(test_a_directory_at_the_lock_files_path_is_named)
{
  tn_cache_options opt = {0, 0, 1};
  tn_cache *c;
  char err[8192], lock[300];
  snprintf(lock, sizeof lock, "%s/cache.mdb-lock", dir);
  ck_assert_int_eq(mkdir(lock, 0700), 0);
  ck_assert_int_ne(tn_cache_open(dir, &opt, &c, err, sizeof err), TN_OK);
  ck_assert_ptr_null(c);
  ck_assert_msg(strstr(err, lock) && strstr(err, "is a directory"), "%s", err);
  ck_assert_int_eq(rmdir(lock), 0);
  ck_assert_int_eq(tn_cache_open(dir, &opt, &c, err, sizeof err), TN_OK);
  tn_cache_close(c);
}
END_TEST

/* A directory of another user's: a chmod of ours cannot fix it, and the words advise none (root only: a
** test run by another user cannot give its directory away). */
START_TEST(test_refuses_another_users_directory_without_advising_chmod)
{
  if (geteuid() != 0)
    return;
  tn_cache_options opt = {0, 0, 1};
  tn_cache *c;
  char err[8192];
  ck_assert_int_eq(chown(dir, 65534, (gid_t)-1), 0);
  ck_assert_int_eq(tn_cache_open(dir, &opt, &c, err, sizeof err), TN_EPERM);
  ck_assert_ptr_null(c);
  ck_assert_ptr_nonnull(strstr(err, "owned by another user"));
  ck_assert_ptr_null(strstr(err, "chmod"));
  ck_assert_int_eq(chown(dir, 0, (gid_t)-1), 0);
}
END_TEST

START_TEST(test_same_path_shares_handle)
{
  tn_cache *a = open_cache(0, 0), *b = open_cache(0, 0);
  ck_assert_ptr_eq(a, b);
  put_n(a, 3, 1, 10);
  tn_cache_close(a);
  ck_assert(has(b, 3, 1)); /* still open: one reference left */
  tn_cache_close(b);
}
END_TEST

/* Flips one byte of a payload inside the data file: the checksum catches it,
** the record is dropped and reads as a miss. */
/* Flips a byte inside the first copy of payload (n bytes, at least 1200)
** in the closed store's data file. */
static void damage_payload(const uint8_t *payload, size_t n)
{
  int fd = open(data_path(), O_RDWR);
  ck_assert_int_ge(fd, 0);
  struct stat st;
  fstat(fd, &st);
  uint8_t *file = malloc((size_t)st.st_size);
  ck_assert_int_eq(pread(fd, file, (size_t)st.st_size, 0), st.st_size);
  uint8_t *hit = memmem(file, (size_t)st.st_size, payload, n < 200 ? n : 200);
  ck_assert_ptr_nonnull(hit);
  off_t at = (hit - file) + 1000;
  uint8_t b = file[at] ^ 0x5a;
  ck_assert_int_eq(pwrite(fd, &b, 1, at), 1);
  close(fd);
  free(file);
}

static void pattern_payload(uint8_t *payload, size_t n)
{
  static const char pattern[] = "TN-PAYLOAD-PATTERN-";
  for (size_t i = 0; i < n; i++)
    payload[i] = (uint8_t)pattern[i % (sizeof pattern - 1)];
}

START_TEST(test_corrupted_payload_detected)
{
  uint8_t payload[4000], key[16];
  pattern_payload(payload, sizeof payload);
  tn_cache *c = open_cache(0, 0);
  make_key(key, 4, 4);
  ck_assert_int_eq(tn_cache_put(c, TN_CACHE_ARTIFACTS, key, payload, sizeof payload), TN_OK);
  put_n(c, 4, 5, 100); /* a healthy neighbour */
  tn_cache_close(c);
  damage_payload(payload, sizeof payload);

  c = open_cache(0, 0);
  void *v;
  size_t len;
  ck_assert_int_eq(tn_cache_get(c, TN_CACHE_ARTIFACTS, key, &v, &len), TN_ENOTFOUND);
  ck_assert_int_eq(tn_cache_get(c, TN_CACHE_ARTIFACTS, key, &v, &len), TN_ENOTFOUND);
  tn_cache_info info;
  ck_assert_int_eq(tn_cache_stats(c, &info), TN_OK);
  ck_assert_uint_eq(info.cs_corrupt, 1);
  ck_assert_uint_eq(info.cs_entries, 1); /* dropped */
  ck_assert(has(c, 4, 5));
  tn_cache_close(c);
}
END_TEST

static char *get_text(tn_cache *c, const uint8_t key[16])
{
  void *v;
  size_t len;
  int rc = tn_cache_get(c, TN_CACHE_TRACES, key, &v, &len);
  ck_assert_msg(rc == TN_OK || rc == TN_ENOTFOUND, "get rc %d: %s", rc, tn_cache_errmsg(c));
  if (rc == TN_ENOTFOUND)
    return NULL;
  char *s = malloc(len + 1);
  memcpy(s, v, len);
  s[len] = 0;
  free(v);
  return s;
}

START_TEST(test_replace_stores_only_over_the_payload_read)
{
  tn_cache *c = open_cache(0, 0);
  uint8_t key[16];
  char *s;
  make_key(key, 5, 1);
  /* NULL old: only where there is none; "" is a record, not none */
  ck_assert_int_eq(tn_cache_replace(c, TN_CACHE_TRACES, key, NULL, 0, "", 0), TN_OK);
  ck_assert_int_eq(tn_cache_replace(c, TN_CACHE_TRACES, key, NULL, 0, "a", 1), TN_ECHANGED);
  ck_assert_int_eq(tn_cache_replace(c, TN_CACHE_TRACES, key, "", 0, "ab", 2), TN_OK);
  /* another payload, a longer one, a prefix: nothing stored, and the handle works on */
  ck_assert_int_eq(tn_cache_replace(c, TN_CACHE_TRACES, key, "ax", 2, "zz", 2), TN_ECHANGED);
  ck_assert_int_eq(tn_cache_replace(c, TN_CACHE_TRACES, key, "abc", 3, "zz", 2), TN_ECHANGED);
  ck_assert_int_eq(tn_cache_replace(c, TN_CACHE_TRACES, key, "a", 1, "zz", 2), TN_ECHANGED);
  ck_assert_str_eq(s = get_text(c, key), "ab");
  free(s);
  ck_assert_int_eq(tn_cache_replace(c, TN_CACHE_TRACES, key, "ab", 2, "abc", 3), TN_OK);
  ck_assert_str_eq(s = get_text(c, key), "abc");
  free(s);
  ck_assert_int_eq(tn_cache_replace(c, 9, key, NULL, 0, "a", 1), TN_EINVAL);
  ck_assert_int_eq(tn_cache_replace(c, TN_CACHE_TRACES, key, NULL, 3, "a", 1), TN_EINVAL);
  tn_cache_info st;
  ck_assert_int_eq(tn_cache_stats(c, &st), TN_OK);
  ck_assert_uint_eq(st.cs_puts, 3);

  /* a damaged record counts as none, as get() reads it */
  uint8_t payload[4000], key2[16];
  pattern_payload(payload, sizeof payload);
  make_key(key2, 5, 2);
  ck_assert_int_eq(tn_cache_put(c, TN_CACHE_TRACES, key2, payload, sizeof payload), TN_OK);
  tn_cache_close(c);
  damage_payload(payload, sizeof payload);
  c = open_cache(0, 0);
  ck_assert_int_eq(tn_cache_replace(c, TN_CACHE_TRACES, key2, payload, sizeof payload, "x", 1),
                   TN_ECHANGED);
  ck_assert_int_eq(tn_cache_replace(c, TN_CACHE_TRACES, key2, NULL, 0, "x", 1), TN_OK);
  ck_assert_str_eq(s = get_text(c, key2), "x");
  free(s);
  tn_cache_close(c);
}
END_TEST

/* -- Size management --------------------------------------------------------------- */

START_TEST(test_map_growth_many_puts)
{
  tn_cache *c = open_cache(256 << 10, 64 << 20);
  for (uint32_t i = 0; i < 5000; i++)
    put_n(c, 5, i, 1000);
  tn_cache_info st;
  ck_assert_int_eq(tn_cache_stats(c, &st), TN_OK);
  ck_assert_uint_eq(st.cs_entries, 5000);
  ck_assert_uint_gt(st.cs_map_grows, 0);
  ck_assert_uint_gt(st.cs_map_bytes, 256 << 10);
  ck_assert_uint_eq(st.cs_evictions, 0);
  for (uint32_t i = 0; i < 5000; i += 7) {
    uint8_t key[16], want[1000];
    void *v;
    size_t len;
    make_key(key, 5, i);
    fill(want, sizeof want, i);
    ck_assert_int_eq(tn_cache_get(c, TN_CACHE_ARTIFACTS, key, &v, &len), TN_OK);
    ck_assert_mem_eq(v, want, sizeof want);
    free(v);
  }
  tn_cache_close(c);
}
END_TEST

START_TEST(test_lru_eviction_at_limit)
{
  const uint64_t limit = 1 << 20;
  tn_cache *c = open_cache(256 << 10, limit);
  for (uint32_t i = 0; i < 100; i++)
    put_n(c, 6, i, 4000);
  for (uint32_t i = 0; i < 10; i++) /* recently used: must survive */
    ck_assert(has(c, 6, i));
  ck_assert_int_eq(tn_cache_flush(c), TN_OK);
  tn_cache_info st;
  uint32_t j = 0;
  do {
    put_n(c, 7, j++, 4000);
    ck_assert_int_eq(tn_cache_stats(c, &st), TN_OK);
  } while (st.cs_evictions == 0 && j < 1000);
  ck_assert_uint_gt(st.cs_evictions, 0);
  for (uint32_t i = 0; i < 10; i++)
    ck_assert_msg(has(c, 6, i), "recently used record %u was evicted", i);
  ck_assert_msg(!has(c, 6, 10), "least recently used record survived");
  for (uint32_t k = 0; k < j; k++)
    ck_assert_msg(has(c, 7, k), "new record %u lost", k);
  /* keep writing: the file stays bounded */
  for (uint32_t k = 0; k < 2000; k++)
    put_n(c, 8, k, 4000);
  ck_assert_int_eq(tn_cache_stats(c, &st), TN_OK);
  ck_assert_uint_le(st.cs_file_bytes, limit);
  ck_assert_uint_le(st.cs_map_bytes, limit);
  ck_assert(has(c, 8, 1999));
  uint8_t key[16];
  make_key(key, 9, 0);
  uint8_t *huge = calloc(1, limit / 4);
  ck_assert_int_eq(tn_cache_put(c, TN_CACHE_ARTIFACTS, key, huge, limit / 4), TN_ETOOBIG);
  free(huge);
  tn_cache_close(c);
}
END_TEST

/* -- Damaged environments ---------------------------------------------------------- */

static void damage_file(size_t keep_bytes, int garbage)
{
  if (garbage) {
    int fd = open(data_path(), O_WRONLY);
    ck_assert_int_ge(fd, 0);
    uint8_t junk[8192];
    for (size_t i = 0; i < sizeof junk; i++)
      junk[i] = (uint8_t)(i * 131 + 7);
    ck_assert_int_eq(pwrite(fd, junk, sizeof junk, 0), (ssize_t)sizeof junk);
    close(fd);
  } else {
    ck_assert_int_eq(truncate(data_path(), (off_t)keep_bytes), 0);
  }
}

static void check_moved_aside_and_fresh(void)
{
  tn_cache *c = open_cache(0, 0);
  char notice[8192];
  tn_cache_take_notice(c, notice, sizeof notice);
  ck_assert_msg(strstr(notice, "moved it aside") != NULL, "notice: '%s'", notice);
  tn_cache_take_notice(c, notice, sizeof notice);
  ck_assert_str_eq(notice, ""); /* once */
  ck_assert_int_eq(count_corrupt_files(), 1);
  ck_assert(!has(c, 10, 1));
  put_n(c, 10, 2, 50);
  ck_assert(has(c, 10, 2));
  tn_cache_close(c);
}

START_TEST(test_garbage_file_moved_aside)
{
  tn_cache *c = open_cache(0, 0);
  put_n(c, 10, 1, 50);
  tn_cache_close(c);
  damage_file(0, 1);
  check_moved_aside_and_fresh();
}
END_TEST

START_TEST(test_truncated_file_moved_aside)
{
  tn_cache *c = open_cache(0, 0);
  put_n(c, 10, 1, 50);
  tn_cache_close(c);
  damage_file(100, 0);
  check_moved_aside_and_fresh();
}
END_TEST

START_TEST(test_other_format_version_moved_aside)
{
  tn_cache *c = open_cache(0, 0);
  put_n(c, 10, 1, 50);
  tn_cache_close(c);
  /* rewrite our format marker as a future version, through LMDB itself */
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi meta;
  uint8_t v[4] = {99, 0, 0, 0};
  MDB_val k = {6, "format"}, val = {4, v};
  ck_assert_int_eq(mdb_env_create(&env), 0);
  ck_assert_int_eq(mdb_env_set_maxdbs(env, 8), 0);
  ck_assert_int_eq(mdb_env_open(env, data_path(), MDB_NOSUBDIR, 0600), 0);
  ck_assert_int_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
  ck_assert_int_eq(mdb_dbi_open(txn, "meta", 0, &meta), 0);
  ck_assert_int_eq(mdb_put(txn, meta, &k, &val, 0), 0);
  ck_assert_int_eq(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
  check_moved_aside_and_fresh();
}
END_TEST

/* LMDB has no page checksums: random bytes over any page of the file must
** cost cached data at most, never the process (the suite runs each test in
** a child, so a crash here is a test error). */
START_TEST(test_damaged_pages_never_crash)
{
  char orig[320];
  tn_cache *c = open_cache(0, 0);
  for (uint32_t i = 0; i < 300; i++)
    put_n(c, 12, i, 40 + i % 200);
  tn_cache_close(c);
  snprintf(orig, sizeof orig, "%s/original", dir);
  ck_assert_int_eq(rename(data_path(), orig), 0);
  struct stat st;
  ck_assert_int_eq(stat(orig, &st), 0);
  long pages = (long)(st.st_size / 4096);
  unsigned seed = 7;
  int moved = 0;
  for (long page = 2; page < pages; page++) {
    for (int round = 0; round < 3; round++) {
      char cmd[1024];
      snprintf(cmd, sizeof cmd, "rm -f '%s'/cache.mdb* && cp '%s' '%s'", dir, orig, data_path());
      ck_assert_int_eq(system(cmd), 0);
      int fd = open(data_path(), O_WRONLY);
      uint8_t junk[64];
      for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)rand_r(&seed);
      off_t at = page * 4096 + (round == 0 ? 0 : (off_t)(rand_r(&seed) % (4096 - 64)));
      ck_assert_int_eq(pwrite(fd, junk, sizeof junk, at), (ssize_t)sizeof junk);
      close(fd);
      c = open_cache(0, 0);
      uint8_t key[16];
      for (uint32_t i = 0; i < 300; i++) {
        void *v;
        size_t len;
        make_key(key, 12, i);
        int rc = tn_cache_get(c, TN_CACHE_ARTIFACTS, key, &v, &len);
        ck_assert_msg(rc == TN_OK || rc == TN_ENOTFOUND || rc == TN_ECORRUPT || rc == TN_EPOISONED,
                      "page %ld: get rc %d", page, rc);
        free(v);
      }
      make_key(key, 13, 0);
      int rc = tn_cache_put(c, TN_CACHE_ARTIFACTS, key, "x", 1);
      ck_assert_msg(rc == TN_OK || rc == TN_ECORRUPT || rc == TN_EPOISONED || rc == TN_EFULL,
                    "page %ld: put rc %d", page, rc);
      char notice[8192];
      tn_cache_take_notice(c, notice, sizeof notice);
      moved += notice[0] != 0;
      tn_cache_close(c);
    }
  }
  ck_assert_int_gt(moved, 0); /* some damage was caught by the probe */
}
END_TEST

/* Probes of the file the last open ran. */
static uint64_t probes_of(tn_cache *c)
{
  tn_cache_info st;
  ck_assert_int_eq(tn_cache_stats(c, &st), TN_OK);
  return st.cs_probes;
}

/* The probe's fork is skipped while the file is as this library last
** probed or wrote it (its stamp matches); any change from outside, even
** one that puts the mtime back, brings the probe back, and it still
** catches damage. */
START_TEST(test_probe_skipped_while_stamp_matches)
{
  char stamp[320];
  tn_cache *c = open_cache(0, 0);
  ck_assert_uint_eq(probes_of(c), 0); /* a new file: nothing to probe */
  for (uint32_t i = 0; i < 20; i++)
    put_n(c, 21, i, 100);
  tn_cache_close(c);
  snprintf(stamp, sizeof stamp, "%s.verified", data_path());
  ck_assert_int_eq(access(stamp, F_OK), 0);

  c = open_cache(0, 0); /* written by us last: the stamp vouches */
  ck_assert_uint_eq(probes_of(c), 0);
  ck_assert(has(c, 21, 7));
  tn_cache_close(c);

  struct timespec times[2] = {{1000000000, 0}, {1000000000, 0}}; /* another mtime */
  ck_assert_int_eq(utimensat(AT_FDCWD, data_path(), times, 0), 0);
  c = open_cache(0, 0);
  ck_assert_uint_eq(probes_of(c), 1);
  tn_cache_close(c);
  c = open_cache(0, 0); /* probed and sound: stamped again */
  ck_assert_uint_eq(probes_of(c), 0);
  tn_cache_close(c);

  ck_assert_int_eq(unlink(stamp), 0);
  c = open_cache(0, 0);
  ck_assert_uint_eq(probes_of(c), 1);
  tn_cache_close(c);

  /* damage with the stamped mtime put back: ctime still moves */
  struct stat st;
  ck_assert_int_eq(stat(data_path(), &st), 0);
  int fd = open(data_path(), O_WRONLY);
  uint8_t junk[8192];
  memset(junk, 0xA5, sizeof junk);
  ck_assert_int_eq(pwrite(fd, junk, sizeof junk, 0), (ssize_t)sizeof junk);
  close(fd);
  struct timespec back[2] = {st.st_atim, st.st_mtim};
  ck_assert_int_eq(utimensat(AT_FDCWD, data_path(), back, 0), 0);
  c = open_cache(0, 0);
  char notice[8192];
  tn_cache_take_notice(c, notice, sizeof notice);
  ck_assert_msg(strstr(notice, "moved it aside") != NULL, "notice: %s", notice);
  ck_assert(!has(c, 21, 7));
  tn_cache_close(c);
}
END_TEST

/* -- Processes -------------------------------------------------------------------- */

START_TEST(test_fork_child_reopens)
{
  tn_cache *c = open_cache(0, 0);
  put_n(c, 11, 1, 100);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    /* the child uses the inherited handle: it must open its own env */
    uint8_t key[16];
    void *v;
    size_t len;
    make_key(key, 11, 1);
    int ok = tn_cache_get(c, TN_CACHE_ARTIFACTS, key, &v, &len) == TN_OK && len == 100;
    make_key(key, 11, 2);
    ok = ok && tn_cache_put(c, TN_CACHE_ARTIFACTS, key, "child", 5) == TN_OK;
    tn_cache_close(c);
    _exit(ok ? 0 : 1);
  }
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ck_assert(has(c, 11, 2));
  put_n(c, 11, 3, 10); /* the parent's env is intact */
  ck_assert(has(c, 11, 3));
  tn_cache_close(c);
}
END_TEST

/* A handle whose lock file was removed (a cleanup script's rm *-lock) or
** whose data file was moved away is poisoned before it touches the store:
** a process opening the path afterwards would write beside it with a lock
** table of its own. Opening the path again joins the files now there. */
START_TEST(test_removed_lock_or_data_file_poisons_the_handle)
{
  char lock[320], aside[320];
  uint8_t key[16];
  void *v = NULL;
  size_t len;
  snprintf(lock, sizeof lock, "%s-lock", data_path());
  tn_cache *c = open_cache(0, 0);
  put_n(c, 12, 1, 100);
  ck_assert_int_eq(unlink(lock), 0);
  make_key(key, 12, 1);
  ck_assert_int_eq(tn_cache_get(c, TN_CACHE_ARTIFACTS, key, &v, &len), TN_EPOISONED);
  ck_assert_ptr_nonnull(strstr(tn_cache_errmsg(c), "its lock file was removed or replaced"));
  ck_assert_int_eq(tn_cache_put(c, TN_CACHE_ARTIFACTS, key, "x", 1), TN_EPOISONED);
  tn_cache_close(c);
  c = open_cache(0, 0); /* a new lock file; the record is intact */
  ck_assert(has(c, 12, 1));
  snprintf(aside, sizeof aside, "%s.moved", data_path());
  ck_assert_int_eq(rename(data_path(), aside), 0);
  ck_assert_int_eq(tn_cache_get(c, TN_CACHE_ARTIFACTS, key, &v, &len), TN_EPOISONED);
  ck_assert_ptr_nonnull(strstr(tn_cache_errmsg(c), "its data file was removed or replaced"));
  tn_cache_close(c);
  c = open_cache(0, 0); /* a fresh store at the path */
  ck_assert(!has(c, 12, 1));
  put_n(c, 12, 2, 10);
  ck_assert(has(c, 12, 2));
  tn_cache_close(c);
}
END_TEST

/* Runs work(c, p) in procs forked children at once, each with a handle of
** its own on the store; fails the test when one fails (what names their
** role in the message). */
static void run_children(int procs, int (*work)(tn_cache *c, int p), const char *what)
{
  pid_t pids[8];
  ck_assert_int_le(procs, 8);
  for (int p = 0; p < procs; p++) {
    pids[p] = fork();
    ck_assert_int_ge(pids[p], 0);
    if (pids[p] == 0) {
      tn_cache_options opt = {256 << 10, 64 << 20, 1};
      tn_cache *c;
      char err[8192];
      int ok = tn_cache_open(dir, &opt, &c, err, sizeof err) == TN_OK;
      if (!ok)
        fprintf(stderr, "%s %d open: %s\n", what, p, err);
      if (ok && !(ok = work(c, p)))
        fprintf(stderr, "%s %d: %s\n", what, p, tn_cache_errmsg(c));
      if (ok)
        tn_cache_close(c);
      _exit(ok ? 0 : 1);
    }
  }
  for (int p = 0; p < procs; p++) {
    int status;
    ck_assert_int_eq(waitpid(pids[p], &status, 0), pids[p]);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s %d failed", what, p);
  }
}

enum { WRITERS = 4, WRITES = 600 };

/* Writer p's records: keys (100 + p, i). */
static int write_records(tn_cache *c, int p)
{
  for (uint32_t i = 0; i < WRITES; i++) {
    uint8_t key[16], buf[700];
    make_key(key, 100 + (uint32_t)p, i);
    fill(buf, sizeof buf, i);
    if (tn_cache_put(c, TN_CACHE_ARTIFACTS, key, buf, sizeof buf) != TN_OK)
      return 0;
  }
  return 1;
}

START_TEST(test_concurrent_processes_no_loss)
{
  run_children(WRITERS, write_records, "writer");
  tn_cache *c = open_cache(0, 64 << 20);
  tn_cache_info st;
  ck_assert_int_eq(tn_cache_stats(c, &st), TN_OK);
  ck_assert_uint_eq(st.cs_entries, WRITERS * WRITES);
  for (int p = 0; p < WRITERS; p++)
    for (uint32_t i = 0; i < WRITES; i += 13)
      ck_assert(has(c, 100 + (uint32_t)p, i));
  tn_cache_close(c);
}
END_TEST

enum { COUNTERS = 4, INCREMENTS = 150 };

/* Adds INCREMENTS to the counter under key (6, 0): read, add one, replace,
** again where another counter came first. */
static int count_up(tn_cache *c, int p)
{
  (void)p;
  uint8_t key[16];
  make_key(key, 6, 0);
  for (int i = 0; i < INCREMENTS;) {
    void *v;
    size_t len;
    uint32_t n = 0;
    int rc = tn_cache_get(c, TN_CACHE_TRACES, key, &v, &len);
    if (rc != TN_OK && rc != TN_ENOTFOUND)
      return 0;
    if (rc == TN_OK) {
      int ok = len == sizeof n;
      memcpy(&n, v, ok ? sizeof n : 0);
      free(v);
      if (!ok)
        return 0;
    }
    uint32_t next = n + 1;
    int put = tn_cache_replace(c, TN_CACHE_TRACES, key, rc == TN_OK ? &n : NULL, rc == TN_OK ? sizeof n : 0,
                               &next, sizeof next);
    if (put != TN_OK && put != TN_ECHANGED)
      return 0;
    i += put == TN_OK;
  }
  return 1;
}

/* Read, add one, replace: processes counting at once lose no increment. */
START_TEST(test_replace_loses_no_concurrent_update)
{
  run_children(COUNTERS, count_up, "counter");
  tn_cache *c = open_cache(0, 64 << 20);
  uint8_t key[16];
  void *v;
  size_t len;
  uint32_t n;
  make_key(key, 6, 0);
  ck_assert_int_eq(tn_cache_get(c, TN_CACHE_TRACES, key, &v, &len), TN_OK);
  ck_assert_uint_eq(len, sizeof n);
  memcpy(&n, v, sizeof n);
  free(v);
  ck_assert_uint_eq(n, COUNTERS * INCREMENTS);
  tn_cache_close(c);
}
END_TEST

START_TEST(test_malloc_not_overridden)
{
  ck_assert(tn_malloc_is_libc());
}
END_TEST

static Suite *cache_suite(void)
{
  Suite *s = suite_create("cache");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_put_get_round_trip);
  tcase_add_test(tc, test_persists_and_directory_mode);
  tcase_add_test(tc, test_refuses_group_writable_directory);
  tcase_add_test(tc, test_refuses_another_users_directory_without_advising_chmod);
  tcase_add_test(tc, test_a_directory_at_the_lock_files_path_is_named);
  tcase_add_test(tc, test_same_path_shares_handle);
  tcase_add_test(tc, test_corrupted_payload_detected);
  tcase_add_test(tc, test_replace_stores_only_over_the_payload_read);
  tcase_add_test(tc, test_map_growth_many_puts);
  tcase_add_test(tc, test_lru_eviction_at_limit);
  tcase_add_test(tc, test_garbage_file_moved_aside);
  tcase_add_test(tc, test_truncated_file_moved_aside);
  tcase_add_test(tc, test_other_format_version_moved_aside);
  tcase_add_test(tc, test_damaged_pages_never_crash);
  tcase_add_test(tc, test_probe_skipped_while_stamp_matches);
  tcase_add_test(tc, test_fork_child_reopens);
  tcase_add_test(tc, test_removed_lock_or_data_file_poisons_the_handle);
  tcase_add_test(tc, test_concurrent_processes_no_loss);
  tcase_add_test(tc, test_replace_loses_no_concurrent_update);
  tcase_add_test(tc, test_malloc_not_overridden);
  suite_add_tcase(s, tc);
  return s;
}

int main(void)
{
  return tn_check_run(cache_suite());
}
