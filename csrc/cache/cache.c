/*
** The persistent compile cache on LMDB (see cache.h for the contract).
*/
#include "cache.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define REC_MAGIC 0x52434e54u       /* "TNCR" read as little-endian u32 */
#define MAX_TOUCHES 64              /* batched last-used updates */
#define MAX_WRITE_ATTEMPTS 32
#define MAX_EVICTIONS_PER_WRITE 8
/* A put that takes the records past SOFT_NUM/8 of the limit first evicts
** them down to LOW_NUM/8: the rest of the map stays free for LMDB's own
** bookkeeping (free lists, copy-on-write pages of the eviction itself). */
#define SOFT_NUM 7
#define LOW_NUM 6
/* put_fn's "over the soft limit" (outside LMDB's and errno's ranges) */
#define CACHE_OVER_SOFT (-31999)
/* put_fn's "the record is not the one the caller read" (tn_cache_replace) */
#define CACHE_CHANGED (-31998)
#define MIN_MAP_BYTES (256u << 10)
#define DEFAULT_INITIAL_MAP (UINT64_C(32) << 20)
#define DEFAULT_MAX_BYTES (UINT64_C(1) << 30)

static const char *const table_names[TN_CACHE__TABLES] = {"artifacts", "traces"};

typedef struct cache_touch {
  int ct_table;
  uint8_t ct_key[TN_CACHE_KEY_LEN];
  uint64_t ct_time;
  uint64_t ct_hits;
} cache_touch;

struct tn_cache {
  char ca_path[PATH_MAX + 32];     /* <dir>/cache.mdb */
  pid_t ca_pid;                    /* process that opened ca_env */
  int ca_refs;                     /* registry_mu */
  struct tn_cache *ca_next;        /* registry_mu */
  uint64_t ca_initial, ca_max;
  int ca_verify;                   /* probe the file in a child before opening */
  pthread_rwlock_t ca_lock;        /* shared: any txn; exclusive: env swap, map resize */
  MDB_env *ca_env;
  MDB_dbi ca_dbi[TN_CACHE__TABLES];
  MDB_dbi ca_meta;
  int ca_reopen;                   /* set in a forked child: open a new env */
  dev_t ca_data_dev, ca_lock_dev;  /* the data and lock files env_open opened: */
  ino_t ca_data_ino, ca_lock_ino;  /* files_check compares the paths with them */
  pthread_mutex_t ca_mu;           /* the fields below */
  int ca_rc;                       /* non-zero: poisoned */
  int ca_quarantine;               /* move the file aside on close */
  char ca_err[3 * PATH_MAX];
  char ca_notice[3 * PATH_MAX];
  cache_touch ca_touch[MAX_TOUCHES];
  int ca_ntouch;
  uint64_t ca_last_time;
  /* statistics (atomics) */
  uint64_t ca_hits, ca_misses, ca_puts, ca_evictions, ca_corrupt, ca_grows, ca_probes;
};

/* -- Registry of open handles, fork handling ------------------------------- */

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static tn_cache *registry_head;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* Set while this thread holds registry_mu: tn_cache_open forks its probe
** with the lock held, and the handlers must not take it a second time. */
static _Thread_local int registry_held;

static void registry_lock(void)
{
  pthread_mutex_lock(&registry_mu);
  registry_held = 1;
}

static void registry_unlock(void)
{
  registry_held = 0;
  pthread_mutex_unlock(&registry_mu);
}

static void atfork_prepare(void)
{
  if (!registry_held)
    pthread_mutex_lock(&registry_mu);
}

static void atfork_parent(void)
{
  if (!registry_held)
    pthread_mutex_unlock(&registry_mu);
}

/* In the child (single-threaded here): every handle gets fresh locks and is
** marked to open its own environment; the parent's is never touched. */
static void atfork_child(void)
{
  pthread_mutex_init(&registry_mu, NULL);
  registry_held = 0;
  for (tn_cache *c = registry_head; c; c = c->ca_next) {
    pthread_rwlock_init(&c->ca_lock, NULL);
    pthread_mutex_init(&c->ca_mu, NULL);
    c->ca_env = NULL;
    c->ca_reopen = 1;
    c->ca_ntouch = 0;
    c->ca_hits = c->ca_misses = c->ca_puts = c->ca_evictions = c->ca_corrupt = c->ca_grows = c->ca_probes = 0;
  }
}

static void atfork_register(void)
{
  pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* -- Small helpers ---------------------------------------------------------- */

#define STAT_ADD(c, field, n) __atomic_add_fetch(&(c)->field, (n), __ATOMIC_RELAXED)
#define STAT_GET(c, field) __atomic_load_n(&(c)->field, __ATOMIC_RELAXED)

static void put_le(uint8_t *p, uint64_t v, int n)
{
  for (int i = 0; i < n; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n)
{
  uint64_t v = 0;
  for (int i = 0; i < n; i++)
    v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* Header field offsets. */
#define H_MAGIC 0
#define H_VERSION 4
#define H_FLAGS 6
#define H_LEN 8
#define H_SUM 16
#define H_CREATED 24
#define H_USED 32
#define H_HITS 40

static uint64_t now_ns(tn_cache *c)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t t = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  /* strictly increasing within the process, so LRU order is total */
  pthread_mutex_lock(&c->ca_mu);
  if (t <= c->ca_last_time)
    t = c->ca_last_time + 1;
  c->ca_last_time = t;
  pthread_mutex_unlock(&c->ca_mu);
  return t;
}

static void cache_set_err(tn_cache *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void cache_set_err(tn_cache *c, const char *fmt, ...)
{
  va_list ap;
  pthread_mutex_lock(&c->ca_mu);
  va_start(ap, fmt);
  vsnprintf(c->ca_err, sizeof c->ca_err, fmt, ap);
  va_end(ap);
  pthread_mutex_unlock(&c->ca_mu);
}

static int mdb_is_damage(int mrc)
{
  return mrc == MDB_CORRUPTED || mrc == MDB_PAGE_NOTFOUND || mrc == MDB_PANIC ||
         mrc == MDB_INVALID || mrc == MDB_VERSION_MISMATCH;
}

/* Turns an LMDB (or errno) failure of operation what into our code. Damage
** poisons the handle and schedules the file to be moved aside. */
static int cache_mdb_fail(tn_cache *c, int mrc, const char *what)
{
  if (mrc == ENOMEM) {
    cache_set_err(c, "cache %s: out of memory during %s", c->ca_path, what);
    return TN_ENOMEM;
  }
  if (mdb_is_damage(mrc)) {
    pthread_mutex_lock(&c->ca_mu);
    if (c->ca_rc == TN_OK) {
      c->ca_rc = TN_ECORRUPT;
      c->ca_quarantine = 1;
      snprintf(c->ca_err, sizeof c->ca_err,
               "cache %s is damaged (%s during %s); it is disabled and will be moved aside when closed",
               c->ca_path, mdb_strerror(mrc), what);
    }
    pthread_mutex_unlock(&c->ca_mu);
    return TN_ECORRUPT;
  }
  cache_set_err(c, "cache %s: %s during %s", c->ca_path, mdb_strerror(mrc), what);
  return TN_ESTORE;
}

/* Moves the data file aside (cache.mdb.corrupt-<time>) and removes the lock
** file. Writes what happened into c->ca_notice. */
static void cache_quarantine(tn_cache *c, const char *why)
{
  char aside[sizeof c->ca_path + 48], lock[sizeof c->ca_path + 8];
  time_t t = time(NULL);
  int n = 0;
  do {
    snprintf(aside, sizeof aside, "%s.corrupt-%lld%s%.0d", c->ca_path, (long long)t,
             n ? "-" : "", n);
    n++;
  } while (access(aside, F_OK) == 0 && n < 1000);
  snprintf(lock, sizeof lock, "%s-lock", c->ca_path);
  if (rename(c->ca_path, aside) == 0) {
    unlink(lock);
    snprintf(c->ca_notice, sizeof c->ca_notice,
             "cache %s was damaged (%s); moved it aside to %s and started a fresh cache",
             c->ca_path, why, aside);
  } else {
    snprintf(c->ca_notice, sizeof c->ca_notice,
             "cache %s was damaged (%s) and could not be moved aside: %s",
             c->ca_path, why, strerror(errno));
  }
}

/* -- Value bounds and the crash-isolated probe ------------------------------- */

#define PROBE_SECONDS 20

/* Walks one database, touching both ends of every key and value: a node
** that points outside the file faults here, in the child, where the fault
** is the verdict. Returns 0 or an exit code. */
#define PROBE_FREELIST 0  /* LMDB's free-page table */
#define PROBE_MAIN 1      /* LMDB's table of table names */
#define PROBE_TABLE 2     /* one of ours */

static int probe_walk(MDB_env *env, MDB_txn *txn, MDB_dbi dbi, int kind)
{
  MDB_cursor *cur;
  MDB_val k, v;
  int mrc;
  volatile uint8_t sink = 0;
  MDB_envinfo info;
  mdb_env_info(env, &info);
  if (mdb_cursor_open(txn, dbi, &cur) != 0)
    return 3;
  for (int op = MDB_FIRST; (mrc = mdb_cursor_get(cur, &k, &v, (MDB_cursor_op)op)) == 0; op = MDB_NEXT) {
    if (k.mv_size)
      sink ^= ((const uint8_t *)k.mv_data)[0] ^ ((const uint8_t *)k.mv_data)[k.mv_size - 1];
    if (v.mv_size)
      sink ^= ((const uint8_t *)v.mv_data)[0] ^ ((const uint8_t *)v.mv_data)[v.mv_size - 1];
    /* a lookup walks the branch pages' keys, which the cursor never reads */
    MDB_val k2 = k, v2;
    if (kind == PROBE_TABLE && (mdb_get(txn, dbi, &k2, &v2) != 0 || v2.mv_data != v.mv_data))
      return 8;
    if (kind == PROBE_FREELIST) {
      /* a free-list record is a count followed by that many page numbers */
      const size_t *ids = v.mv_data;
      if (v.mv_size < sizeof(size_t) || v.mv_size != (ids[0] + 1) * sizeof(size_t))
        return 5;
      for (size_t i = 1; i <= ids[0]; i++)
        if (ids[i] > info.me_last_pgno)
          return 5;
    }
  }
  (void)sink;
  mdb_cursor_close(cur);
  return mrc == MDB_NOTFOUND ? 0 : 6;
}

/* The child's side of the probe: open read-only, walk the free list, the
** main table and every named table. Exits with 0 when all is well. */
static void probe_child(const char *path, uint64_t mapsize)
{
  MDB_env *env;
  MDB_txn *txn;
  MDB_cursor *cur;
  MDB_val k, v;
  int code = 0, mrc;

  int devnull = open("/dev/null", O_WRONLY);
  if (devnull >= 0)
    dup2(devnull, 2); /* LMDB's assertion text is not for the user: the exit status speaks */
  signal(SIGSEGV, SIG_DFL);
  signal(SIGBUS, SIG_DFL);
  alarm(PROBE_SECONDS); /* a damaged tree may hold a cycle */
  if (mdb_env_create(&env) || mdb_env_set_maxdbs(env, 16) || mdb_env_set_mapsize(env, (size_t)mapsize) ||
      mdb_env_open(env, path, MDB_NOSUBDIR | MDB_RDONLY | MDB_NOTLS, 0600) ||
      mdb_txn_begin(env, NULL, MDB_RDONLY, &txn))
    _exit(2);
  code = probe_walk(env, txn, 0, PROBE_FREELIST); /* FREE_DBI */
  if (!code)
    code = probe_walk(env, txn, 1, PROBE_MAIN); /* MAIN_DBI */
  if (!code && mdb_cursor_open(txn, 1, &cur) == 0) {
    for (int op = MDB_FIRST; !code && (mrc = mdb_cursor_get(cur, &k, &v, (MDB_cursor_op)op)) == 0;
         op = MDB_NEXT) {
      char name[64];
      MDB_dbi dbi;
      if (k.mv_size == 0 || k.mv_size >= sizeof name)
        continue;
      memcpy(name, k.mv_data, k.mv_size);
      name[k.mv_size] = 0;
      if (mdb_dbi_open(txn, name, 0, &dbi) != 0) {
        code = 7;
        break;
      }
      code = probe_walk(env, txn, dbi, PROBE_TABLE);
    }
  }
  _exit(code);
}

/* -- The verified stamp -------------------------------------------------------
** A probe is a fork, about 15 ms in a process that has PyTorch loaded. After
** a probe passes, and after each write of ours commits, <path>.verified
** records the data file's identity and times (device, inode, size, mtime,
** ctime); an open whose file still matches them skips the probe. Damage
** from outside changes them (ctime cannot be set back); a stale stamp only
** costs a probe. */

/* The stamp's text for path's file now; -1 if there is no file. */
static int stamp_text(const char *path, char *buf, size_t n)
{
  struct stat st;
  if (stat(path, &st) != 0)
    return -1;
  snprintf(buf, n, "%llu %llu %lld %lld.%09ld %lld.%09ld\n", (unsigned long long)st.st_dev,
           (unsigned long long)st.st_ino, (long long)st.st_size, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
           (long long)st.st_ctim.tv_sec, st.st_ctim.tv_nsec);
  return 0;
}

/* Whether path's stamp vouches for its file as it is now. */
static int stamp_matches(const char *path)
{
  char want[160], have[160], sp[PATH_MAX + 48];
  if (stamp_text(path, want, sizeof want) != 0)
    return 0;
  snprintf(sp, sizeof sp, "%s.verified", path);
  int fd = open(sp, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return 0;
  ssize_t r = read(fd, have, sizeof have - 1);
  close(fd);
  if (r <= 0)
    return 0;
  have[r] = 0;
  return strcmp(have, want) == 0;
}

/* Records path's file as it is now as sound (written whole, then renamed
** into place: a reader never sees half a stamp). */
static void stamp_write(const char *path)
{
  char text[160], sp[PATH_MAX + 48], tmp[PATH_MAX + 96];
  if (stamp_text(path, text, sizeof text) != 0)
    return;
  snprintf(sp, sizeof sp, "%s.verified", path);
  snprintf(tmp, sizeof tmp, "%s.%d.%lx", sp, (int)getpid(), (unsigned long)pthread_self());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    return;
  ssize_t n = write(fd, text, strlen(text));
  close(fd);
  if (n != (ssize_t)strlen(text) || rename(tmp, sp) != 0)
    unlink(tmp);
}

/* Runs probe_child on path in a forked child. Returns 1 if the file looks
** sound (or cannot be probed: no file, fork failed), 0 with a reason in why
** if the child found damage or died. A file that passes is stamped;
** *probed says whether a child ran. */
static int cache_probe(const char *path, uint64_t mapsize, char *why, size_t whylen, int *probed)
{
  struct stat st;
  int status;
  *probed = 0;
  if (stat(path, &st) != 0 || st.st_size == 0)
    return 1;
  if ((uint64_t)st.st_size > mapsize)
    mapsize = (uint64_t)st.st_size;
  pid_t pid = fork();
  if (pid < 0)
    return 1;
  if (pid == 0)
    probe_child(path, mapsize);
  *probed = 1;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR)
      return 1;
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    stamp_write(path);
    return 1;
  }
  if (WIFSIGNALED(status))
    snprintf(why, whylen, "reading it %s (signal %d)",
             WTERMSIG(status) == SIGALRM ? "did not finish" : "crashed a check process", WTERMSIG(status));
  else
    snprintf(why, whylen, "a check of its pages failed (code %d)", WEXITSTATUS(status));
  return 0;
}

/* -- Opening the environment ------------------------------------------------ */

/* Opens the tables and checks our format version in txn. MDB_INCOMPATIBLE
** stands for "another format version". */
static int env_open_tables(tn_cache *c, MDB_txn *txn, unsigned flags, int *missing)
{
  MDB_val k = {6, "format"}, v;
  int mrc = mdb_dbi_open(txn, "meta", flags, &c->ca_meta);
  for (int t = 0; mrc == 0 && t < TN_CACHE__TABLES; t++)
    mrc = mdb_dbi_open(txn, table_names[t], flags, &c->ca_dbi[t]);
  if (mrc == MDB_NOTFOUND) {
    *missing = 1;
    return 0;
  }
  if (mrc)
    return mrc;
  mrc = mdb_get(txn, c->ca_meta, &k, &v);
  if (mrc == MDB_NOTFOUND) {
    *missing = 1;
    return 0;
  }
  if (mrc)
    return mrc;
  if (v.mv_size != 4 || get_le(v.mv_data, 4) != TN_CACHE_FORMAT_VERSION)
    return MDB_INCOMPATIBLE;
  return 0;
}

/* mdb_txn_begin during open (nothing else uses env yet), adopting a map
** that other processes grew meanwhile. */
static int env_txn_begin(MDB_env *env, unsigned flags, MDB_txn **txn)
{
  int mrc;
  for (int i = 0; i < 8; i++) {
    mrc = mdb_txn_begin(env, NULL, flags, txn);
    if (mrc != MDB_MAP_RESIZED)
      return mrc;
    if ((mrc = mdb_env_set_mapsize(env, 0)) != 0)
      return mrc;
  }
  return mrc;
}

static int env_open_once(tn_cache *c, char *why, size_t whylen)
{
  MDB_env *env = NULL;
  MDB_txn *txn = NULL;
  int missing = 0, dead;
  int mrc = mdb_env_create(&env);
  if (mrc == 0)
    mrc = mdb_env_set_maxdbs(env, 8);
  if (mrc == 0)
    mrc = mdb_env_set_mapsize(env, c->ca_initial);
  if (mrc == 0)
    mrc = mdb_env_open(env, c->ca_path, MDB_NOSUBDIR | MDB_NOTLS, 0600);
  if (mrc == 0)
    mrc = mdb_reader_check(env, &dead);
  c->ca_env = env;
  if (mrc == 0)
    mrc = env_txn_begin(env, MDB_RDONLY, &txn);
  if (mrc == 0) {
    mrc = env_open_tables(c, txn, 0, &missing);
    if (mrc == 0)
      mrc = mdb_txn_commit(txn); /* keeps the DBI handles */
    else
      mdb_txn_abort(txn);
    txn = NULL;
  }
  if (mrc == 0 && missing) {
    uint8_t ver[4];
    MDB_val k = {6, "format"}, v = {4, ver};
    put_le(ver, TN_CACHE_FORMAT_VERSION, 4);
    missing = 0;
    mrc = env_txn_begin(env, 0, &txn);
    if (mrc == 0)
      mrc = env_open_tables(c, txn, MDB_CREATE, &missing);
    if (mrc == 0 && missing)
      mrc = mdb_put(txn, c->ca_meta, &k, &v, 0);
    if (mrc == 0) {
      mrc = mdb_txn_commit(txn);
    } else if (txn) {
      mdb_txn_abort(txn);
    }
  }
  if (mrc != 0) {
    snprintf(why, whylen, "%s", mrc == MDB_INCOMPATIBLE ? "written by another cache format version"
                                                         : mdb_strerror(mrc));
    mdb_env_close(env);
    c->ca_env = NULL;
  }
  return mrc;
}

/* Notes the device and inode of the files c->ca_env has open (after env_open_once). */
static void files_note(tn_cache *c)
{
  struct stat st;
  char lock[sizeof c->ca_path + 8];
  int fd = -1;
  c->ca_data_ino = c->ca_lock_ino = 0;
  if (mdb_env_get_fd(c->ca_env, &fd) == 0 && fstat(fd, &st) == 0) {
    c->ca_data_dev = st.st_dev;
    c->ca_data_ino = st.st_ino;
  }
  snprintf(lock, sizeof lock, "%s-lock", c->ca_path);
  if (stat(lock, &st) == 0) {
    c->ca_lock_dev = st.st_dev;
    c->ca_lock_ino = st.st_ino;
  }
}

/* Whether the paths still name the files c->ca_env has open. LMDB's
** readers and writers meet in the lock file: a process that opens the store
** after the lock file was removed (a cleanup script's rm *-lock) makes a new
** one, and writes beside this process unseen, each reusing pages the other
** still reads. So a handle whose lock or data file is no longer at its path
** is poisoned (TN_EPOISONED, its error says why) before it touches the
** store again; closing it and opening the path again joins the new files. */
static int files_check(tn_cache *c)
{
  struct stat st;
  char lock[sizeof c->ca_path + 8];
  const char *gone = NULL;
  snprintf(lock, sizeof lock, "%s-lock", c->ca_path);
  if (c->ca_lock_ino && (stat(lock, &st) != 0 || st.st_dev != c->ca_lock_dev || st.st_ino != c->ca_lock_ino))
    gone = "its lock file";
  else if (c->ca_data_ino && (stat(c->ca_path, &st) != 0 || st.st_dev != c->ca_data_dev ||
                              st.st_ino != c->ca_data_ino))
    gone = "its data file";
  if (!gone)
    return TN_OK;
  pthread_mutex_lock(&c->ca_mu);
  if (c->ca_rc == TN_OK) {
    c->ca_rc = TN_ESTORE;
    snprintf(c->ca_err, sizeof c->ca_err,
             "cache %s: %s was removed or replaced while this process had it open; this handle no longer "
             "touches the store (open it again to use the files now at the path)", c->ca_path, gone);
  }
  pthread_mutex_unlock(&c->ca_mu);
  return TN_EPOISONED;
}

/* Opens c->ca_env (caller holds ca_lock exclusively or owns c alone),
** moving a damaged or foreign-format file aside once. */
static int env_open(tn_cache *c, char *err, size_t errlen)
{
  char why[200];
  int probed = 0;
  if (c->ca_verify && !stamp_matches(c->ca_path) && !cache_probe(c->ca_path, c->ca_initial, why, sizeof why, &probed))
    cache_quarantine(c, why);
  STAT_ADD(c, ca_probes, (uint64_t)probed);
  int mrc = env_open_once(c, why, sizeof why);
  if (mrc != 0 && (mdb_is_damage(mrc) || mrc == MDB_INCOMPATIBLE)) {
    cache_quarantine(c, why);
    mrc = env_open_once(c, why, sizeof why);
  }
  if (mrc != 0) {
    /* LMDB names neither file: a directory where its lock file goes (EISDIR) is named as what failed */
    struct stat st;
    char lock[sizeof c->ca_path + 8];
    snprintf(lock, sizeof lock, "%s-lock", c->ca_path);
    if (mrc == EISDIR && stat(lock, &st) == 0 && S_ISDIR(st.st_mode))
      snprintf(err, errlen, "cannot open cache %s: where its lock file goes, %s is a directory (remove it, or use "
               "another TORCHNEURON_CACHE_DIR)", c->ca_path, lock);
    else
      snprintf(err, errlen, "cannot open cache %s: %s", c->ca_path, why);
    return mrc == ENOMEM ? TN_ENOMEM : (mrc > 0 ? TN_EIO : TN_ESTORE);
  }
  files_note(c);
  c->ca_pid = getpid();
  c->ca_reopen = 0;
  return TN_OK;
}

static int mkdirs(const char *dir, char *err, size_t errlen)
{
  char tmp[PATH_MAX];
  size_t n = strlen(dir);
  if (n == 0 || n >= sizeof tmp) {
    snprintf(err, errlen, "cache directory '%s' is empty or too long", dir);
    return TN_EINVAL;
  }
  memcpy(tmp, dir, n + 1);
  for (char *p = tmp + 1; ; p++) {
    if (*p == '/' || *p == 0) {
      char saved = *p;
      *p = 0;
      if (mkdir(tmp, 0700) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot create cache directory %s: %s", tmp, strerror(errno));
        return TN_EIO;
      }
      *p = saved;
      if (saved == 0)
        break;
    }
  }
  return TN_OK;
}

/* -- Entering an operation ---------------------------------------------------- */

/* Takes ca_lock shared, (re)opening the environment in a forked child
** first. On TN_OK the caller holds ca_lock shared. */
static int cache_enter(tn_cache *c)
{
  for (;;) {
    pthread_rwlock_rdlock(&c->ca_lock);
    if (!c->ca_reopen && c->ca_pid == getpid()) {
      pthread_mutex_lock(&c->ca_mu);
      int rc = c->ca_rc;
      pthread_mutex_unlock(&c->ca_mu);
      if (rc == TN_OK && files_check(c) == TN_OK)
        return TN_OK;
      pthread_rwlock_unlock(&c->ca_lock);
      return TN_EPOISONED;
    }
    pthread_rwlock_unlock(&c->ca_lock);
    pthread_rwlock_wrlock(&c->ca_lock);
    if (c->ca_reopen || c->ca_pid != getpid()) {
      char err[TN_ERRMSG_LEN];
      c->ca_env = NULL; /* the parent's environment: never used or closed here */
      c->ca_ntouch = 0;
      int rc = env_open(c, err, sizeof err);
      if (rc != TN_OK) {
        pthread_mutex_lock(&c->ca_mu);
        c->ca_rc = rc;
        snprintf(c->ca_err, sizeof c->ca_err, "%s", err);
        pthread_mutex_unlock(&c->ca_mu);
        c->ca_pid = getpid();
        c->ca_reopen = 0;
      }
    }
    pthread_rwlock_unlock(&c->ca_lock);
  }
}

/* Sets the map to at least want bytes (0: adopt another process's size). */
static int cache_resize(tn_cache *c, uint64_t want)
{
  MDB_envinfo info;
  int mrc = 0;
  pthread_rwlock_wrlock(&c->ca_lock);
  if (c->ca_env && c->ca_pid == getpid()) {
    mdb_env_info(c->ca_env, &info);
    if (want == 0 || info.me_mapsize < want)
      mrc = mdb_env_set_mapsize(c->ca_env, (size_t)want);
  }
  pthread_rwlock_unlock(&c->ca_lock);
  if (mrc == 0 && want)
    STAT_ADD(c, ca_grows, 1);
  return mrc;
}

/* Enters c and begins a read-only transaction, adopting a map another
** process grew. On TN_OK the caller holds ca_lock shared and *mrc is
** mdb_txn_begin's result (*txn is usable only when it is 0). */
static int cache_read_begin(tn_cache *c, MDB_txn **txn, int *mrc, const char *what)
{
  *txn = NULL;
  for (;;) {
    int rc = cache_enter(c);
    if (rc != TN_OK)
      return rc;
    *mrc = mdb_txn_begin(c->ca_env, NULL, MDB_RDONLY, txn);
    if (*mrc != MDB_MAP_RESIZED)
      return TN_OK;
    *txn = NULL;
    pthread_rwlock_unlock(&c->ca_lock);
    if ((*mrc = cache_resize(c, 0)) != 0)
      return cache_mdb_fail(c, *mrc, what);
  }
}

static uint64_t cache_mapsize(tn_cache *c)
{
  MDB_envinfo info;
  mdb_env_info(c->ca_env, &info);
  return info.me_mapsize;
}

/* -- Touches (batched last-used updates) -------------------------------------- */

static void touch_record(uint8_t *rec, uint64_t t, uint64_t hits)
{
  if (get_le(rec + H_USED, 8) < t)
    put_le(rec + H_USED, t, 8);
  put_le(rec + H_HITS, get_le(rec + H_HITS, 8) + hits, 8);
}

/* Applies touches inside write txn; records gone meanwhile are skipped. */
static int touches_apply(tn_cache *c, MDB_txn *txn, const cache_touch *t, int n)
{
  for (int i = 0; i < n; i++) {
    MDB_val k = {TN_CACHE_KEY_LEN, (void *)t[i].ct_key}, v;
    int mrc = mdb_get(txn, c->ca_dbi[t[i].ct_table], &k, &v);
    if (mrc == MDB_NOTFOUND || (mrc == 0 && v.mv_size < TN_CACHE_HEADER_LEN))
      continue;
    if (mrc)
      return mrc;
    uint8_t *copy = malloc(v.mv_size);
    if (!copy)
      return ENOMEM;
    memcpy(copy, v.mv_data, v.mv_size);
    touch_record(copy, t[i].ct_time, t[i].ct_hits);
    MDB_val nv = {v.mv_size, copy};
    mrc = mdb_put(txn, c->ca_dbi[t[i].ct_table], &k, &nv, 0);
    free(copy);
    if (mrc)
      return mrc;
  }
  return 0;
}

/* Moves the pending touches into out (MAX_TOUCHES); returns their number. */
static int touches_take(tn_cache *c, cache_touch *out)
{
  pthread_mutex_lock(&c->ca_mu);
  int n = c->ca_ntouch;
  memcpy(out, c->ca_touch, (size_t)n * sizeof *out);
  c->ca_ntouch = 0;
  pthread_mutex_unlock(&c->ca_mu);
  return n;
}

/* Puts touches back after a failed transaction (merging with new ones). */
static void touches_restore(tn_cache *c, const cache_touch *t, int n)
{
  pthread_mutex_lock(&c->ca_mu);
  for (int i = 0; i < n && c->ca_ntouch < MAX_TOUCHES; i++)
    c->ca_touch[c->ca_ntouch++] = t[i];
  pthread_mutex_unlock(&c->ca_mu);
}

/* Records a hit; returns non-zero when the batch is full and should be
** written. */
static int touch_add(tn_cache *c, int table, const uint8_t *key, uint64_t t)
{
  int full;
  pthread_mutex_lock(&c->ca_mu);
  int i;
  for (i = 0; i < c->ca_ntouch; i++)
    if (c->ca_touch[i].ct_table == table && memcmp(c->ca_touch[i].ct_key, key, TN_CACHE_KEY_LEN) == 0)
      break;
  if (i == c->ca_ntouch && c->ca_ntouch < MAX_TOUCHES) {
    c->ca_touch[i].ct_table = table;
    memcpy(c->ca_touch[i].ct_key, key, TN_CACHE_KEY_LEN);
    c->ca_touch[i].ct_hits = 0;
    c->ca_ntouch++;
  }
  if (i < c->ca_ntouch) {
    c->ca_touch[i].ct_time = t;
    c->ca_touch[i].ct_hits++;
  }
  full = c->ca_ntouch >= MAX_TOUCHES;
  pthread_mutex_unlock(&c->ca_mu);
  return full;
}

/* -- Write transactions --------------------------------------------------------- */

typedef int (*write_fn)(tn_cache *c, MDB_txn *txn, void *ctx);

/* Bytes of the pages all our tables use, as seen by txn. */
static uint64_t txn_used_bytes(tn_cache *c, MDB_txn *txn)
{
  MDB_stat ms;
  uint64_t used = 0;
  for (int t = 0; t <= TN_CACHE__TABLES; t++)
    if (mdb_stat(txn, t < TN_CACHE__TABLES ? c->ca_dbi[t] : c->ca_meta, &ms) == 0)
      used += (uint64_t)(ms.ms_branch_pages + ms.ms_leaf_pages + ms.ms_overflow_pages) * ms.ms_psize;
  return used;
}

static int cache_evict(tn_cache *c, uint64_t need);
static int evict_fn(tn_cache *c, MDB_txn *txn, void *vctx);

/* Runs fn in a write transaction (after the pending touches), handling
** MDB_MAP_RESIZED; MDB_MAP_FULL by growing the map up to the limit, then
** (if may_evict) by evicting; and fn's CACHE_OVER_SOFT by evicting. */
static int cache_write(tn_cache *c, write_fn fn, void *ctx, int may_evict, uint64_t need,
                       const char *what)
{
  cache_touch pending[MAX_TOUCHES];
  int evictions = 0;
  /* Touches rewrite whole records; in a full map they are the first thing
  ** to give up (they stay pending, and eviction honours them from memory). */
  int with_touches = fn != evict_fn;
  uint64_t used = 0;
  for (int attempt = 0; attempt < MAX_WRITE_ATTEMPTS; attempt++) {
    int rc = cache_enter(c);
    if (rc != TN_OK)
      return rc;
    MDB_txn *txn = NULL;
    int npending = with_touches ? touches_take(c, pending) : 0;
    int mrc = mdb_txn_begin(c->ca_env, NULL, 0, &txn);
    if (mrc == 0) {
      mrc = touches_apply(c, txn, pending, npending);
      if (mrc == 0 && fn)
        mrc = fn(c, txn, ctx);
      if (mrc == CACHE_OVER_SOFT)
        used = txn_used_bytes(c, txn);
      if (mrc == 0)
        mrc = mdb_txn_commit(txn); /* frees txn, also on failure */
      else
        mdb_txn_abort(txn);
    }
    uint64_t mapsize = mrc == MDB_MAP_FULL ? cache_mapsize(c) : 0;
    pthread_rwlock_unlock(&c->ca_lock);
    if (mrc == 0) {
      if (c->ca_verify) /* our own commit: the next process need not probe */
        stamp_write(c->ca_path);
      return TN_OK;
    }
    touches_restore(c, pending, npending);
    if (npending && (mrc == MDB_MAP_FULL || mrc == CACHE_OVER_SOFT)) {
      with_touches = 0;
      continue;
    }
    if (mrc == MDB_MAP_RESIZED) {
      if ((mrc = cache_resize(c, 0)) == 0)
        continue;
    } else if (mrc == MDB_MAP_FULL || mrc == CACHE_OVER_SOFT) {
      if (mrc == MDB_MAP_FULL && mapsize < c->ca_max) {
        uint64_t want = mapsize * 2 > c->ca_max ? c->ca_max : mapsize * 2;
        if ((mrc = cache_resize(c, want)) == 0)
          continue;
      } else if (may_evict && evictions < MAX_EVICTIONS_PER_WRITE) {
        uint64_t low = c->ca_max / 8 * LOW_NUM;
        uint64_t over = mrc == CACHE_OVER_SOFT && used > low ? used - low : c->ca_max / 8;
        evictions++;
        rc = cache_evict(c, over > need ? over : need);
        if (rc == TN_OK)
          continue;
        return rc;
      } else {
        cache_set_err(c, "cache %s: full at its limit of %" PRIu64 " bytes during %s",
                      c->ca_path, c->ca_max, what);
        return TN_EFULL;
      }
    }
    if (mrc == CACHE_CHANGED)
      return TN_ECHANGED;
    return cache_mdb_fail(c, mrc, what);
  }
  cache_set_err(c, "cache %s: %s did not complete after %d attempts", c->ca_path, what,
                MAX_WRITE_ATTEMPTS);
  return TN_EFULL;
}

/* -- Eviction -------------------------------------------------------------------- */

typedef struct lru_item {
  uint64_t li_time;
  uint64_t li_size;
  int li_table;
  uint8_t li_key[TN_CACHE_KEY_LEN];
} lru_item;

static int lru_cmp(const void *a, const void *b)
{
  uint64_t x = ((const lru_item *)a)->li_time, y = ((const lru_item *)b)->li_time;
  return x < y ? -1 : x > y;
}

typedef struct evict_ctx {
  uint64_t ev_need;
  uint64_t ev_count;
} evict_ctx;

/* Deletes least recently used records until at least ev_need bytes of
** records are freed. */
static int evict_fn(tn_cache *c, MDB_txn *txn, void *vctx)
{
  evict_ctx *ctx = vctx;
  lru_item *items = NULL;
  size_t n = 0, cap = 0;
  int mrc = 0;

  for (int t = 0; t < TN_CACHE__TABLES && mrc == 0; t++) {
    MDB_cursor *cur;
    MDB_val k, v;
    if ((mrc = mdb_cursor_open(txn, c->ca_dbi[t], &cur)) != 0)
      break;
    for (int op = MDB_FIRST; (mrc = mdb_cursor_get(cur, &k, &v, (MDB_cursor_op)op)) == 0; op = MDB_NEXT) {
      if (k.mv_size != TN_CACHE_KEY_LEN)
        continue;
      if (n == cap) {
        size_t ncap = cap ? cap * 2 : 256;
        lru_item *p = realloc(items, ncap * sizeof *p);
        if (!p) {
          mrc = ENOMEM;
          break;
        }
        items = p;
        cap = ncap;
      }
      lru_item *it = &items[n++];
      it->li_table = t;
      memcpy(it->li_key, k.mv_data, TN_CACHE_KEY_LEN);
      it->li_size = k.mv_size + v.mv_size + 16;
      it->li_time = v.mv_size >= TN_CACHE_HEADER_LEN ? get_le((const uint8_t *)v.mv_data + H_USED, 8) : 0;
    }
    mdb_cursor_close(cur);
    if (mrc == MDB_NOTFOUND)
      mrc = 0;
  }
  if (mrc == 0) {
    /* last-used times not yet written count too */
    pthread_mutex_lock(&c->ca_mu);
    for (int t = 0; t < c->ca_ntouch; t++)
      for (size_t i = 0; i < n; i++)
        if (items[i].li_table == c->ca_touch[t].ct_table &&
            memcmp(items[i].li_key, c->ca_touch[t].ct_key, TN_CACHE_KEY_LEN) == 0 &&
            items[i].li_time < c->ca_touch[t].ct_time)
          items[i].li_time = c->ca_touch[t].ct_time;
    pthread_mutex_unlock(&c->ca_mu);
    qsort(items, n, sizeof *items, lru_cmp);
    uint64_t freed = 0;
    for (size_t i = 0; i < n && freed < ctx->ev_need && mrc == 0; i++) {
      MDB_val k = {TN_CACHE_KEY_LEN, items[i].li_key};
      mrc = mdb_del(txn, c->ca_dbi[items[i].li_table], &k, NULL);
      if (mrc == 0) {
        freed += items[i].li_size;
        ctx->ev_count++;
      }
    }
    if (mrc == 0 && n == 0)
      mrc = MDB_MAP_FULL; /* nothing to evict: the store is full of non-records */
  }
  free(items);
  return mrc;
}

static int epoch_fn(tn_cache *c, MDB_txn *txn, void *ctx)
{
  (void)ctx;
  uint8_t buf[8];
  MDB_val k = {11, "evict_epoch"}, v = {8, buf};
  put_le(buf, now_ns(c), 8);
  return mdb_put(txn, c->ca_meta, &k, &v, 0);
}

/* Evicts, then commits one more small transaction: LMDB reuses the pages a
** transaction frees only after the next one commits, so without it the
** caller's retry would find the map as full as before. */
static int cache_evict(tn_cache *c, uint64_t need)
{
  evict_ctx ctx = {need, 0};
  int rc = cache_write(c, evict_fn, &ctx, 0, need, "eviction");
  if (rc == TN_OK)
    STAT_ADD(c, ca_evictions, ctx.ev_count);
  if (rc == TN_OK)
    rc = cache_write(c, epoch_fn, NULL, 0, 0, "eviction");
  return rc;
}

/* -- Public API ------------------------------------------------------------------ */

int tn_cache_open(const char *dir, const tn_cache_options *opt, tn_cache **out,
                  char *err, size_t errlen)
{
  struct stat st;
  char real[PATH_MAX];
  tn_cache *c = NULL;
  uint64_t initial = opt && opt->co_initial_map ? opt->co_initial_map : DEFAULT_INITIAL_MAP;
  uint64_t max = opt && opt->co_max_bytes ? opt->co_max_bytes : DEFAULT_MAX_BYTES;
  int rc;

  *out = NULL;
  if (errlen)
    err[0] = 0;
  if (max < MIN_MAP_BYTES || max > (UINT64_C(1) << 46)) {
    snprintf(err, errlen, "cache size limit %" PRIu64 " must lie in [%u, 2^46] bytes", max, MIN_MAP_BYTES);
    return TN_EINVAL;
  }
  if (initial > max)
    initial = max;
  if (initial < MIN_MAP_BYTES)
    initial = MIN_MAP_BYTES;
  pthread_once(&atfork_once, atfork_register);
  if ((rc = mkdirs(dir, err, errlen)) != TN_OK)
    return rc;
  if (!realpath(dir, real) || stat(real, &st) != 0) {
    snprintf(err, errlen, "cannot resolve cache directory %s: %s", dir, strerror(errno));
    return TN_EIO;
  }
  if (!S_ISDIR(st.st_mode)) {
    snprintf(err, errlen, "cache path %s is not a directory", real);
    return TN_EIO;
  }
  if (st.st_uid != geteuid() || (st.st_mode & 022)) {
    /* what fixes it: a chmod can make a directory of ours private, not one of someone else's */
    int foreign = st.st_uid != geteuid();
    snprintf(err, errlen,
             "refusing cache directory %s: it is %s (mode %04o); a cache there could be "
             "made to load code from someone else. Use %s%s%s another TORCHNEURON_CACHE_DIR",
             real, foreign ? "owned by another user" : "writable by other users", (unsigned)(st.st_mode & 07777),
             foreign ? "" : "'chmod 700 ", foreign ? "" : real, foreign ? "" : "' or");
    return TN_EPERM;
  }

  registry_lock();
  char path[sizeof c->ca_path];
  snprintf(path, sizeof path, "%s/cache.mdb", real);
  for (tn_cache *h = registry_head; h; h = h->ca_next) {
    if (strcmp(h->ca_path, path) == 0) {
      h->ca_refs++;
      *out = h;
      registry_unlock();
      return TN_OK;
    }
  }
  c = calloc(1, sizeof *c);
  if (!c) {
    registry_unlock();
    snprintf(err, errlen, "out of memory");
    return TN_ENOMEM;
  }
  memcpy(c->ca_path, path, sizeof path);
  c->ca_initial = initial;
  c->ca_max = max;
  c->ca_verify = opt ? opt->co_verify : 0;
  c->ca_refs = 1;
  pthread_rwlock_init(&c->ca_lock, NULL);
  pthread_mutex_init(&c->ca_mu, NULL);
  rc = env_open(c, err, errlen);
  if (rc != TN_OK) {
    registry_unlock();
    pthread_rwlock_destroy(&c->ca_lock);
    pthread_mutex_destroy(&c->ca_mu);
    free(c);
    return rc;
  }
  c->ca_next = registry_head;
  registry_head = c;
  registry_unlock();
  *out = c;
  return TN_OK;
}

void tn_cache_close(tn_cache *c)
{
  if (!c)
    return;
  registry_lock();
  if (--c->ca_refs > 0) {
    registry_unlock();
    return;
  }
  for (tn_cache **pp = &registry_head; *pp; pp = &(*pp)->ca_next)
    if (*pp == c) {
      *pp = c->ca_next;
      break;
    }
  registry_unlock();

  if (c->ca_ntouch && !c->ca_rc)
    cache_write(c, NULL, NULL, 0, 0, "flush");
  if (c->ca_env && c->ca_pid == getpid())
    mdb_env_close(c->ca_env);
  if (c->ca_quarantine)
    cache_quarantine(c, c->ca_err);
  pthread_rwlock_destroy(&c->ca_lock);
  pthread_mutex_destroy(&c->ca_mu);
  free(c);
}

static int table_ok(tn_cache *c, int table, const uint8_t *key)
{
  if (table < 0 || table >= TN_CACHE__TABLES || !key) {
    cache_set_err(c, "cache: bad table %d or NULL key", table);
    return 0;
  }
  return 1;
}

typedef struct delete_ctx {
  int de_table;
  uint8_t de_key[TN_CACHE_KEY_LEN];
  int de_found;
} delete_ctx;

static int delete_fn(tn_cache *c, MDB_txn *txn, void *vctx)
{
  delete_ctx *d = vctx;
  MDB_val k = {TN_CACHE_KEY_LEN, d->de_key};
  int mrc = mdb_del(txn, c->ca_dbi[d->de_table], &k, NULL);
  d->de_found = mrc == 0;
  return mrc == MDB_NOTFOUND ? 0 : mrc;
}

/* Deletes key from table; *found says whether it was there. */
static int cache_delete(tn_cache *c, int table, const uint8_t *key, int *found, const char *what)
{
  delete_ctx d = {table, {0}, 0};
  memcpy(d.de_key, key, TN_CACHE_KEY_LEN);
  int rc = cache_write(c, delete_fn, &d, 0, 0, what);
  *found = d.de_found;
  return rc;
}

int64_t tn_cache_record_check(const void *vrec, size_t len)
{
  const uint8_t *rec = vrec;
  if (!rec || len < TN_CACHE_HEADER_LEN || get_le(rec + H_MAGIC, 4) != REC_MAGIC ||
      get_le(rec + H_VERSION, 2) != TN_CACHE_FORMAT_VERSION)
    return -1;
  uint64_t plen = get_le(rec + H_LEN, 8);
  if (plen != len - TN_CACHE_HEADER_LEN)
    return -1;
  if (XXH3_64bits(rec + TN_CACHE_HEADER_LEN, plen) != get_le(rec + H_SUM, 8))
    return -1;
  return (int64_t)plen;
}

int tn_cache_get(tn_cache *c, int table, const uint8_t key[TN_CACHE_KEY_LEN],
                 void **val, size_t *len)
{
  MDB_txn *txn = NULL;
  MDB_val k = {TN_CACHE_KEY_LEN, (void *)key}, v;
  int corrupt = 0, rc, mrc;

  *val = NULL;
  *len = 0;
  if (!table_ok(c, table, key))
    return TN_EINVAL;
  if ((rc = cache_read_begin(c, &txn, &mrc, "get")) != TN_OK)
    return rc;
  if (mrc == 0)
    mrc = mdb_get(txn, c->ca_dbi[table], &k, &v);
  if (mrc == 0) {
    int64_t plen = tn_cache_record_check(v.mv_data, v.mv_size);
    if (plen < 0) {
      corrupt = 1;
    } else if (!(*val = malloc(plen ? (size_t)plen : 1))) {
      mrc = ENOMEM;
    } else {
      memcpy(*val, (const uint8_t *)v.mv_data + TN_CACHE_HEADER_LEN, (size_t)plen);
      *len = (size_t)plen;
    }
  }
  if (txn)
    mdb_txn_abort(txn);
  pthread_rwlock_unlock(&c->ca_lock);

  if (mrc == MDB_NOTFOUND || corrupt) {
    STAT_ADD(c, ca_misses, 1);
    if (corrupt) {
      int found;
      STAT_ADD(c, ca_corrupt, 1);
      cache_delete(c, table, key, &found, "dropping a corrupt record");
    }
    return TN_ENOTFOUND;
  }
  if (mrc != 0)
    return cache_mdb_fail(c, mrc, "get");
  STAT_ADD(c, ca_hits, 1);
  if (touch_add(c, table, key, now_ns(c)))
    tn_cache_flush(c);
  return TN_OK;
}

typedef struct put_ctx {
  int pc_table;
  const uint8_t *pc_key;
  const uint8_t *pc_rec;
  size_t pc_len;
  int pc_compare;          /* replace only if the payload is pc_old */
  const uint8_t *pc_old;   /* NULL: only if there is none */
  size_t pc_old_len;
} put_ctx;

/* Whether the record v (NULL: none) holds payload old (NULL: none); a
** damaged record counts as none, as get() reads it. */
static int payload_is(const MDB_val *v, const uint8_t *old, size_t old_len)
{
  int64_t plen = v ? tn_cache_record_check(v->mv_data, v->mv_size) : -1;
  if (plen < 0)
    return old == NULL;
  return old && (size_t)plen == old_len &&
         memcmp((const uint8_t *)v->mv_data + TN_CACHE_HEADER_LEN, old, old_len) == 0;
}

static int put_fn(tn_cache *c, MDB_txn *txn, void *vctx)
{
  put_ctx *p = vctx;
  MDB_val k = {TN_CACHE_KEY_LEN, (void *)p->pc_key}, v = {p->pc_len, (void *)p->pc_rec}, cur;
  if (p->pc_compare) {
    int mrc = mdb_get(txn, c->ca_dbi[p->pc_table], &k, &cur);
    if (mrc != 0 && mrc != MDB_NOTFOUND)
      return mrc;
    if (!payload_is(mrc == 0 ? &cur : NULL, p->pc_old, p->pc_old_len))
      return CACHE_CHANGED;
  }
  int mrc = mdb_put(txn, c->ca_dbi[p->pc_table], &k, &v, 0);
  if (mrc == 0 && txn_used_bytes(c, txn) > c->ca_max / 8 * SOFT_NUM)
    mrc = CACHE_OVER_SOFT;
  return mrc;
}

/* tn_cache_put and tn_cache_replace: p names the table, key and comparison. */
static int cache_put(tn_cache *c, put_ctx *p, const void *val, size_t len)
{
  if (!table_ok(c, p->pc_table, p->pc_key) || (len && !val))
    return TN_EINVAL;
  if (len > c->ca_max / 8) {
    cache_set_err(c, "cache %s: a %zu-byte record exceeds 1/8 of the size limit %" PRIu64,
                  c->ca_path, len, c->ca_max);
    return TN_ETOOBIG;
  }
  uint8_t *rec = malloc(TN_CACHE_HEADER_LEN + len);
  if (!rec)
    return TN_ENOMEM;
  uint64_t t = now_ns(c);
  put_le(rec + H_MAGIC, REC_MAGIC, 4);
  put_le(rec + H_VERSION, TN_CACHE_FORMAT_VERSION, 2);
  put_le(rec + H_FLAGS, 0, 2);
  put_le(rec + H_LEN, len, 8);
  put_le(rec + H_SUM, XXH3_64bits(val, len), 8);
  put_le(rec + H_CREATED, t, 8);
  put_le(rec + H_USED, t, 8);
  put_le(rec + H_HITS, 0, 8);
  if (len)
    memcpy(rec + TN_CACHE_HEADER_LEN, val, len);
  p->pc_rec = rec;
  p->pc_len = TN_CACHE_HEADER_LEN + len;
  int rc = cache_write(c, put_fn, p, 1, p->pc_len + TN_CACHE_KEY_LEN, "put");
  free(rec);
  if (rc == TN_OK)
    STAT_ADD(c, ca_puts, 1);
  return rc;
}

int tn_cache_put(tn_cache *c, int table, const uint8_t key[TN_CACHE_KEY_LEN],
                 const void *val, size_t len)
{
  put_ctx p = {.pc_table = table, .pc_key = key};
  return cache_put(c, &p, val, len);
}

int tn_cache_replace(tn_cache *c, int table, const uint8_t key[TN_CACHE_KEY_LEN],
                     const void *old, size_t old_len, const void *val, size_t len)
{
  if (old_len && !old)
    return TN_EINVAL;
  put_ctx p = {.pc_table = table, .pc_key = key, .pc_compare = 1, .pc_old = old,
               .pc_old_len = old_len};
  return cache_put(c, &p, val, len);
}

int tn_cache_delete(tn_cache *c, int table, const uint8_t key[TN_CACHE_KEY_LEN])
{
  if (!table_ok(c, table, key))
    return TN_EINVAL;
  int found;
  int rc = cache_delete(c, table, key, &found, "delete");
  return rc == TN_OK && !found ? TN_ENOTFOUND : rc;
}

static int clear_fn(tn_cache *c, MDB_txn *txn, void *ctx)
{
  (void)ctx;
  int mrc = 0;
  for (int t = 0; t < TN_CACHE__TABLES && mrc == 0; t++)
    mrc = mdb_drop(txn, c->ca_dbi[t], 0);
  return mrc;
}

int tn_cache_clear(tn_cache *c)
{
  pthread_mutex_lock(&c->ca_mu);
  c->ca_ntouch = 0;
  pthread_mutex_unlock(&c->ca_mu);
  return cache_write(c, clear_fn, NULL, 0, 0, "clear");
}

int tn_cache_flush(tn_cache *c)
{
  return cache_write(c, NULL, NULL, 0, 0, "flush");
}

int tn_cache_stats(tn_cache *c, tn_cache_info *st)
{
  MDB_txn *txn = NULL;
  MDB_stat ms;
  struct stat fst;
  int rc, mrc;

  memset(st, 0, sizeof *st);
  if ((rc = cache_read_begin(c, &txn, &mrc, "stats")) != TN_OK)
    return rc;
  for (int t = 0; mrc == 0 && t < TN_CACHE__TABLES; t++)
    if ((mrc = mdb_stat(txn, c->ca_dbi[t], &ms)) == 0)
      st->cs_entries += ms.ms_entries;
  if (mrc == 0)
    st->cs_bytes = txn_used_bytes(c, txn);
  if (txn)
    mdb_txn_abort(txn);
  st->cs_map_bytes = cache_mapsize(c);
  pthread_rwlock_unlock(&c->ca_lock);
  if (mrc != 0)
    return cache_mdb_fail(c, mrc, "stats");
  st->cs_file_bytes = stat(c->ca_path, &fst) == 0 ? (uint64_t)fst.st_size : 0;
  st->cs_max_bytes = c->ca_max;
  st->cs_hits = STAT_GET(c, ca_hits);
  st->cs_misses = STAT_GET(c, ca_misses);
  st->cs_puts = STAT_GET(c, ca_puts);
  st->cs_evictions = STAT_GET(c, ca_evictions);
  st->cs_corrupt = STAT_GET(c, ca_corrupt);
  st->cs_map_grows = STAT_GET(c, ca_grows);
  st->cs_probes = STAT_GET(c, ca_probes);
  return TN_OK;
}

const char *tn_cache_path(const tn_cache *c)
{
  return c->ca_path;
}

const char *tn_cache_errmsg(tn_cache *c)
{
  return c->ca_err;
}

void tn_cache_take_notice(tn_cache *c, char *buf, size_t len)
{
  pthread_mutex_lock(&c->ca_mu);
  snprintf(buf, len, "%s", c->ca_notice);
  c->ca_notice[0] = 0;
  pthread_mutex_unlock(&c->ca_mu);
}
