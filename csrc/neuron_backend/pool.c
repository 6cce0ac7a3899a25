/*
** Thread pool (see pool.h).
*/
#include "pool.h"

#include <pthread.h>

#include "../tn_yield.h"

#define POOL_MAX 64

static pthread_mutex_t pool_run_mu = PTHREAD_MUTEX_INITIALIZER; /* one job at a time */
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;     /* the fields below */
static pthread_cond_t pool_work = PTHREAD_COND_INITIALIZER;
static pthread_cond_t pool_done = PTHREAD_COND_INITIALIZER;
static int pool_workers;
static unsigned long pool_generation;
static int pool_pending;
static void (*pool_fn)(void *, int, int);
static void *pool_ctx;
static int pool_nparts;
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
/* generation at each worker's creation: a worker that only gets to run
** after the first job was published must still see that job */
static unsigned long pool_born[POOL_MAX];

static void pool_forget_openmp(void);

/* A forked child has none of the parent's threads: neither ours nor the
** OpenMP runtime's (whose next parallel region would wait for them
** forever), so it starts over with a pool of its own. */
static void pool_atfork_child(void)
{
  pool_forget_openmp();
  pthread_mutex_init(&pool_run_mu, NULL);
  pthread_mutex_init(&pool_mu, NULL);
  pthread_cond_init(&pool_work, NULL);
  pthread_cond_init(&pool_done, NULL);
  pool_workers = 0;
  pool_pending = 0;
}

static void pool_register_atfork(void)
{
  pthread_atfork(NULL, NULL, pool_atfork_child);
}

static void *pool_worker(void *arg)
{
  int me = (int)(long)arg; /* worker i runs part i + 1 */
  tn_yield_mkl_serial_in_child(); /* started in a forked child: MKL's functions its parts call, serially */
  pthread_mutex_lock(&pool_mu);
  unsigned long seen = pool_born[me];
  for (;;) {
    while (pool_generation == seen)
      pthread_cond_wait(&pool_work, &pool_mu);
    seen = pool_generation;
    void (*fn)(void *, int, int) = pool_fn;
    void *ctx = pool_ctx;
    int nparts = pool_nparts;
    pthread_mutex_unlock(&pool_mu);
    if (me + 1 < nparts)
      fn(ctx, me + 1, nparts);
    pthread_mutex_lock(&pool_mu);
    if (--pool_pending == 0)
      pthread_cond_signal(&pool_done);
  }
  return NULL;
}

/* -- On an OpenMP runtime ----------------------------------------------- */

typedef void (*gomp_parallel_fn)(void (*body)(void *), void *data, unsigned nthreads, unsigned flags);
static gomp_parallel_fn pool_gomp;
static int (*pool_omp_thread)(void);
static int (*pool_omp_threads)(void);

typedef struct gomp_job {
  void (*gj_fn)(void *, int, int);
  void *gj_ctx;
  int gj_nparts;
} gomp_job;

/* Each member of the team runs the parts congruent to its number (the
** team may be smaller than asked). */
static void pool_gomp_body(void *data)
{
  const gomp_job *j = data;
  int team = pool_omp_threads();
  for (int part = pool_omp_thread(); part < j->gj_nparts; part += team > 0 ? team : 1)
    j->gj_fn(j->gj_ctx, part, j->gj_nparts);
}

static void pool_forget_openmp(void)
{
  pool_gomp = NULL;
}

void tn_pool_use_openmp(void *gomp_parallel, void *thread_num, void *num_threads)
{
  int all = gomp_parallel && thread_num && num_threads;
  pthread_once(&pool_once, pool_register_atfork);
  pool_gomp = all ? (gomp_parallel_fn)gomp_parallel : NULL;
  pool_omp_thread = all ? (int (*)(void))thread_num : NULL;
  pool_omp_threads = all ? (int (*)(void))num_threads : NULL;
}

int tn_pool_run(void (*fn)(void *ctx, int part, int nparts), void *ctx, int nparts)
{
  if (nparts > POOL_MAX)
    nparts = POOL_MAX;
  if (nparts <= 1) {
    fn(ctx, 0, 1);
    return 1;
  }
  if (pool_gomp) {
    gomp_job j = {fn, ctx, nparts};
    pool_gomp(pool_gomp_body, &j, (unsigned)nparts, 0);
    return nparts;
  }
  pthread_once(&pool_once, pool_register_atfork);
  pthread_mutex_lock(&pool_run_mu);
  pthread_mutex_lock(&pool_mu);
  while (pool_workers < nparts - 1) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pool_born[pool_workers] = pool_generation;
    int rc = pthread_create(&t, &attr, pool_worker, (void *)(long)pool_workers);
    pthread_attr_destroy(&attr);
    if (rc != 0)
      break;
    pool_workers++;
  }
  if (pool_workers == 0) {
    pthread_mutex_unlock(&pool_mu);
    pthread_mutex_unlock(&pool_run_mu);
    for (int p = 0; p < nparts; p++)
      fn(ctx, p, nparts);
    return nparts;
  }
  if (nparts > pool_workers + 1)
    nparts = pool_workers + 1;
  pool_fn = fn;
  pool_ctx = ctx;
  pool_nparts = nparts;
  pool_pending = pool_workers;
  pool_generation++;
  pthread_cond_broadcast(&pool_work);
  pthread_mutex_unlock(&pool_mu);
  fn(ctx, 0, nparts);
  pthread_mutex_lock(&pool_mu);
  while (pool_pending > 0)
    pthread_cond_wait(&pool_done, &pool_mu);
  pthread_mutex_unlock(&pool_mu);
  pthread_mutex_unlock(&pool_run_mu);
  return nparts;
}
