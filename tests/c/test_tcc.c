/*
** Check suite of csrc/neuron_backend/tcc.c: warm-up, compiling, runtime
** symbols, libtcc1.a, object code compiled and loaded, errors, concurrent
** compiles.
*/
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "neuron_backend/tcc.h"
#include "tn_check.h"

static void init(void)
{
  char err[512];
  const char *dir = getenv("TN_TCC_LIBDIR");
  ck_assert_msg(dir != NULL, "TN_TCC_LIBDIR must name the folder holding libtcc1.a");
  ck_assert_msg(tn_tcc_init(dir, err, sizeof err) == TN_OK, "init: %s", err);
}

static double twice(double x) { return 2 * x; }

START_TEST(test_compile_and_call)
{
  static const char src[] =
      "double twice(double);\n"
      "double f(double x) { return twice(x) + 1.0; }\n"
      "unsigned long long g(double x) { return (unsigned long long)x; }\n";
  tn_tcc_symbol syms[] = {{"twice", (const void *)twice}};
  tn_tcc_unit *u;
  char err[512];
  init();
  ck_assert_int_eq(tn_tcc_compile(src, syms, 1, &u, err, sizeof err), TN_OK);
  double (*f)(double) = (double (*)(double))tn_tcc_get(u, "f");
  unsigned long long (*g)(double) = (unsigned long long (*)(double))tn_tcc_get(u, "g");
  ck_assert_ptr_nonnull(f);
  ck_assert_ptr_nonnull(g);
  ck_assert_double_eq(f(20.0), 41.0);
  /* above INT64_MAX: needs __fixunsdfdi from libtcc1.a */
  ck_assert_uint_eq(g(1e19), 10000000000000000000ULL);
  ck_assert_ptr_null(tn_tcc_get(u, "nope"));
  tn_tcc_free(u);
}
END_TEST

static double thrice(double x) { return 3 * x; }

START_TEST(test_object_code_round_trip)
{
  /* compiled once to object code, then loaded (no compile) with the runtime's
  ** symbols resolved at load: a different address each time is fine */
  static const char src[] =
      "double twice(double);\n"
      "static double one(void) { return 1.0; }\n"
      "double f(double x) { return twice(x) + one(); }\n"
      "unsigned long long g(double x) { return (unsigned long long)x; }\n";
  uint8_t *obj;
  size_t len;
  tn_tcc_unit *u, *v;
  char err[512];
  init();
  ck_assert_int_eq(tn_tcc_compile_object(src, &obj, &len, err, sizeof err), TN_OK);
  ck_assert_uint_gt(len, 64);
  tn_tcc_symbol syms[] = {{"twice", (const void *)twice}}, other[] = {{"twice", (const void *)thrice}};
  ck_assert_int_eq(tn_tcc_load_object(obj, len, syms, 1, &u, err, sizeof err), TN_OK);
  ck_assert_int_eq(tn_tcc_load_object(obj, len, other, 1, &v, err, sizeof err), TN_OK);
  double (*f)(double) = (double (*)(double))tn_tcc_get(u, "f");
  double (*f3)(double) = (double (*)(double))tn_tcc_get(v, "f");
  unsigned long long (*g)(double) = (unsigned long long (*)(double))tn_tcc_get(u, "g");
  ck_assert_double_eq(f(20.0), 41.0);
  ck_assert_double_eq(f3(20.0), 61.0);
  ck_assert_uint_eq(g(1e19), 10000000000000000000ULL);  /* libtcc1.a linked at load */
  tn_tcc_free(u);
  tn_tcc_free(v);
  /* a symbol left unresolved, bytes that are no object, a compile error: refused, not fatal */
  ck_assert_int_eq(tn_tcc_load_object(obj, len, NULL, 0, &u, err, sizeof err), TN_ECOMPILE);
  ck_assert_ptr_null(u);
  ck_assert_ptr_nonnull(strstr(err, "twice"));
  ck_assert_int_eq(tn_tcc_load_object((const uint8_t *)"int f;", 6, syms, 1, &u, err, sizeof err), TN_ECORRUPT);
  ck_assert_int_eq(tn_tcc_load_object(obj, 3, syms, 1, &u, err, sizeof err), TN_ECORRUPT);
  free(obj);
  ck_assert_int_eq(tn_tcc_compile_object("int f( {", &obj, &len, err, sizeof err), TN_ECOMPILE);
  ck_assert_ptr_null(obj);
  ck_assert_ptr_nonnull(strstr(err, "error"));
}
END_TEST

START_TEST(test_errors_are_reported_not_fatal)
{
  tn_tcc_unit *u;
  char err[512];
  init();
  ck_assert_int_eq(tn_tcc_compile("int f( { return 1; }", NULL, 0, &u, err, sizeof err), TN_ECOMPILE);
  ck_assert_ptr_null(u);
  ck_assert_ptr_nonnull(strstr(err, "error"));
  ck_assert_int_eq(tn_tcc_compile("int missing(int); int f(int x) { return missing(x); }", NULL, 0, &u,
                                  err, sizeof err), TN_ECOMPILE);
  ck_assert_ptr_nonnull(strstr(err, "missing"));
  /* the compiler is still usable afterwards */
  ck_assert_int_eq(tn_tcc_compile("int f(int x) { return x; }", NULL, 0, &u, err, sizeof err), TN_OK);
  tn_tcc_free(u);
}
END_TEST

static void *compile_many(void *arg)
{
  intptr_t id = (intptr_t)arg, bad = 0;
  char src[200], err[512];
  for (int i = 0; i < 50; i++) {
    tn_tcc_unit *u;
    snprintf(src, sizeof src, "long f(long x) { return x * %d + %ld; }", i, (long)id);
    if (tn_tcc_compile(src, NULL, 0, &u, err, sizeof err) != TN_OK) {
      bad++;
      continue;
    }
    long (*f)(long) = (long (*)(long))tn_tcc_get(u, "f");
    bad += !f || f(3) != 3L * i + id;
    tn_tcc_free(u);
  }
  return (void *)bad;
}

START_TEST(test_concurrent_compiles)
{
  pthread_t t[4];
  init();
  for (intptr_t i = 0; i < 4; i++)
    ck_assert_int_eq(pthread_create(&t[i], NULL, compile_many, (void *)i), 0);
  for (int i = 0; i < 4; i++) {
    void *res;
    ck_assert_int_eq(pthread_join(t[i], &res), 0);
    ck_assert_ptr_null(res);
  }
}
END_TEST

START_TEST(test_bad_libdir_fails_cleanly)
{
  char err[512];
  /* a fresh process: the first init decides */
  ck_assert_int_eq(tn_tcc_init("/nonexistent/dir", err, sizeof err), TN_ECOMPILE);
  ck_assert_ptr_nonnull(strstr(err, "libtcc1.a"));
  tn_tcc_unit *u;
  ck_assert_int_eq(tn_tcc_compile("int f(void){return 0;}", NULL, 0, &u, err, sizeof err), TN_EINVAL);
}
END_TEST

int main(void)
{
  Suite *s = suite_create("tcc");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_compile_and_call);
  tcase_add_test(tc, test_object_code_round_trip);
  tcase_add_test(tc, test_errors_are_reported_not_fatal);
  tcase_add_test(tc, test_concurrent_compiles);
  tcase_add_test(tc, test_bad_libdir_fails_cleanly);
  suite_add_tcase(s, tc);
  return tn_check_run(s);
}
