/*
** Tier 2: a kernel's fused source (tn_codegen_tier2) compiled by the
** system C compiler into a shared object, and that object loaded from its
** bytes (a cache record) into the process.
**
** The compiler runs as a child process (posix_spawnp, no shell) on a
** source file in a private temporary directory; nothing here touches
** Python, so callers release the GIL around tn_tier2_compile. Objects are
** loaded through an anonymous in-memory file (memfd) that stays open while
** the object is loaded: the dynamic loader knows a loaded object by its
** path, and an open descriptor's number (hence "/proc/self/fd/N") is
** never reused while it is open.
*/
#ifndef TN_TIER2_H
#define TN_TIER2_H

#include <stddef.h>
#include <stdint.h>

#include "../tn_common.h"

/* A loaded tier-2 object. */
typedef struct tn_tier2_obj tn_tier2_obj;

/* Compiles src with `cc flags... -o OUT SRC -lmvec -lm` (cc found on PATH
** when it has no slash) into a shared object: *so (malloc'd; the caller
** frees it) of *len bytes. flags must make a shared object (-shared -fPIC).
** idle: the compiler runs in Linux's idle scheduling class (SCHED_IDLE;
** where there is none, at nice 19), started so by a thread of its own (the
** calling thread keeps its priority): a compile in the
** background while the cores serve calls runs only on a core nothing else
** wants (HF BERT run eagerly beside a looping cc -O3: the slowest of 60
** calls took 51-120 ms at nice 19, 39-45 ms idle, 29-47 ms with none).
** Thread-safe, blocking, no GIL needed. TN_ECOMPILE (the compiler failed
** or could not start: the first lines it printed, or the cause, in err),
** TN_EIO (temporary files), TN_ENOMEM, TN_EINVAL (more than 32 flags). */
int tn_tier2_compile(const char *cc, const char *const *flags, size_t nflags, const char *src, int idle,
                     uint8_t **so, size_t *len, char *err, size_t errlen);

/* The first line `cc --version` prints, into line (size len), run as
** tn_tier2_compile runs the compiler (no GIL needed: a spawn, not a fork of
** the whole process). TN_ECOMPILE (cannot run, fails or prints nothing:
** why in err), TN_EIO. */
int tn_tier2_version(const char *cc, char *line, size_t len, char *err, size_t errlen);

/* Loads so (len bytes from tn_tier2_compile, or a checksummed cache record
** of them) and finds symbol sym in it: *out, with tn_tier2_symbol.
** TN_ECORRUPT (not an ELF object), TN_ECOMPILE (the loader refused it or
** sym is missing: its message in err), TN_EIO, TN_ENOMEM. */
int tn_tier2_load(const uint8_t *so, size_t len, const char *sym, tn_tier2_obj **out, char *err, size_t errlen);

/* The address of the symbol tn_tier2_load found. */
void *tn_tier2_symbol(const tn_tier2_obj *o);

/* Unloads o (no call into its code may be running). NULL is fine. */
void tn_tier2_free(tn_tier2_obj *o);

#endif /* TN_TIER2_H */
