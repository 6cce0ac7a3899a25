/*
** Check suite of csrc/tn_yield.c: served calls counted per thread and in
** all, when background work may go on after them, and a wait that a call
** beginning on another thread ends (none missed between reading the epoch
** and waiting); the thread calls lend to a starved build's child or
** tier-2 compiler group, and a child killed at its deadline.
*/
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tn_check.h"
#include "tn_config.h"
#include "tn_yield.h"

static void sleep_ms(long ms)
{
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

typedef struct {
  int beside, in_flight;
  int64_t resume_at;
} seen;

static void *look(void *arg)
{
  seen *s = arg;
  int64_t waited = 0;
  s->beside = tn_yield_beside();
  s->in_flight = tn_yield_in_flight();
  s->resume_at = tn_yield_resume_at(1000000, &waited);
  return NULL;
}

START_TEST(test_calls_of_this_thread_are_not_beside_it)
{
  uint64_t begun = tn_yield_begun();
  tn_yield_call_begin();
  tn_yield_call_begin();  /* nested */
  ck_assert_int_eq(tn_yield_in_flight(), 2);
  ck_assert_int_eq(tn_yield_beside(), 0);
  int64_t waited = tn_yield_last_end();
  ck_assert_int_eq(tn_yield_resume_at(0, &waited), 0);  /* its own calls keep no one waiting here */
  seen s;
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, look, &s), 0);
  pthread_join(t, NULL);
  ck_assert_int_eq(s.beside, 2);
  ck_assert_int_eq(s.in_flight, 2);
  ck_assert(s.resume_at == INT64_MAX);
  tn_yield_call_end();
  tn_yield_call_end();
  ck_assert_int_eq(tn_yield_in_flight(), 0);
  ck_assert_uint_eq(tn_yield_begun(), begun + 2);
}
END_TEST

START_TEST(test_work_goes_on_resume_ns_after_the_last_end)
{
  tn_yield_call_begin();
  tn_yield_call_end();
  int64_t end = tn_yield_last_end(), waited = 0;
  ck_assert(end > 0 && end <= tn_yield_now());
  int64_t at = tn_yield_resume_at(200000000, &waited);  /* 200 ms */
  ck_assert(at == end + 200000000);
  ck_assert_int_eq(tn_yield_resume_at(0, &waited), 0);  /* no resume time: at once */
  sleep_ms(5);
  ck_assert_int_eq(tn_yield_resume_at(1000000, &waited), 0);  /* 1 ms after it: goes on, and notes the end */
  ck_assert(waited == end);
  ck_assert_int_eq(tn_yield_resume_at(INT64_C(3600000000000), &waited), 0);  /* an end waited for once */
}
END_TEST

static void *begin_later(void *arg)
{
  (void)arg;
  sleep_ms(50);
  tn_yield_call_begin();
  sleep_ms(20);
  tn_yield_call_end();
  return NULL;
}

START_TEST(test_a_call_beginning_ends_a_wait)
{
  pthread_t t;
  uint64_t epoch = tn_yield_epoch();
  int64_t t0 = tn_yield_now();
  ck_assert_int_eq(pthread_create(&t, NULL, begin_later, NULL), 0);
  tn_yield_wait(epoch, t0 + INT64_C(10000000000));  /* 10 s: a call begins after 50 ms */
  int64_t waited = tn_yield_now() - t0;
  pthread_join(t, NULL);
  ck_assert_msg(waited >= 40000000 && waited < 5000000000, "waited %lld ns", (long long)waited);
  ck_assert(tn_yield_epoch() >= epoch + 2);
  /* an epoch that already moved: no wait at all */
  t0 = tn_yield_now();
  tn_yield_wait(epoch, t0 + INT64_C(10000000000));
  ck_assert(tn_yield_now() - t0 < 1000000000);
  /* a deadline: back by then */
  t0 = tn_yield_now();
  tn_yield_wait(tn_yield_epoch(), t0 + 30000000);
  waited = tn_yield_now() - t0;
  ck_assert_msg(waited >= 25000000 && waited < 5000000000, "waited %lld ns", (long long)waited);
}
END_TEST

/* Test doubles of OpenMP's and MKL's thread counts. */
static int omp_threads = 4, mkl_local = 0, omp_sets, mkl_sets;
static void fake_omp_set(int n) { omp_threads = n; omp_sets++; }
static int fake_omp_get(void) { return omp_threads; }
static int fake_mkl_local(int n)
{
  int was = mkl_local;
  mkl_local = n;
  mkl_sets++;
  return was;
}

/* Whether a call beginning now on this thread lends a thread. */
static int a_call_lends(void)
{
  tn_yield_call_begin();
  int lends = tn_yield_lending();
  tn_yield_call_end();
  return lends;
}

typedef struct {
  pid_t pid;
  int64_t deadline;
  int rc, st;
} child_wait;

static void *wait_child(void *arg)
{
  child_wait *w = arg;
  w->rc = tn_yield_wait_child(w->pid, w->deadline, &w->st);
  return NULL;
}

static pid_t sleeping_child(long ms)
{
  pid_t pid = fork();
  if (pid == 0) {
    sleep_ms(ms);
    _exit(7);
  }
  ck_assert_int_gt(pid, 0);
  return pid;
}

/* Starving for real: the first CPU we may run on, a process spinning on
** it at our priority (kill it to end the starvation), and processes that
** the scheduler gives next to nothing there: pinned to it, in the idle
** class or at nice 19. */
static int first_cpu(void)
{
  cpu_set_t set;
  ck_assert_int_eq(sched_getaffinity(0, sizeof set, &set), 0);
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
    if (CPU_ISSET(cpu, &set))
      return cpu;
  ck_abort();
  return -1;
}

static void pin(int cpu)
{
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0)
    _exit(99);
}

static pid_t spinner(int cpu)
{
  pid_t pid = fork();
  if (pid == 0) {
    pin(cpu);
    for (;;)
      ;
  }
  ck_assert_int_gt(pid, 0);
  return pid;
}

static void stop_spinner(pid_t pid)
{
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

/* In this (forked) process: pinned to cpu, given next to nothing there
** (idle: in the idle class; else at nice 19), spins until ms went by on
** the clock, then exits status. */
_Noreturn static void starve_then_exit(int cpu, int idle, long ms, int status)
{
  pin(cpu);
  if (idle) {
    struct sched_param sp = {.sched_priority = 0};
    if (sched_setscheduler(0, SCHED_IDLE, &sp) != 0)
      _exit(98);
  } else if (setpriority(PRIO_PROCESS, 0, 19) != 0) {
    _exit(98);
  }
  for (int64_t t0 = tn_yield_now(); tn_yield_now() - t0 < ms * INT64_C(1000000);)
    ;
  _exit(status);
}

START_TEST(test_a_starved_child_is_lent_a_thread_by_each_outermost_call)
{
  char err[128];
  tn_config_init();  /* build_pause_ms: the window a starved child is seen in */
  ck_assert_int_eq(tn_config_set_int(tn_config_find("build_pause_ms"), 300, err, sizeof err), 0);
  tn_yield_lend_with(fake_omp_set, fake_omp_get, fake_mkl_local);
  int cpu = first_cpu();
  pid_t spin = spinner(cpu);
  /* a child the spinner leaves next to nothing of its CPU for longer than a window is starved */
  pid_t pid = fork();
  if (pid == 0)
    starve_then_exit(cpu, 1, 450, 7);
  child_wait w = {pid, 0, -2, 0};
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, wait_child, &w), 0);
  sleep_ms(450);
  tn_yield_call_begin();
  ck_assert_int_eq(tn_yield_lending(), 1);
  ck_assert_int_eq(omp_threads, 3);
  ck_assert_int_eq(mkl_local, 3);
  tn_yield_call_begin();  /* nested: the outer call lends already */
  ck_assert_int_eq(omp_sets, 1);
  tn_yield_call_end();
  tn_yield_call_end();
  ck_assert_int_eq(tn_yield_lending(), 0);
  ck_assert_int_eq(omp_threads, 4);
  ck_assert_int_eq(mkl_local, 0);  /* MKL's own count back to the global one */
  stop_spinner(spin);  /* the child runs: it exits before the window that would give it up */
  pthread_join(t, NULL);
  ck_assert_int_eq(w.rc, 0);
  ck_assert(WIFEXITED(w.st) && WEXITSTATUS(w.st) == 7);
  /* the child exited: nothing is lent any more */
  omp_sets = 0;
  tn_yield_call_begin();
  ck_assert_int_eq(tn_yield_lending(), 0);
  tn_yield_call_end();
  ck_assert_int_eq(omp_sets, 0);
  tn_yield_lend_with(NULL, NULL, NULL);
  tn_config_init();
}
END_TEST

START_TEST(test_a_child_asleep_is_not_starved)
{
  char err[128];
  tn_config_init();
  ck_assert_int_eq(tn_config_set_int(tn_config_find("build_pause_ms"), 50, err, sizeof err), 0);
  tn_yield_lend_with(fake_omp_set, fake_omp_get, fake_mkl_local);
  /* it runs nothing for 8 windows, but never waits for a CPU: waiting on its disk is not starving */
  child_wait w = {sleeping_child(400), 0, -2, 0};
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, wait_child, &w), 0);
  sleep_ms(250);
  ck_assert_int_eq(a_call_lends(), 0);
  pthread_join(t, NULL);
  ck_assert_int_eq(w.rc, 0);
  ck_assert(WIFEXITED(w.st) && WEXITSTATUS(w.st) == 7);
  tn_yield_lend_with(NULL, NULL, NULL);
  tn_config_init();
}
END_TEST

START_TEST(test_a_childs_worker_starved_while_lent_is_killed_and_the_child_goes_on)
{
  char err[128];
  tn_config_init();
  ck_assert_int_eq(tn_config_set_int(tn_config_find("build_pause_ms"), 100, err, sizeof err), 0);
  int cpu = first_cpu();
  pid_t spin = spinner(cpu);
  /* a build's child as _jit.py's: a group of its own, its worker in the idle class; killed, it goes on */
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    pid_t worker = fork();
    if (worker == 0)
      starve_then_exit(cpu, 1, 20000, 7);
    int st = 0;
    while (waitpid(worker, &st, 0) < 0)
      ;
    _exit(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL ? 9 : 7);
  }
  ck_assert_int_gt(pid, 0);
  setpgid(pid, pid);
  child_wait w = {pid, tn_yield_now() + INT64_C(20000000000), -2, 0};
  int64_t t0 = tn_yield_now();
  wait_child(&w);  /* no call lends it a thread (none in flight): starved a second time, it is given up */
  stop_spinner(spin);
  ck_assert_int_eq(w.rc, 0);
  ck_assert_msg(WIFEXITED(w.st) && WEXITSTATUS(w.st) == 9, "status %d", w.st);
  ck_assert(tn_yield_now() - t0 < INT64_C(10000000000));
  tn_config_init();
}
END_TEST

START_TEST(test_a_child_past_its_deadline_is_killed)
{
  child_wait w = {sleeping_child(20000), tn_yield_now() + 100000000, -2, 0};
  int64_t t0 = tn_yield_now();
  wait_child(&w);
  ck_assert_int_eq(w.rc, 1);
  ck_assert(WIFSIGNALED(w.st) && WTERMSIG(w.st) == SIGKILL);
  ck_assert(tn_yield_now() - t0 < 5000000000);
  ck_assert_int_eq(waitpid(w.pid, NULL, WNOHANG), -1);  /* reaped */
}
END_TEST

typedef struct {
  pid_t pid;
  int idle, rc, st;
} group_wait;

static void *wait_group(void *arg)
{
  group_wait *w = arg;
  w->rc = tn_yield_wait_group(w->pid, w->idle, &w->st);
  return NULL;
}

/* A process group's leader (as a tier-2 compiler driver is) whose child
** sleeps (runs nothing), spins (runs), or starves (pinned beside a
** spinner: at nice 19, or idle, in the idle class) ms, then exits 7. */
enum { ASLEEP, SPINS, STARVES, STARVES_IDLE };
static pid_t group_with_a_child(long ms, int how, int cpu)
{
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    pid_t child = fork();
    if (child == 0) {
      if (how == STARVES || how == STARVES_IDLE)
        starve_then_exit(cpu, how == STARVES_IDLE, ms, 0);
      if (how == ASLEEP)
        sleep_ms(ms);
      for (int64_t t0 = tn_yield_now(); how == SPINS && tn_yield_now() - t0 < ms * INT64_C(1000000);)
        ;
      _exit(0);
    }
    while (waitpid(child, NULL, 0) < 0)
      ;
    _exit(7);
  }
  ck_assert_int_gt(pid, 0);
  setpgid(pid, pid);
  return pid;
}

/* A call held in flight on a thread of its own for ms: beside every other. */
static void *call_in_flight(void *arg)
{
  tn_yield_call_begin();
  sleep_ms((long)(intptr_t)arg);
  tn_yield_call_end();
  return NULL;
}

/* A group (group_with_a_child(ms, how)) waited for on thread *t while a
** call is in flight beside it on thread *call, with build_pause_ms 100
** and fake thread counts to lend; a spinner on the CPU a starving group
** is pinned to. */
typedef struct {
  pthread_t call, t;
  group_wait w;
  pid_t spin;
} group_beside;

static void group_beside_a_call(group_beside *g, long ms, int how)
{
  char err[128];
  tn_config_init();
  ck_assert_int_eq(tn_config_set_int(tn_config_find("build_pause_ms"), 100, err, sizeof err), 0);
  tn_yield_lend_with(fake_omp_set, fake_omp_get, fake_mkl_local);
  int cpu = first_cpu();
  g->spin = how == STARVES || how == STARVES_IDLE ? spinner(cpu) : 0;
  ck_assert_int_eq(pthread_create(&g->call, NULL, call_in_flight, (void *)(intptr_t)900), 0);
  sleep_ms(20);
  g->w = (group_wait){group_with_a_child(ms, how, cpu), how == STARVES_IDLE, -2, 0};
  ck_assert_int_eq(pthread_create(&g->t, NULL, wait_group, &g->w), 0);
}

/* Its wait returned rc (the group's exit, 7, where 0); then the call
** ends, and the fakes and the tunables are put back. */
static void group_beside_done(group_beside *g, int rc)
{
  pthread_join(g->t, NULL);
  if (g->spin)
    stop_spinner(g->spin);
  ck_assert_int_eq(g->w.rc, rc);
  if (rc == 0)
    ck_assert(WIFEXITED(g->w.st) && WEXITSTATUS(g->w.st) == 7);
  else
    ck_assert(WIFSIGNALED(g->w.st) && WTERMSIG(g->w.st) == SIGKILL);
  ck_assert_int_eq(a_call_lends(), 0);  /* it exited: nothing lent */
  pthread_join(g->call, NULL);
  tn_yield_lend_with(NULL, NULL, NULL);
  tn_config_init();
}

START_TEST(test_a_group_starved_after_its_pause_ran_out_is_lent_a_thread)
{
  group_beside g;
  /* stopped for the 100 ms pause while the call goes on, then run 100 ms: at nice 19 beside a spinner, it
     ran next to nothing */
  group_beside_a_call(&g, 600, STARVES);
  sleep_ms(50);
  ck_assert_int_eq(a_call_lends(), 0);
  sleep_ms(300);
  ck_assert_int_eq(a_call_lends(), 1);
  ck_assert_int_eq(omp_threads, 4);
  stop_spinner(g.spin);
  g.spin = 0;
  group_beside_done(&g, 0);  /* not in the idle class: lent, never given up */
}
END_TEST

START_TEST(test_an_idle_group_starved_while_lent_is_killed)
{
  group_beside g;
  /* stopped 100 ms, run 100 ms starved (lent a thread), not stopped again, starved 100 ms more: killed */
  group_beside_a_call(&g, 20000, STARVES_IDLE);
  int64_t t0 = tn_yield_now();
  group_beside_done(&g, 2);
  ck_assert(tn_yield_now() - t0 < INT64_C(10000000000));
}
END_TEST

START_TEST(test_a_group_asleep_is_neither_lent_a_thread_nor_killed)
{
  group_beside g;
  group_beside_a_call(&g, 600, ASLEEP);
  sleep_ms(350);
  ck_assert_int_eq(a_call_lends(), 0);
  group_beside_done(&g, 0);
}
END_TEST

START_TEST(test_a_group_that_runs_in_its_turns_is_not_lent_a_thread)
{
  group_beside g;
  /* its child (not the leader: the whole tree's time counts) spins through every run it gets */
  group_beside_a_call(&g, 250, SPINS);
  sleep_ms(350);
  ck_assert_int_eq(a_call_lends(), 0);
  group_beside_done(&g, 0);
}
END_TEST

int main(void)
{
  Suite *s = suite_create("yield");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_calls_of_this_thread_are_not_beside_it);
  tcase_add_test(tc, test_work_goes_on_resume_ns_after_the_last_end);
  tcase_add_test(tc, test_a_call_beginning_ends_a_wait);
  tcase_add_test(tc, test_a_starved_child_is_lent_a_thread_by_each_outermost_call);
  tcase_add_test(tc, test_a_child_asleep_is_not_starved);
  tcase_add_test(tc, test_a_childs_worker_starved_while_lent_is_killed_and_the_child_goes_on);
  tcase_add_test(tc, test_a_child_past_its_deadline_is_killed);
  tcase_add_test(tc, test_a_group_starved_after_its_pause_ran_out_is_lent_a_thread);
  tcase_add_test(tc, test_an_idle_group_starved_while_lent_is_killed);
  tcase_add_test(tc, test_a_group_asleep_is_neither_lent_a_thread_nor_killed);
  tcase_add_test(tc, test_a_group_that_runs_in_its_turns_is_not_lent_a_thread);
  suite_add_tcase(s, tc);
  return tn_check_run(s);
}
