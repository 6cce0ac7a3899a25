/*
** Shared by the Check suites: run a suite (fork mode, so a crash is a
** failure, not the end of the run) and refuse to pass when nothing ran.
*/
#ifndef TN_CHECK_H
#define TN_CHECK_H

#include <check.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

/* Runs s; returns the process exit status. */
static inline int tn_check_run(Suite *s)
{
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int run = srunner_ntests_run(sr);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  if (run == 0) {
    fprintf(stderr, "no checks ran\n");
    return EXIT_FAILURE;
  }
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* The process's malloc must be libc's: mimalloc is used through heaps only,
** never as a global override (Debian's libmimalloc.so exports malloc). In a
** build with AddressSanitizer (make test-asan) its malloc stands in for
** libc's, and it must be that one instead. */
static inline int tn_malloc_is_libc(void)
{
  void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  int ok = libc && dlsym(RTLD_DEFAULT, "malloc") == dlsym(libc, "malloc");
  if (libc)
    dlclose(libc);
#ifdef __SANITIZE_ADDRESS__
  void *asan = dlopen(NULL, RTLD_NOW);
  ok = !ok && asan && dlsym(asan, "__asan_init") != NULL;
  if (asan)
    dlclose(asan);
#endif
  return ok;
}

#endif /* TN_CHECK_H */
