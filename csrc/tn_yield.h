/*
** Served calls, and the background work that gives way to them.
**
** A call of a jitted function (JitFunction), and a run of a compiled
** plan (either door), is a served call from its start to its end.
** Background work of torchneuron_jit (a jit build's
** Python: tracer/yield_py.c; a tier-2 compiler process:
** neuron_backend/tier2.c) pauses while one is in flight and until a little
** after the last one ended (build_resume_us), at most build_pause_ms at a
** time. Pure C, any thread: the counters are atomic, waits hold no lock of
** the caller's and must be made without the GIL.
*/
#ifndef TN_YIELD_H
#define TN_YIELD_H

#include <stdint.h>
#include <sys/types.h>

/* A served call starts / ends on this thread (pairs, may nest). */
void tn_yield_call_begin(void);
void tn_yield_call_end(void);

/* Served calls in flight on all threads; on threads other than this one. */
int tn_yield_in_flight(void);
int tn_yield_beside(void);

/* Served calls begun so far, all threads. */
uint64_t tn_yield_begun(void);

/* How long, in all so far (ns), a build that gives way could not run:
** some served call was in flight, or the last one had ended less than
** build_resume_us before (a paused build goes on only then). Over a
** stretch of time, its share says whether the calls leave gaps a build
** thread can use: generate()'s steps, ~0.3 ms apart, leave none. */
int64_t tn_yield_busy_ns(void);

/* CLOCK_MONOTONIC in ns. */
int64_t tn_yield_now(void);

/* When background work that gives way may go on: 0 when it may now (no
** call in flight on another thread, none waits for its own; and the last
** one ended resume_ns ago or more, or it is the end *waited_end notes:
** each end is waited for once, no clock read after that), else the time
** to wait until (INT64_MAX: a call in flight). */
int64_t tn_yield_resume_at(int64_t resume_ns, int64_t *waited_end);

/* The end of the last served call (tn_yield_now's clock; 0: none yet). */
int64_t tn_yield_last_end(void);

/* v (a count of unit ns: a tunable in ms or us) in ns: negative as 0,
** longer than an hour as an hour (no overflow). */
int64_t tn_yield_ns(long long v, int64_t unit_ns);

/* The tunables table's build_pause_ms and build_resume_us, in ns
** (tn_yield_ns): how long background work pauses at most, and how long
** after the last call's end it goes on. */
void tn_yield_policy(int64_t *pause_ns, int64_t *resume_ns);

/* A number that changes each time a served call begins or ends. */
uint64_t tn_yield_epoch(void);

/* Waits until a served call begins or ends after tn_yield_epoch() gave
** epoch (at once if one did), or until deadline (tn_yield_now's clock),
** whichever comes first; may return early. Read epoch before the state
** that made you wait: no change in between is missed. */
void tn_yield_wait(uint64_t epoch, int64_t deadline);

/* Waits for process pid, the leader of its own process group (a tier-2
** compiler), to exit, giving way to served calls: the group is stopped
** (SIGSTOP) while a call is in flight and until build_resume_us after the
** last one ended, at most build_pause_ms at a time, after which it runs as
** long. Over each build_pause_ms of the time it was not stopped, it must
** run a quarter of it, or it starved (calls in flight on every core back
** to back, or other processes' work: the idle class gets no core): the
** calls lend it a thread until it exits, as tn_yield_wait_child does, and
** it is not stopped any more. idle: it runs in the idle class, where a
** thread lent may not help (calls on one thread; other processes take the
** core): starved again while lent, the group is killed and 2 returned, for
** the caller to run it again at its own priority.
** Returns 0 with *st (waitpid's status) once it exited, 2 (idle) when it
** was killed for starving (waited for, *st), -1 with errno on a failed
** wait. The group is never left stopped. Call without the GIL. */
int tn_yield_wait_group(pid_t pid, int idle, int *st);

/* Waits for process pid (a jit build's child, the leader of its own
** process group) to exit. pid builds in a child of its own in the idle
** class (its worker), which runs where the calls leave a core free; where
** the worker is killed (SIGKILL), pid builds in its place at its own
** priority. Where the worker starves (it ran less than a quarter of a
** build_pause_ms window: calls in flight on every core back to back, their
** OpenMP threads spinning between ops), the calls lend it a thread: each
** outermost call then runs its OpenMP regions, MKL and our kernel launches
** on one thread fewer. Starved again while lent (calls on one thread, or
** other processes take the core lent), the worker is killed, and pid goes
** on as tn_yield_wait_group waits for a group at our priority: stopped
** while calls are in flight, at most build_pause_ms at a time.
** deadline_ns (tn_yield_now's clock; 0: none): past it pid's group is
** killed. Returns 0 with *st (waitpid's status) once it exited, 1 when it
** was killed at the deadline (and waited for), -1 with errno on a failed
** wait. Call without the GIL. */
int tn_yield_wait_child(pid_t pid, int64_t deadline_ns, int *st);

/* The OpenMP runtime's omp_set_num_threads and omp_get_max_threads, and
** MKL's mkl_set_num_threads_local (NULL: none), through which calls lend
** a thread (PyTorch's: found by the Python side). Without them nothing is
** lent. */
void tn_yield_lend_with(void (*omp_set)(int), int (*omp_get)(void), int (*mkl_local)(int));

/* Threads this thread's call lends to a build's child now (0: none). */
int tn_yield_lending(void);

/* Sets this thread's OpenMP thread count, and MKL's count for this
** thread, to n (>= 1; other threads keep theirs) through the runtime
** tn_yield_lend_with registered: the OpenMP count before, or -1 where none
** is registered. MKL's too: its count is process-wide otherwise
** (torch.set_num_threads'), and its VML functions (torch.exp) opened a
** parallel region of that many threads on a forked child's main thread,
** whose team in the parent the child does not have: it waited for it
** forever. */
int tn_yield_omp_threads(int n);

/* In a forked child of this process (once tn_yield_lend_with registered
** MKL), sets this thread's MKL count to 1, and leaves it there; elsewhere
** does nothing (a load). Our kernels call it before they run: the MKL
** functions they call for eager's bits (vmsTanh ...) and its sgemm open
** an OpenMP parallel region of MKL's count for 200 values or more, and in
** a child forked after the parent ran one, that region waits forever for
** the parent's threads. (torch.set_num_threads(2) sets MKL's count above
** its default, the physical cores: 1 on a 2-vCPU machine.) */
void tn_yield_mkl_serial_in_child(void);

#endif
