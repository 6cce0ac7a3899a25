/*
** Served calls, and the background work that gives way to them (see
** tn_yield.h).
*/
#include "tn_yield.h"
#include "tn_config.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

static atomic_int yield_calls;       /* calls in flight, all threads */
static atomic_ullong yield_begun;    /* calls begun so far */
static atomic_llong yield_last_end;  /* when the last call ended (tn_yield_now) */
static atomic_ullong yield_events;   /* calls begun and ended so far (tn_yield_epoch) */
static atomic_int yield_waiters;     /* threads in tn_yield_wait */
static _Thread_local int yield_mine; /* calls in flight on this thread */
static pthread_mutex_t yield_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t yield_cv;
static pthread_once_t yield_once = PTHREAD_ONCE_INIT;

static void yield_init(void)
{
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(&yield_cv, &a);
  pthread_condattr_destroy(&a);
}

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

void tn_yield_call_begin(void)
{
  atomic_fetch_add_explicit(&yield_begun, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&yield_calls, 1, memory_order_acq_rel);
  yield_mine++;
  yield_wake();
}

void tn_yield_call_end(void)
{
  assert(yield_mine > 0);
  yield_mine--;
  atomic_store_explicit(&yield_last_end, tn_yield_now(), memory_order_release);
  atomic_fetch_sub_explicit(&yield_calls, 1, memory_order_acq_rel);
  yield_wake();
}

int tn_yield_in_flight(void) { return atomic_load_explicit(&yield_calls, memory_order_acquire); }

int tn_yield_beside(void) { return atomic_load_explicit(&yield_calls, memory_order_acquire) - yield_mine; }

uint64_t tn_yield_begun(void) { return atomic_load_explicit(&yield_begun, memory_order_relaxed); }

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
