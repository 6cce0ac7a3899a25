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
#include "../tn_yield.h"

#include <stdatomic.h>

static atomic_ullong yield_pauses;    /* pauses so far (build_pauses()) */

/* per build thread: its longest pause, when a pause that ran out lets it park again, how long after
** a call's end it goes on, and the end of a call it has waited that long after (no clock read then) */
static _Thread_local int64_t yield_max_ns;
static _Thread_local int64_t yield_free_until;
static _Thread_local int64_t yield_resume_ns;
static _Thread_local int64_t yield_waited_end;

/* Parks the calling thread (which holds the GIL, and releases it) while a
** call is in flight and until yield_resume_ns after the last one ended, at
** most yield_max_ns. */
static void yield_park(void)
{
  int64_t start = tn_yield_now();
  if (start < yield_free_until)
    return;
  int64_t end = start + yield_max_ns;
  int ran_out = 0;
  atomic_fetch_add_explicit(&yield_pauses, 1, memory_order_relaxed);
  Py_BEGIN_ALLOW_THREADS
  for (;;) {
    /* a call in flight: until it ends; after one: until resume time */
    uint64_t epoch = tn_yield_epoch();
    int64_t until = tn_yield_resume_at(yield_resume_ns, &yield_waited_end);
    if (until == 0)
      break;
    if (tn_yield_now() >= end) {
      ran_out = 1;
      break;
    }
    tn_yield_wait(epoch, until < end ? until : end);
  }
  Py_END_ALLOW_THREADS
  if (ran_out)
    yield_free_until = tn_yield_now() + yield_max_ns;
}

static int yield_profile(PyObject *obj, PyFrameObject *frame, int what, PyObject *arg)
{
  (void)obj;
  (void)frame;
  (void)what;
  (void)arg;
  /* a thread with a call of its own in flight would wait for itself */
  if (tn_yield_resume_at(yield_resume_ns, &yield_waited_end) != 0 && !tn_hook_active)
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
  int64_t max_ns, resume_ns;
  tn_yield_policy(&max_ns, &resume_ns);  /* the tunables table's, where not given */
  long long ms = -1, resume_us = -1;
  if (!PyArg_ParseTuple(args, "|LL:build_yield", &ms, &resume_us))
    return NULL;
  Py_ssize_t given = PyTuple_GET_SIZE(args);
  if ((given >= 1 && ms < 0) || (given >= 2 && resume_us < 0)) {
    PyErr_SetString(PyExc_ValueError, given >= 1 && ms < 0 ? "build_yield: max_ms must be >= 0"
                                                           : "build_yield: resume_us must be >= 0");
    return NULL;
  }
  if (given >= 1)
    max_ns = tn_yield_ns(ms, 1000000);
  if (given >= 2)
    resume_ns = tn_yield_ns(resume_us, 1000);
  yield_max_ns = max_ns;
  yield_free_until = 0;
  yield_resume_ns = resume_ns;
  yield_waited_end = tn_yield_last_end();
  PyEval_SetProfile(max_ns > 0 ? yield_profile : NULL, NULL);
  Py_RETURN_NONE;
}

/* build_pauses() -> how many times build threads paused for calls */
static PyObject *py_build_pauses(PyObject *self, PyObject *unused)
{
  (void)self;
  (void)unused;
  return PyLong_FromUnsignedLongLong(atomic_load(&yield_pauses));
}

/* build_calls() -> (calls in flight on other threads now, calls begun so
** far): a build's measurement counts a sample only when no jitted call ran
** beside it. The calling thread's own calls are not beside it: a build
** made inside its call (compile_blocking) measures while that call waits
** for it, and counting it discarded every sample (MAX_ROUNDS of each). */
static PyObject *py_build_calls(PyObject *self, PyObject *unused)
{
  (void)self;
  (void)unused;
  return Py_BuildValue("(iK)", tn_yield_beside(), (unsigned long long)tn_yield_begun());
}

/* build_omp_threads(n) -> the calling thread's OpenMP threads before, or
** None where torch's OpenMP runtime is not registered (build_lend_with):
** sets this thread's count, and MKL's for this thread (the OpenMP ICV is
** per thread: other threads keep theirs; tn_yield_omp_threads). n >= 1. */
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
  int before = tn_yield_omp_threads((int)n);
  if (before < 0)
    Py_RETURN_NONE;
  return PyLong_FromLong(before);
}

/* build_wait_child(pid, timeout_s) -> waitpid's status, or None when the
** child was killed at timeout_s: waits, without the GIL, for a build's
** child process (the leader of its group); where its worker starves in
** the idle class, calls lend it a thread, and where it starves still, the
** worker is killed and the child builds at its own priority, stopped for
** calls (tn_yield_wait_child). ValueError for a pid
** below 1 or a negative timeout_s (0: none); OSError on a failed wait. */
static PyObject *py_build_wait_child(PyObject *self, PyObject *args)
{
  (void)self;
  long long pid;
  double timeout_s;
  if (!PyArg_ParseTuple(args, "Ld:build_wait_child", &pid, &timeout_s))
    return NULL;
  if (pid < 1 || pid > INT32_MAX || !(timeout_s >= 0) || timeout_s > 1e9) {
    PyErr_SetString(PyExc_ValueError, pid < 1 || pid > INT32_MAX ? "build_wait_child: pid must be a process id"
                                                                 : "build_wait_child: timeout_s must be in 0..1e9");
    return NULL;
  }
  int st = 0, rc;
  Py_BEGIN_ALLOW_THREADS
  int64_t deadline = timeout_s > 0 ? tn_yield_now() + (int64_t)(timeout_s * 1e9) : 0;
  rc = tn_yield_wait_child((pid_t)pid, deadline, &st);
  Py_END_ALLOW_THREADS
  if (rc < 0)
    return PyErr_SetFromErrno(PyExc_OSError);
  if (rc == 1)
    Py_RETURN_NONE;
  return PyLong_FromLong(st);
}

/* build_lend_with(omp_set_num_threads, omp_get_max_threads,
** mkl_set_num_threads_local) -> None: the addresses (ints; 0: none) through
** which calls lend a thread to a starved build's child (tn_yield.h). */
static PyObject *py_build_lend_with(PyObject *self, PyObject *args)
{
  (void)self;
  unsigned long long set, get, mkl;
  if (!PyArg_ParseTuple(args, "KKK:build_lend_with", &set, &get, &mkl))
    return NULL;
  tn_yield_lend_with(set && get ? (void (*)(int))(uintptr_t)set : NULL, set && get ? (int (*)(void))(uintptr_t)get : NULL,
                     mkl ? (int (*)(int))(uintptr_t)mkl : NULL);
  Py_RETURN_NONE;
}

/* build_busy() -> (ns so far in which some jitted call was in flight or
** had ended less than build_resume_us before, now in ns on the same clock):
** the time a build that gives way could not run (tn_yield_busy_ns) */
static PyObject *py_build_busy(PyObject *self, PyObject *unused)
{
  (void)self;
  (void)unused;
  return Py_BuildValue("(LL)", (long long)tn_yield_busy_ns(), (long long)tn_yield_now());
}

PyMethodDef tn_py_yield_methods[] = {
  {"build_busy", py_build_busy, METH_NOARGS,
   "build_busy() -> (ns so far some jitted call was in flight or had ended less than build_resume_us before, "
   "now in ns): the share of a stretch a paused build could not use"},
  {"build_lend_with", py_build_lend_with, METH_VARARGS,
   "build_lend_with(omp_set_num_threads, omp_get_max_threads, mkl_set_num_threads_local): addresses (0: none) "
   "through which calls lend a thread to a starved build's child"},
  {"build_wait_child", py_build_wait_child, METH_VARARGS,
   "build_wait_child(pid, timeout_s) -> waitpid status, None when killed at timeout_s (0: none); a starved "
   "worker of the child is lent a thread of the calls, then killed: the child builds at our priority"},
  {"build_omp_threads", py_build_omp_threads, METH_O,
   "build_omp_threads(n) -> this thread's OpenMP threads before (None: no OpenMP runtime registered); sets them, "
   "and MKL's for this thread, to n"},
  {"build_yield", py_build_yield, METH_VARARGS,
   "build_yield(max_ms=build_pause_ms, resume_us=build_resume_us): this thread (a build) pauses while a jitted "
   "call is in flight and until resume_us after the last one ended, at most max_ms at a time; max_ms 0 ends it"},
  {"build_pauses", py_build_pauses, METH_NOARGS, "build_pauses() -> how many times builds paused for calls"},
  {"build_calls", py_build_calls, METH_NOARGS,
   "build_calls() -> (jitted calls in flight on other threads now, jitted calls begun so far on all)"},
  {NULL, NULL, 0, NULL},
};
