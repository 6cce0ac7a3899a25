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
#include <sys/mman.h>
#include <unistd.h>

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

/* A new state for output type `type`, its errors collected into eb. */
static TCCState *tcc_state(tcc_errbuf *eb, int type)
{
  TCCState *s = tcc_new();
  if (!s)
    return NULL;
  tcc_set_error_func(s, eb, tcc_collect);
  tcc_set_lib_path(s, tcc_init_dir); /* tcc's own headers live in <dir>/include */
  tcc_set_options(s, "-nostdlib");
  if (tcc_set_output_type(s, type) < 0) {
    tcc_delete(s);
    return NULL;
  }
  return s;
}

/* Registers syms, links libtcc1.a and relocates s's code into a unit
** (*out owns s then; on failure the caller still does). */
static int tcc_link(TCCState *s, const tn_tcc_symbol *syms, size_t nsyms, tn_tcc_unit **out)
{
  tn_tcc_unit *u = calloc(1, sizeof *u);
  if (!u)
    return TN_ENOMEM;
  for (size_t i = 0; i < nsyms; i++)
    if (tcc_add_symbol(s, syms[i].ts_name, syms[i].ts_addr) < 0)
      goto fail;
  if (tcc_add_file(s, tcc_libtcc1) < 0 || tcc_relocate(s, TCC_RELOCATE_AUTO) < 0)
    goto fail;
  u->tu_state = s;
  *out = u;
  return TN_OK;
fail:
  free(u);
  return TN_ECOMPILE;
}

static int tcc_build(const char *src, const tn_tcc_symbol *syms, size_t nsyms,
                     tn_tcc_unit **out, char *err, size_t errlen)
{
  tcc_errbuf eb = {err, errlen, 0};
  int rc = TN_ECOMPILE;

  *out = NULL;
  if (errlen)
    err[0] = 0;
  TCCState *s = tcc_state(&eb, TCC_OUTPUT_MEMORY);
  if (!s)
    return TN_ENOMEM;
  if (tcc_compile_string(s, src) == 0)
    rc = tcc_link(s, syms, nsyms, out);
  if (rc != TN_OK)
    tcc_delete(s);
  return rc;
}

/* An anonymous in-memory file and the path libtcc opens it by; -1 (errno set) on failure. */
static int tcc_memfile(char *path, size_t len)
{
  int fd = memfd_create("tn_kernel_object", MFD_CLOEXEC);
  if (fd >= 0)
    snprintf(path, len, "/proc/self/fd/%d", fd);
  return fd;
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

/* TN_OK once tn_tcc_init succeeded (err emptied), else TN_EINVAL with the message. */
static int tcc_ready(char *err, size_t errlen)
{
  if (errlen)
    err[0] = 0;
  if (tcc_init_rc == TN_OK)
    return TN_OK;
  snprintf(err, errlen, "libtcc is not initialised");
  return TN_EINVAL;
}

int tn_tcc_compile(const char *src, const tn_tcc_symbol *syms, size_t nsyms,
                   tn_tcc_unit **out, char *err, size_t errlen)
{
  *out = NULL;
  if (tcc_ready(err, errlen) != TN_OK)
    return TN_EINVAL;
  return tcc_build(src, syms, nsyms, out, err, errlen);
}

int tn_tcc_compile_object(const char *src, uint8_t **obj, size_t *len, char *err, size_t errlen)
{
  tcc_errbuf eb = {err, errlen, 0};
  char path[64];
  TCCState *s = NULL;
  uint8_t *buf = NULL;
  int fd = -1, rc = TN_ECOMPILE;

  *obj = NULL;
  *len = 0;
  if (tcc_ready(err, errlen) != TN_OK)
    return TN_EINVAL;
  if (!(s = tcc_state(&eb, TCC_OUTPUT_OBJ))) {
    rc = TN_ENOMEM;
    goto done;
  }
  if (tcc_compile_string(s, src) < 0)
    goto done;
  if ((fd = tcc_memfile(path, sizeof path)) < 0) {
    snprintf(err, errlen, "no in-memory file for the object code");
    rc = TN_EIO;
    goto done;
  }
  if (tcc_output_file(s, path) < 0)
    goto done;
  off_t n = lseek(fd, 0, SEEK_END);
  if (n <= 0 || !(buf = malloc((size_t)n)) || pread(fd, buf, (size_t)n, 0) != n) {
    snprintf(err, errlen, "reading the object code back failed");
    rc = buf || n <= 0 ? TN_EIO : TN_ENOMEM;
    goto done;
  }
  *obj = buf;
  *len = (size_t)n;
  buf = NULL;
  rc = TN_OK;
done:
  free(buf);
  if (fd >= 0)
    close(fd);
  if (s)
    tcc_delete(s);
  return rc;
}

int tn_tcc_load_object(const uint8_t *obj, size_t len, const tn_tcc_symbol *syms, size_t nsyms,
                       tn_tcc_unit **out, char *err, size_t errlen)
{
  tcc_errbuf eb = {err, errlen, 0};
  char path[64];
  TCCState *s = NULL;
  int fd = -1, rc = TN_ECOMPILE;

  *out = NULL;
  if (tcc_ready(err, errlen) != TN_OK)
    return TN_EINVAL;
  if (len < 4 || memcmp(obj, "\177ELF", 4) != 0) {
    snprintf(err, errlen, "not object code (%zu bytes)", len);
    return TN_ECORRUPT;
  }
  if ((fd = tcc_memfile(path, sizeof path)) < 0 || write(fd, obj, len) != (ssize_t)len) {
    snprintf(err, errlen, "no in-memory file for the object code");
    rc = TN_EIO;
    goto done;
  }
  if (!(s = tcc_state(&eb, TCC_OUTPUT_MEMORY))) {
    rc = TN_ENOMEM;
    goto done;
  }
  tcc_set_options(s, "-xb"); /* the file has no extension: say it is binary, not C */
  if (tcc_add_file(s, path) < 0)
    goto done;
  rc = tcc_link(s, syms, nsyms, out);
  if (rc == TN_OK)
    s = NULL;
done:
  if (fd >= 0)
    close(fd);
  if (s)
    tcc_delete(s);
  return rc;
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
