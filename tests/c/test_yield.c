/*
** Check suite of csrc/tn_yield.c: served calls counted per thread and in
** all, when background work may go on after them, and a wait that a call
** beginning on another thread ends (none missed between reading the epoch
** and waiting).
*/
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "tn_check.h"
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

int main(void)
{
  Suite *s = suite_create("yield");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_calls_of_this_thread_are_not_beside_it);
  tcase_add_test(tc, test_work_goes_on_resume_ns_after_the_last_end);
  tcase_add_test(tc, test_a_call_beginning_ends_a_wait);
  suite_add_tcase(s, tc);
  return tn_check_run(s);
}
