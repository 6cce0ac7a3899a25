/*
** Shared definitions of torchneuron_jit's C modules: error codes and small
** helpers. No Python here: every module below csrc/ except the *_py.c
** bindings and module.c is plain C11 so that its Check suite can link it
** without an interpreter.
*/
#ifndef TN_COMMON_H
#define TN_COMMON_H

#include <stddef.h>
#include <stdint.h>

/* -- Error codes -------------------------------------------------------- */

/* Every fallible function returns int rc: TN_OK or one of these (negative).
** Handles that fail keep the first error and refuse further work
** (TN_EPOISONED) until reset. */
#define TN_ERRORS(_) \
  _(TN_EINVAL,    -1, "invalid argument") \
  _(TN_ENOMEM,    -2, "out of memory") \
  _(TN_ETRUNC,    -3, "input truncated") \
  _(TN_ECORRUPT,  -4, "corrupted data") \
  _(TN_EVERSION,  -5, "unsupported format version") \
  _(TN_ETHREAD,   -6, "used from a thread other than its owner") \
  _(TN_EPOISONED, -7, "handle poisoned by an earlier error") \
  _(TN_ENOTFOUND, -8, "not found") \
  _(TN_EIO,       -9, "I/O error") \
  _(TN_EPERM,     -10, "unsafe permissions") \
  _(TN_EFULL,     -11, "store full") \
  _(TN_ETOOBIG,   -12, "value larger than the store's size limit") \
  _(TN_ECOMPILE,  -13, "compilation failed") \
  _(TN_ESTORE,    -14, "store error") \
  _(TN_ECHANGED,  -15, "changed since it was read")

enum {
  TN_OK = 0,
#define TN_ERR_ENUM(name, num, text) name = num,
  TN_ERRORS(TN_ERR_ENUM)
#undef TN_ERR_ENUM
};

/* Returns a static English description of rc (never NULL). */
const char *tn_strerror(int rc);

/* Length of the per-handle error message buffers. */
#define TN_ERRMSG_LEN 320

#endif /* TN_COMMON_H */
