/*
** Served calls, and the background work that gives way to them (see
** tn_yield.h).
*/
#include "tn_yield.h"
#include "tn_config.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>

static atomic_int yield_calls;       /* calls in flight, all threads */
static atomic_ullong yield_begun;    /* calls begun so far */
static atomic_llong yield_last_end;  /* when the last call ended (tn_yield_now) */
static atomic_ullong yield_events;   /* calls begun and ended so far (tn_yield_epoch) */
static atomic_int yield_waiters;     /* threads in tn_yield_wait */
static atomic_llong yield_busy;      /* ns with a call in flight, periods ended so far */
static atomic_llong yield_busy_from; /* when the period in flight began */
static atomic_llong yield_short;     /* ns of the gaps between calls that a paused build sleeps through */
static _Thread_local int yield_mine; /* calls in flight on this thread */
static pthread_mutex_t yield_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t yield_cv;
static pthread_once_t yield_once = PTHREAD_ONCE_INIT;

/* Lending: the waits whose process starves (tn_yield_wait_child and _group: one thread each),
** and on each thread, what its outermost call changed to lend them. */
static atomic_int yield_lent;
static _Thread_local int yield_lending;   /* threads this thread's call lends */
static _Thread_local int yield_omp_was;   /* its OpenMP threads before */
static _Thread_local int yield_mkl_was;   /* its MKL thread-local count before (0: the global one) */
static void (*_Atomic yield_omp_set)(int);        /* tn_yield_lend_with's: NULL, nothing is lent */
static int (*_Atomic yield_omp_get)(void);
static int (*_Atomic yield_mkl_local)(int);       /* mkl_set_num_threads_local: returns the one before */
static atomic_int yield_forked;                   /* set in a forked child: MKL runs serially there */

static void yield_cond_init(void)
{
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(&yield_cv, &a);
  pthread_condattr_destroy(&a);
}

/* A forked child (a background build's, _jit.py build_worker) serves no
** call of its own: the parent's calls in flight when it forked are not
** its to wait for, and their threads will never end them here. */
static void yield_atfork_child(void)
{
  atomic_store(&yield_calls, 0);
  atomic_store(&yield_waiters, 0);
  atomic_store(&yield_lent, 0);
  atomic_store(&yield_forked, 1);
  yield_mine = 0;
  yield_lending = 0;
  pthread_mutex_init(&yield_mu, NULL);
  yield_cond_init();
}

static void yield_init(void)
{
  yield_cond_init();
  pthread_atfork(NULL, NULL, yield_atfork_child);
}

void tn_yield_lend_with(void (*omp_set)(int), int (*omp_get)(void), int (*mkl_local)(int))
{
  pthread_once(&yield_once, yield_init); /* before any fork: its child handler (tn_yield_mkl_serial_in_child) */
  yield_omp_get = omp_get;
  yield_mkl_local = mkl_local;
  yield_omp_set = omp_get ? omp_set : NULL;
}

int tn_yield_omp_threads(int n)
{
  void (*set)(int) = yield_omp_set;
  int (*get)(void) = yield_omp_get;
  assert(n >= 1);
  if (!set || !get)
    return -1;
  int before = get();
  set(n);
  int (*mkl)(int) = yield_mkl_local;
  if (mkl)
    (void)mkl(n);
  return before;
}

void tn_yield_mkl_serial_in_child(void)
{
  if (!atomic_load_explicit(&yield_forked, memory_order_relaxed))
    return;
  int (*mkl)(int) = yield_mkl_local;
  if (mkl)
    (void)mkl(1);
}

/* The outermost call on this thread begins: while a build's child is
** lent a thread (tn_yield_wait_child), its OpenMP parallel regions, MKL's
** and our kernels' launches run on one thread fewer. */
static void yield_lend_begin(void)
{
  int lent = atomic_load_explicit(&yield_lent, memory_order_relaxed);
  if (lent <= 0 || !yield_omp_set)
    return;
  int threads = yield_omp_get();
  if (threads <= 1)
    return;
  yield_lending = threads - lent >= 1 ? lent : threads - 1;
  yield_omp_was = threads;
  yield_omp_set(threads - yield_lending);
  yield_mkl_was = yield_mkl_local ? yield_mkl_local(threads - yield_lending) : 0;
}

static void yield_lend_end(void)
{
  if (yield_lending == 0)
    return;
  yield_omp_set(yield_omp_was);
  if (yield_mkl_local)
    (void)yield_mkl_local(yield_mkl_was);
  yield_lending = 0;
}

int tn_yield_lending(void) { return yield_lending; }

int64_t tn_yield_now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* A call began or ended: wakes the threads in tn_yield_wait, if any (a
** load when there are none). A waiter counts itself before it reads the
** epoch, this bumps the epoch before it reads the count (both sequentially
** consistent): one of the two sees the other. */
static void yield_wake(void)
{
  atomic_fetch_add(&yield_events, 1);
  if (atomic_load(&yield_waiters) > 0) {
    pthread_mutex_lock(&yield_mu);
    pthread_cond_broadcast(&yield_cv);
    pthread_mutex_unlock(&yield_mu);
  }
}

/* The part of a gap of gap_ns between two calls that a paused build
** sleeps through: build_resume_us of it at most. */
static int64_t yield_short_part(int64_t gap_ns)
{
  int64_t resume_ns = tn_yield_ns(tn_config_int(TN_CFG_build_resume_us), 1000);
  return gap_ns < 0 ? 0 : gap_ns < resume_ns ? gap_ns : resume_ns;
}

void tn_yield_call_begin(void)
{
  pthread_once(&yield_once, yield_init); /* before any fork: its child handler */
  atomic_fetch_add_explicit(&yield_begun, 1, memory_order_relaxed);
  if (atomic_fetch_add_explicit(&yield_calls, 1, memory_order_acq_rel) == 0) {
    int64_t now = tn_yield_now();
    int64_t last = atomic_load_explicit(&yield_last_end, memory_order_acquire);
    if (last > 0) /* the gap since the last call, up to the resume time a build waits after a call */
      atomic_fetch_add(&yield_short, yield_short_part(now - last));
    atomic_store_explicit(&yield_busy_from, now, memory_order_release);
  }
  if (yield_mine++ == 0)
    yield_lend_begin();
  yield_wake();
}

void tn_yield_call_end(void)
{
  assert(yield_mine > 0);
  if (--yield_mine == 0)
    yield_lend_end();
  int64_t now = tn_yield_now();
  atomic_store_explicit(&yield_last_end, now, memory_order_release);
  if (atomic_fetch_sub_explicit(&yield_calls, 1, memory_order_acq_rel) == 1)
    atomic_fetch_add(&yield_busy, now - atomic_load_explicit(&yield_busy_from, memory_order_acquire));
  yield_wake();
}

int tn_yield_in_flight(void) { return atomic_load_explicit(&yield_calls, memory_order_acquire); }

int tn_yield_beside(void) { return atomic_load_explicit(&yield_calls, memory_order_acquire) - yield_mine; }

uint64_t tn_yield_begun(void) { return atomic_load_explicit(&yield_begun, memory_order_relaxed); }

int64_t tn_yield_busy_ns(void)
{
  int64_t busy = atomic_load(&yield_busy) + atomic_load(&yield_short);
  int64_t now = tn_yield_now(), last = atomic_load_explicit(&yield_last_end, memory_order_acquire);
  if (atomic_load_explicit(&yield_calls, memory_order_acquire) > 0)
    busy += now - atomic_load_explicit(&yield_busy_from, memory_order_acquire);
  else if (last > 0) /* the gap going on */
    busy += yield_short_part(now - last);
  return busy;
}

int64_t tn_yield_last_end(void) { return atomic_load_explicit(&yield_last_end, memory_order_acquire); }

int64_t tn_yield_resume_at(int64_t resume_ns, int64_t *waited_end)
{
  if (tn_yield_beside() > 0)
    return INT64_MAX;
  int64_t last = atomic_load_explicit(&yield_last_end, memory_order_acquire);
  if (resume_ns <= 0 || last == *waited_end)
    return 0;
  if (tn_yield_now() < last + resume_ns)
    return last + resume_ns;
  *waited_end = last;
  return 0;
}

int64_t tn_yield_ns(long long v, int64_t unit_ns)
{
  assert(unit_ns > 0);
  const long long hour = (long long)(INT64_C(3600000000000) / unit_ns);
  return (int64_t)(v < 0 ? 0 : v < hour ? v : hour) * unit_ns;
}

void tn_yield_policy(int64_t *pause_ns, int64_t *resume_ns)
{
  *pause_ns = tn_yield_ns(tn_config_int(TN_CFG_build_pause_ms), 1000000);
  *resume_ns = tn_yield_ns(tn_config_int(TN_CFG_build_resume_us), 1000);
}

uint64_t tn_yield_epoch(void) { return atomic_load(&yield_events); }

void tn_yield_wait(uint64_t epoch, int64_t deadline)
{
  pthread_once(&yield_once, yield_init);
  pthread_mutex_lock(&yield_mu);
  atomic_fetch_add(&yield_waiters, 1);
  if (atomic_load(&yield_events) == epoch && tn_yield_now() < deadline) {
    struct timespec ts = {(time_t)(deadline / 1000000000), (long)(deadline % 1000000000)};
    (void)pthread_cond_timedwait(&yield_cv, &yield_mu, &ts);
  }
  atomic_fetch_sub(&yield_waiters, 1);
  pthread_mutex_unlock(&yield_mu);
}

/* Whether pid exited (1, *st its status), runs still (0), or cannot be
** waited for (-1, errno). */
static int yield_reaped(pid_t pid, int *st)
{
  pid_t r = waitpid(pid, st, WNOHANG);
  if (r == pid)
    return 1;
  return r < 0 && errno != EINTR ? -1 : 0;
}

/* What a background process and its descendants got of the CPUs. */
typedef struct {
  int64_t ran;  /* ns on a CPU; -1 unknown */
  int runnable; /* one of them is running or waits for a CPU now (state R), not asleep */
} yield_cpu;

/* Adds the time of process pid and its descendants to *c: 0, or -1 when
** pid's own is unknown (it exited). Each live process counts its own
** (/proc/P/schedstat) and that of the children it has reaped (cutime and
** cstime of /proc/P/stat: a compiler driver's finished cc1 and as); live
** children are followed through /proc/P/task/P/children, depth levels
** down (one that just exited: its parent's reaped time soon). */
static int yield_tree_cpu(pid_t pid, int depth, yield_cpu *c)
{
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/schedstat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  long long ns = -1;
  if (fscanf(f, "%lld", &ns) != 1)
    ns = -1;
  fclose(f);
  if (ns < 0)
    return -1;
  c->ran += ns;
  char buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  if ((f = fopen(path, "r")) != NULL) {
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* after the command name, which may hold anything */
    char state = 0;
    long long cutime = 0, cstime = 0;
    /* fields 3.. follow: the state, then cutime and cstime are the 14th and 15th */
    if (p && sscanf(p + 1, " %c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %lld %lld", &state, &cutime,
                    &cstime) == 3) {
      long tick = sysconf(_SC_CLK_TCK);
      if (tick > 0)
        c->ran += (cutime + cstime) * (1000000000 / tick);
    }
    c->runnable |= state == 'R';
  }
  snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
  if (depth > 0 && (f = fopen(path, "r")) != NULL) {
    int child;
    while (fscanf(f, "%d", &child) == 1)
      (void)yield_tree_cpu((pid_t)child, depth - 1, c);
    fclose(f);
  }
  return 0;
}

/* The tree of a background process: a compiler driver, its cc1, as,
** collect2 and ld; a build's child and its worker. */
static yield_cpu yield_cpu_of(pid_t pid)
{
  yield_cpu c = {0, 0};
  if (yield_tree_cpu(pid, 3, &c) != 0)
    c.ran = -1;
  return c;
}

/* Whether background work that got from (yield_cpu_of) to to over
** window_ns of the time it was not stopped starved: it ran less than a
** quarter of it, and wants a CPU now (asleep, waiting for its disk or a
** lock, it does not starve). */
static int yield_starved(yield_cpu from, yield_cpu to, int64_t window_ns)
{
  return from.ran >= 0 && to.ran >= 0 && to.ran - from.ran < window_ns / 4 && to.runnable;
}

/* Kills pid's children (SIGKILL): a build's worker (tn_yield_wait_child). */
static void yield_kill_children(pid_t pid)
{
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return;
  int child;
  while (fscanf(f, "%d", &child) == 1)
    (void)kill((pid_t)child, SIGKILL);
  fclose(f);
}

/* How yield_wait treats the process it waits for. */
enum {
  YIELD_STOPS = 1,  /* its group is stopped while calls are in flight (build_pause_ms, build_resume_us) */
  YIELD_IDLE = 2,   /* its work runs in the idle class: starved while lent a thread, it is given up */
  YIELD_WORKER = 4, /* with YIELD_IDLE: that work is pid's worker (its child), given up alone: pid goes on in
                       its place at its own priority, stopped for calls */
};

/* Waits for pid, the leader of its own process group, as how says
** (tn_yield_wait_group, tn_yield_wait_child). Over each build_pause_ms of
** the time it was not stopped, the group's processes must run a quarter
** of it, or they starved: the calls lend it a thread and it is not stopped
** any more; starved again while lent (the calls run on one thread, or
** other processes take the core lent), work in the idle class is given
** up. 0 once pid exited (*st), 1 when it was killed at deadline_ns (0:
** none), 2 when it was killed for starving (YIELD_IDLE without
** YIELD_WORKER), -1 with errno on a failed wait. The group is never left
** stopped. */
static int yield_wait(pid_t pid, int64_t deadline_ns, int how, int *st)
{
  int64_t pause_ns, resume_ns;
  tn_yield_policy(&pause_ns, &resume_ns);
  const int64_t poll_ns = 5000000; /* how soon a running group's exit is seen */
  int64_t waited_end = tn_yield_last_end(), stopped_at = 0, free_until = 0;
  int64_t run_from = tn_yield_now(), run_ns = 0; /* its time not stopped since ran_from was read */
  yield_cpu ran_from = yield_cpu_of(pid);
  int rc = 0, stopped = 0, lending = 0;
  for (;;) {
    uint64_t epoch = tn_yield_epoch();
    int64_t now = tn_yield_now();
    if (!stopped) {
      run_ns += now - run_from;
      run_from = now;
    }
    if (deadline_ns > 0 && now >= deadline_ns) {
      (void)kill(-pid, SIGKILL);
      (void)kill(pid, SIGKILL); /* where it has no group (yet) */
      while (waitpid(pid, st, 0) < 0 && errno == EINTR)
        ;
      stopped = 0;
      rc = 1;
      break;
    }
    if (pause_ns > 0 && run_ns >= pause_ns) {
      yield_cpu ran = yield_cpu_of(pid);
      if (yield_starved(ran_from, ran, run_ns)) {
        if (!lending) {
          lending = 1;
          atomic_fetch_add(&yield_lent, 1);
        } else if ((how & (YIELD_IDLE | YIELD_WORKER)) == YIELD_IDLE) {
          (void)kill(-pid, SIGKILL);
          while (waitpid(pid, st, 0) < 0 && errno == EINTR)
            ;
          stopped = 0;
          rc = 2;
          break;
        } else if (how & YIELD_IDLE) {
          /* its worker starved in the idle class: pid builds in its place, stopped for calls */
          yield_kill_children(pid);
          how = YIELD_STOPS;
          lending = 0;
          atomic_fetch_sub(&yield_lent, 1);
          ran = yield_cpu_of(pid);
        }
      }
      ran_from = ran;
      run_ns = 0;
    }
    int stops = (how & YIELD_STOPS) && !lending && pause_ns > 0; /* calls stop it (a lent thread: no more) */
    int64_t until = stops && now >= free_until ? tn_yield_resume_at(resume_ns, &waited_end) : 0;
    if (!stopped) {
      int reaped = yield_reaped(pid, st);
      if (reaped != 0) {
        rc = reaped < 0 ? -1 : 0;
        break;
      }
      if (until != 0 && kill(-pid, SIGSTOP) == 0) {
        stopped = 1;
        stopped_at = now;
        continue;
      }
      if (!stops) { /* no stop to make: the calls' beginnings wake no one */
        struct timespec ts = {0, poll_ns};
        nanosleep(&ts, NULL);
      } else {
        tn_yield_wait(epoch, now + poll_ns);
      }
    } else if (until == 0 || now >= stopped_at + pause_ns) {
      (void)kill(-pid, SIGCONT);
      stopped = 0;
      run_from = now;
      if (until != 0)
        free_until = now + pause_ns; /* the pause ran out: it runs as long */
    } else {
      tn_yield_wait(epoch, until < stopped_at + pause_ns ? until : stopped_at + pause_ns);
    }
  }
  int saved = errno;
  if (stopped)
    (void)kill(-pid, SIGCONT);
  if (lending)
    atomic_fetch_sub(&yield_lent, 1);
  errno = saved;
  return rc;
}

int tn_yield_wait_group(pid_t pid, int idle, int *st)
{
  return yield_wait(pid, 0, YIELD_STOPS | (idle ? YIELD_IDLE : 0), st);
}

int tn_yield_wait_child(pid_t pid, int64_t deadline_ns, int *st)
{
  return yield_wait(pid, deadline_ns, YIELD_IDLE | YIELD_WORKER, st);
}
