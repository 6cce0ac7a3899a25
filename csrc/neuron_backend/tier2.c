/*
** Tier 2: the system C compiler and loading its shared objects (see
** tier2.h).
*/
#include "tier2.h"
#include "../tn_yield.h"
#include "runtime.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

struct tn_tier2_obj {
  void *to_handle;
  void *to_sym;
  int to_fd;
};

#define T2_MAX_FLAGS 32

/* Reads the whole file at path into *buf (malloc'd) of *len bytes. */
static int t2_read_file(const char *path, uint8_t **buf, size_t *len)
{
  int rc = TN_EIO;
  uint8_t *b = NULL;
  FILE *f = fopen(path, "rb");
  struct stat stt;
  if (!f || fstat(fileno(f), &stt) != 0 || stt.st_size < 0)
    goto done;
  rc = TN_ENOMEM;
  if (!(b = malloc((size_t)stt.st_size + 1)))
    goto done;
  rc = TN_EIO;
  if (fread(b, 1, (size_t)stt.st_size, f) != (size_t)stt.st_size)
    goto done;
  *buf = b;
  *len = (size_t)stt.st_size;
  b = NULL;
  rc = TN_OK;
done:
  if (f)
    fclose(f);
  free(b);
  return rc;
}

/* The compiler's first messages (its log file) into err. */
static void t2_messages(const char *log, char *err, size_t errlen, int status)
{
  uint8_t *text = NULL;
  size_t n = 0;
  int at = snprintf(err, errlen, "the C compiler exited with status %d", status);
  if (at < 0 || (size_t)at >= errlen || t2_read_file(log, &text, &n) != TN_OK)
    return;
  text[n] = 0;
  snprintf(err + at, errlen - (size_t)at, ": %.*s", (int)(n < 600 ? n : 600), (const char *)text);
  free(text);
}

/* What t2_spawn_low spawns, and what it got. */
typedef struct {
  const char *const *sp_argv;
  posix_spawn_file_actions_t *sp_fa;
  posix_spawnattr_t *sp_attr;
  pid_t sp_pid;
  int sp_err;
} t2_spawn;

/* A thread of its own at the lowest priority, in the idle scheduling
** class where the system has one, spawns s: the process starts there (a
** child takes its parent thread's class and nice value), and so do the
** compiler driver's cc1, as and ld, with no moment at the caller's
** priority. The calling thread keeps its own: a thread at nice 19 that
** took the GIL kept a served call waiting while the cores ran other work. */
static void *t2_spawn_low(void *arg)
{
  t2_spawn *s = arg;
  (void)setpriority(PRIO_PROCESS, 0, 19);  /* Linux: this thread only */
#ifdef SCHED_IDLE
  struct sched_param sp = {.sched_priority = 0};
  (void)sched_setscheduler(0, SCHED_IDLE, &sp);
#endif
  s->sp_err = posix_spawnp(&s->sp_pid, s->sp_argv[0], s->sp_fa, s->sp_attr, (char *const *)s->sp_argv, environ);
  return NULL;
}

/* Waits for the compiler pid, the leader of its own process group, to
** exit (*st: waitpid's status), giving way to served calls
** (tn_yield_wait_group). In the idle class alone, a compiler still took
** one core from a call on two: the kernel ran the call's two threads in
** turns on the other (a TransformerEncoder call at 53 instead of 27 ms).
** low: it runs in the idle class; *starved is set when it was killed for
** starving there (calls on one thread or other processes kept every core
** busy). TN_EIO on a
** failed wait (the cause in err). */
static int t2_wait_giving_way(pid_t pid, int low, int *st, int *starved, char *err, size_t errlen)
{
  int r = tn_yield_wait_group(pid, low, st);
  *starved = r == 2;
  if (r >= 0)
    return TN_OK;
  snprintf(err, errlen, "waiting for the C compiler: %s", strerror(errno));
  return TN_EIO;
}

/* Runs argv (argv[0] found on PATH) with stdin from /dev/null and stdout
** and stderr into the file log; *status is its exit status (-1: killed).
** idle: started at the lowest priority, in the idle scheduling class
** (t2_spawn_low), where a thread can be made, in a process group of its
** own that is stopped while served calls run (t2_wait_giving_way); where
** it starves there, it runs again from the start at our priority, still
** stopped for calls. Else it runs as we do. TN_ECOMPILE when it cannot
** start (the cause in err), TN_EIO. */
static int t2_run(const char *const *argv, const char *log, int idle, int *status, char *err, size_t errlen)
{
  int rc = TN_EIO, attr_made = 0;
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  if (posix_spawn_file_actions_init(&fa) != 0)
    return TN_EIO;
  if (posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0) != 0 ||
      posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0600) != 0 ||
      posix_spawn_file_actions_adddup2(&fa, 1, 2) != 0)
    goto done;
  if (posix_spawnattr_init(&attr) != 0)
    goto done;
  attr_made = 1;
  if (idle && (posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP) != 0 ||
               posix_spawnattr_setpgroup(&attr, 0) != 0))
    goto done;
  int st = 0, starved = 0;
  for (int low = idle;; low = 0) {
    t2_spawn s = {argv, &fa, &attr, 0, 0};
    pthread_t th;
    if (low && pthread_create(&th, NULL, t2_spawn_low, &s) == 0)
      pthread_join(th, NULL);
    else
      s.sp_err = posix_spawnp(&s.sp_pid, argv[0], &fa, &attr, (char *const *)argv, environ);
    if (s.sp_err != 0) {
      snprintf(err, errlen, "cannot run the C compiler %s: %s", argv[0], strerror(s.sp_err));
      rc = TN_ECOMPILE;
      goto done;
    }
    if (idle) {
      if ((rc = t2_wait_giving_way(s.sp_pid, low, &st, &starved, err, errlen)) != TN_OK)
        goto done;
      if (starved)
        continue;
    } else {
      while (waitpid(s.sp_pid, &st, 0) < 0) {
        if (errno != EINTR) {
          snprintf(err, errlen, "waiting for the C compiler: %s", strerror(errno));
          rc = TN_EIO;
          goto done;
        }
      }
    }
    break;
  }
  *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  rc = TN_OK;
done:
  if (attr_made)
    posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&fa);
  return rc;
}

/* A private temporary directory (dir, of size 256). */
static int t2_tmpdir(char *dir, char *err, size_t errlen)
{
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, 256, "%s/torchneuron-tier2-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
  if (mkdtemp(dir))
    return TN_OK;
  snprintf(err, errlen, "cannot make a temporary directory: %s", strerror(errno));
  return TN_EIO;
}

int tn_tier2_version(const char *cc, char *line, size_t len, char *err, size_t errlen)
{
  char dir[256], log[300];
  const char *argv[] = {cc, "--version", NULL};
  uint8_t *text = NULL;
  size_t n = 0;
  int status = -1;
  line[0] = 0;
  err[0] = 0;
  int rc = t2_tmpdir(dir, err, errlen);
  if (rc != TN_OK)
    return rc;
  snprintf(log, sizeof log, "%s/log", dir);
  rc = t2_run(argv, log, 0, &status, err, errlen);
  if (rc == TN_OK && status != 0) {
    snprintf(err, errlen, "%s --version exited with status %d", cc, status);
    rc = TN_ECOMPILE;
  }
  if (rc == TN_OK && (rc = t2_read_file(log, &text, &n)) == TN_OK) {
    size_t end = 0;
    while (end < n && text[end] != '\n' && end + 1 < len)
      end++;
    memcpy(line, text, end);
    line[end] = 0;
    if (end == 0) {
      snprintf(err, errlen, "%s --version printed nothing", cc);
      rc = TN_ECOMPILE;
    }
  }
  free(text);
  unlink(log);
  rmdir(dir);
  return rc;
}

int tn_tier2_compile(const char *cc, const char *const *flags, size_t nflags, const char *src, int idle,
                     uint8_t **so, size_t *len, char *err, size_t errlen)
{
  int rc, status = -1;
  char dir[256], csrc[300], out[300], log[300];
  const char *argv[T2_MAX_FLAGS + 8];
  FILE *f = NULL;

  *so = NULL;
  *len = 0;
  err[0] = 0;
  if (nflags > T2_MAX_FLAGS) {
    snprintf(err, errlen, "more than %d compiler flags", T2_MAX_FLAGS);
    return TN_EINVAL;
  }
  if ((rc = t2_tmpdir(dir, err, errlen)) != TN_OK)
    return rc;
  snprintf(csrc, sizeof csrc, "%s/k.c", dir);
  snprintf(out, sizeof out, "%s/k.so", dir);
  snprintf(log, sizeof log, "%s/log", dir);
  rc = TN_EIO;
  if (!(f = fopen(csrc, "w")) || fputs(src, f) < 0 || fclose(f) != 0) {
    if (f)
      fclose(f);
    snprintf(err, errlen, "cannot write the kernel's source: %s", strerror(errno));
    goto done;
  }
  size_t a = 0;
  argv[a++] = cc;
  for (size_t i = 0; i < nflags; i++)
    argv[a++] = flags[i];
  argv[a++] = "-o";
  argv[a++] = out;
  argv[a++] = csrc;
  argv[a++] = "-lmvec";
  argv[a++] = "-lm";
  argv[a] = NULL;
  if ((rc = t2_run(argv, log, idle, &status, err, errlen)) != TN_OK)
    goto done;
  if (status != 0) {
    t2_messages(log, err, errlen, status);
    rc = TN_ECOMPILE;
    goto done;
  }
  rc = t2_read_file(out, so, len);
  if (rc != TN_OK)
    snprintf(err, errlen, "cannot read the compiled object");
done:
  unlink(csrc);
  unlink(out);
  unlink(log);
  rmdir(dir);
  return rc;
}

int tn_tier2_load(const uint8_t *so, size_t len, const char *sym, tn_tier2_obj **out, char *err, size_t errlen)
{
  int rc = TN_ECORRUPT, fd = -1;
  char path[64];
  tn_tier2_obj *o = NULL;
  void *h = NULL;

  *out = NULL;
  err[0] = 0;
  if (len < 4 || memcmp(so, "\177ELF", 4) != 0) {
    snprintf(err, errlen, "not an ELF object");
    goto done;
  }
  rc = TN_EIO;
  if ((fd = memfd_create("tn_kernel2", MFD_CLOEXEC)) < 0) {
    snprintf(err, errlen, "memfd_create: %s", strerror(errno));
    goto done;
  }
  for (size_t at = 0; at < len;) {
    ssize_t w = write(fd, so + at, len - at);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) {
      snprintf(err, errlen, "writing the object: %s", strerror(errno));
      goto done;
    }
    at += (size_t)w;
  }
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  rc = TN_ECOMPILE;
  if (!(h = dlopen(path, RTLD_NOW | RTLD_LOCAL))) {
    const char *m = dlerror();
    snprintf(err, errlen, "the dynamic loader refused the object: %s", m ? m : "?");
    goto done;
  }
  void *s = dlsym(h, sym);
  if (!s) {
    snprintf(err, errlen, "the object has no %s", sym);
    goto done;
  }
  void **eager = dlsym(h, "tn_t2_eager"); /* eager's math functions its kernel calls (codegen.c t2_pointwise) */
  for (int op = 0; eager && op < TN_RT_EAGER_OPS; op++)
    eager[op] = tn_rt_eager_fn(op);
  rc = TN_ENOMEM;
  if (!(o = malloc(sizeof *o)))
    goto done;
  o->to_handle = h;
  o->to_sym = s;
  o->to_fd = fd;
  h = NULL;
  fd = -1;
  *out = o;
  rc = TN_OK;
done:
  if (h)
    dlclose(h);
  if (fd >= 0)
    close(fd);
  return rc;
}

void *tn_tier2_symbol(const tn_tier2_obj *o)
{
  return o->to_sym;
}

void tn_tier2_free(tn_tier2_obj *o)
{
  if (!o)
    return;
  dlclose(o->to_handle);
  close(o->to_fd);
  free(o);
}
