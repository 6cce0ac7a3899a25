/*
** Background builds give way to jitted calls (tracer.h).
**
** A build of jit is Python (make_fx, lowering) on a thread of its own. On
** CPython a thread that keeps the GIL busy costs every other thread a wait
** of up to the switch interval (5 ms) each time it takes the GIL back, and
** a model's call takes it back after each PyTorch op (they release it): an
** eager BERT call of 5.6 ms took 470 ms beside a thread running Python.
** So the build thread pauses: a C profile function on it (called at each
** Python call and return, a load and a compare when nothing is in flight)
** parks it, the GIL released, while any call of a JitFunction is in flight
** on another thread, until none is or build_pause_ms passed. After a pause
** that ran out, it runs as long without pausing: calls that never stop
** (several serving threads) slow a build down, they do not starve it.
** One thread serving calls back to back (microseconds between them) does:
** each pause ends between two calls, and the build waits for a gap (240
** such calls of a TransformerEncoder kept it parked to their end). Letting
** it run beside the calls, or take turns in which calls wait, was tried:
** its ~1 s of symbolic trace then took 4-11 s and the loop 1.3-1.9x its
** time over 700-1500 calls (2 cores), the GIL and the cores shared.
**
** A pause ends build_resume_us after the last call ended, not at once: a
** build woken as a call returns takes the GIL from the serving thread's
** next lines (the caller's own Python), which then wait for it ~10 ms,
** two switch intervals (an eager TransformerEncoder call of 10 ms timed
** from Python at 20.8 ms beside a paused Python loop; with 1 ms more of
** pause, 10.0 ms).
**
** A build's own PyTorch ops run on one OpenMP thread (build_omp_threads):
** GNU OpenMP keeps a team of threads for each thread that ran a parallel
** region, alive until that thread ends, and while there are more of them
** than cores it stops spinning for work: every parallel region of a call
** then wakes its threads from sleep. A second team, idle, made an eager
** TransformerEncoder call 1.12-1.20x slower (2 cores). Its measurements of
** GEMMs run on a thread of their own, with the calls' threads, that ends
** with them (gemm.measured_with).
*/
#include "tracer_internal.h"
#include "../tn_config.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

static atomic_int yield_calls;        /* JitFunction calls in flight, all threads */
static atomic_ullong yield_begun;     /* JitFunction calls begun so far (build_calls()) */
static atomic_int yield_parked;       /* build threads parked now */
static atomic_ullong yield_pauses;    /* pauses so far (build_pauses()) */
static atomic_llong yield_last_end;   /* when the last JitFunction call ended (yield_now) */
static pthread_mutex_t yield_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t yield_cv;
static pthread_once_t yield_once = PTHREAD_ONCE_INIT;

/* per build thread: its longest pause, when a pause that ran out lets it park again, how long after
** a call's end it goes on, and the end of a call it has waited that long after (no clock read then) */
static _Thread_local int64_t yield_max_ns;
static _Thread_local int64_t yield_free_until;
static _Thread_local int64_t yield_resume_ns;
static _Thread_local int64_t yield_waited_end;

static void yield_init(void)
{
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(&yield_cv, &a);
  pthread_condattr_destroy(&a);
}

static int64_t yield_now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void tn_yield_call_begin(void)
{
  atomic_fetch_add_explicit(&yield_begun, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&yield_calls, 1, memory_order_relaxed);
}

void tn_yield_call_end(void)
{
  atomic_store_explicit(&yield_last_end, yield_now(), memory_order_release);
  if (atomic_fetch_sub_explicit(&yield_calls, 1, memory_order_acq_rel) == 1 &&
      atomic_load_explicit(&yield_parked, memory_order_acquire) > 0) {
    pthread_mutex_lock(&yield_mu);
    pthread_cond_broadcast(&yield_cv);
    pthread_mutex_unlock(&yield_mu);
  }
}

/* When this build thread may go on after the last call's end (0: it may). */
static int64_t yield_resume_at(void)
{
  int64_t last = atomic_load_explicit(&yield_last_end, memory_order_acquire);
  if (yield_resume_ns == 0 || last == yield_waited_end)
    return 0;
  if (yield_now() < last + yield_resume_ns)
    return last + yield_resume_ns;
  yield_waited_end = last;
  return 0;
}

/* Parks the calling thread (which holds the GIL, and releases it) while a
** call is in flight and until yield_resume_ns after the last one ended, at
** most yield_max_ns. */
static void yield_park(void)
{
  int64_t start = yield_now();
  if (start < yield_free_until)
    return;
  int64_t end = start + yield_max_ns;
  int ran_out = 0;
  atomic_fetch_add_explicit(&yield_pauses, 1, memory_order_relaxed);
  Py_BEGIN_ALLOW_THREADS
  pthread_mutex_lock(&yield_mu);
  atomic_fetch_add_explicit(&yield_parked, 1, memory_order_acq_rel);
  for (;;) {
    /* a call in flight: until it ends (tn_yield_call_end signals); after one: until resume time */
    int64_t until = atomic_load_explicit(&yield_calls, memory_order_acquire) > 0 ? end : yield_resume_at();
    if (until == 0)
      break;
    if (yield_now() >= end) {
      ran_out = 1;
      break;
    }
    until = until < end ? until : end;
    struct timespec ts = {(time_t)(until / 1000000000), (long)(until % 1000000000)};
    (void)pthread_cond_timedwait(&yield_cv, &yield_mu, &ts);
  }
  atomic_fetch_sub_explicit(&yield_parked, 1, memory_order_acq_rel);
  pthread_mutex_unlock(&yield_mu);
  Py_END_ALLOW_THREADS
  if (ran_out)
    yield_free_until = yield_now() + yield_max_ns;
}

static int yield_profile(PyObject *obj, PyFrameObject *frame, int what, PyObject *arg)
{
  (void)obj;
  (void)frame;
  (void)what;
  (void)arg;
  /* a thread with a call of its own in flight would wait for itself */
  if ((atomic_load_explicit(&yield_calls, memory_order_relaxed) > 0 || yield_resume_at() != 0) && !tn_hook_active)
    yield_park();
  return 0;
}

/* build_yield(max_ms=build_pause_ms, resume_us=build_resume_us) -> None:
** the calling thread (a build) pauses while a jitted call is in flight and
** until resume_us after the last one ended, at most max_ms at a time (the
** tunables table's values where not given, negative ones as 0); max_ms 0
** ends it (and removes the thread's profile function). ValueError for a
** negative argument. */
static PyObject *py_build_yield(PyObject *self, PyObject *args)
{
  (void)self;
  long long ms = tn_config_int(TN_CFG_build_pause_ms), resume_us = tn_config_int(TN_CFG_build_resume_us);
  ms = ms < 0 ? 0 : ms;
  resume_us = resume_us < 0 ? 0 : resume_us;
  if (!PyArg_ParseTuple(args, "|LL:build_yield", &ms, &resume_us))
    return NULL;
  if (ms < 0 || resume_us < 0) {
    PyErr_SetString(PyExc_ValueError, ms < 0 ? "build_yield: max_ms must be >= 0"
                                             : "build_yield: resume_us must be >= 0");
    return NULL;
  }
  pthread_once(&yield_once, yield_init);
  const long long hour_ms = 3600000;  /* longer is an hour: no overflow of the ns below */
  yield_max_ns = (int64_t)(ms < hour_ms ? ms : hour_ms) * 1000000;
  yield_free_until = 0;
  yield_resume_ns = (int64_t)(resume_us < hour_ms * 1000 ? resume_us : hour_ms * 1000) * 1000;
  yield_waited_end = atomic_load_explicit(&yield_last_end, memory_order_acquire);
  PyEval_SetProfile(ms > 0 ? yield_profile : NULL, NULL);
  Py_RETURN_NONE;
}

/* build_pauses() -> how many times build threads paused for calls */
static PyObject *py_build_pauses(PyObject *self, PyObject *unused)
{
  (void)self;
  (void)unused;
  return PyLong_FromUnsignedLongLong(atomic_load(&yield_pauses));
}

/* build_calls() -> (calls in flight now, calls begun so far): a build's
** measurement counts a sample only when no jitted call ran beside it */
static PyObject *py_build_calls(PyObject *self, PyObject *unused)
{
  (void)self;
  (void)unused;
  return Py_BuildValue("(iK)", atomic_load(&yield_calls), (unsigned long long)atomic_load(&yield_begun));
}

/* build_omp_threads(n) -> the calling thread's OpenMP threads before, or
** None where no OpenMP runtime is loaded: sets this thread's count (the
** OpenMP ICV is per thread: other threads keep theirs). n >= 1. */
static PyObject *py_build_omp_threads(PyObject *self, PyObject *arg)
{
  (void)self;
  long n = PyLong_AsLong(arg);
  if (n == -1 && PyErr_Occurred())
    return NULL;
  if (n < 1 || n > 4096) {
    PyErr_SetString(PyExc_ValueError, "build_omp_threads: n must be in 1..4096");
    return NULL;
  }
  void (*set)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "omp_set_num_threads");
  int (*get)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "omp_get_max_threads");
  if (set == NULL || get == NULL)
    Py_RETURN_NONE;
  int before = get();
  set((int)n);
  return PyLong_FromLong(before);
}

PyMethodDef tn_py_yield_methods[] = {
  {"build_omp_threads", py_build_omp_threads, METH_O,
   "build_omp_threads(n) -> this thread's OpenMP threads before (None: no OpenMP runtime); sets them to n"},
  {"build_yield", py_build_yield, METH_VARARGS,
   "build_yield(max_ms=build_pause_ms, resume_us=build_resume_us): this thread (a build) pauses while a jitted "
   "call is in flight and until resume_us after the last one ended, at most max_ms at a time; max_ms 0 ends it"},
  {"build_pauses", py_build_pauses, METH_NOARGS, "build_pauses() -> how many times builds paused for calls"},
  {"build_calls", py_build_calls, METH_NOARGS,
   "build_calls() -> (jitted calls in flight now, jitted calls begun so far), all threads"},
  {NULL, NULL, 0, NULL},
};
