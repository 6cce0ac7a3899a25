/*
** libtcc wrapper (see tcc.h).
*/
#include "tcc.h"

#include <libtcc.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tn_tcc_unit {
  TCCState *tu_state;  /* owns the relocated code */
};

typedef struct tcc_errbuf {
  char *eb_buf;
  size_t eb_len, eb_used;
} tcc_errbuf;

static pthread_once_t tcc_once = PTHREAD_ONCE_INIT;
static char tcc_libtcc1[PATH_MAX + 16];
static int tcc_init_rc = TN_EINVAL;
static char tcc_init_err[TN_ERRMSG_LEN];
static char tcc_init_dir[PATH_MAX];

/* Runs under libtcc's semaphore: plain C only. */
static void tcc_collect(void *opaque, const char *msg)
{
  tcc_errbuf *eb = opaque;
  if (!eb->eb_len || eb->eb_used + 1 >= eb->eb_len)
    return;
  int n = snprintf(eb->eb_buf + eb->eb_used, eb->eb_len - eb->eb_used, "%s%s",
                   eb->eb_used ? "\n" : "", msg);
  if (n > 0)
    eb->eb_used += (size_t)n < eb->eb_len - eb->eb_used ? (size_t)n : eb->eb_len - eb->eb_used - 1;
}

static int tcc_build(const char *src, const tn_tcc_symbol *syms, size_t nsyms,
                     tn_tcc_unit **out, char *err, size_t errlen)
{
  tcc_errbuf eb = {err, errlen, 0};
  tn_tcc_unit *u = NULL;
  TCCState *s = NULL;
  int rc = TN_ECOMPILE;

  *out = NULL;
  if (errlen)
    err[0] = 0;
  if (!(u = calloc(1, sizeof *u)) || !(s = tcc_new())) {
    rc = TN_ENOMEM;
    goto done;
  }
  tcc_set_error_func(s, &eb, tcc_collect);
  tcc_set_lib_path(s, tcc_init_dir); /* tcc's own headers live in <dir>/include */
  tcc_set_options(s, "-nostdlib");
  if (tcc_set_output_type(s, TCC_OUTPUT_MEMORY) < 0 || tcc_compile_string(s, src) < 0)
    goto done;
  for (size_t i = 0; i < nsyms; i++)
    if (tcc_add_symbol(s, syms[i].ts_name, syms[i].ts_addr) < 0)
      goto done;
  if (tcc_add_file(s, tcc_libtcc1) < 0 || tcc_relocate(s, TCC_RELOCATE_AUTO) < 0)
    goto done;
  u->tu_state = s;
  *out = u;
  s = NULL;
  u = NULL;
  rc = TN_OK;
done:
  if (s)
    tcc_delete(s);
  free(u);
  return rc;
}

static void tcc_do_init(void)
{
  static const char warmup[] = "int tn_warmup(int x) { return x * 2 + 1; }\n";
  tn_tcc_unit *u = NULL;
  snprintf(tcc_libtcc1, sizeof tcc_libtcc1, "%s/libtcc1.a", tcc_init_dir);
  tcc_init_rc = tcc_build(warmup, NULL, 0, &u, tcc_init_err, sizeof tcc_init_err);
  if (tcc_init_rc == TN_OK) {
    int (*fn)(int) = (int (*)(int))tn_tcc_get(u, "tn_warmup");
    if (!fn || fn(20) != 41) {
      tcc_init_rc = TN_ECOMPILE;
      snprintf(tcc_init_err, sizeof tcc_init_err, "libtcc warm-up unit computed a wrong result");
    }
  }
  tn_tcc_free(u);
}

int tn_tcc_init(const char *libdir, char *err, size_t errlen)
{
  /* The first caller's directory wins; pthread_once orders the rest. */
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&mu);
  if (!tcc_init_dir[0])
    snprintf(tcc_init_dir, sizeof tcc_init_dir, "%s", libdir);
  pthread_mutex_unlock(&mu);
  pthread_once(&tcc_once, tcc_do_init);
  if (tcc_init_rc != TN_OK)
    snprintf(err, errlen, "libtcc warm-up failed (runtime library %s): %s", tcc_libtcc1, tcc_init_err);
  return tcc_init_rc;
}

int tn_tcc_compile(const char *src, const tn_tcc_symbol *syms, size_t nsyms,
                   tn_tcc_unit **out, char *err, size_t errlen)
{
  *out = NULL;
  if (tcc_init_rc != TN_OK) {
    snprintf(err, errlen, "libtcc is not initialised");
    return TN_EINVAL;
  }
  return tcc_build(src, syms, nsyms, out, err, errlen);
}

void *tn_tcc_get(tn_tcc_unit *u, const char *name)
{
  return tcc_get_symbol(u->tu_state, name);
}

void tn_tcc_free(tn_tcc_unit *u)
{
  if (!u)
    return;
  tcc_delete(u->tu_state);
  free(u);
}
