/*
** A small thread pool for kernels: one job at a time, split into parts;
** the caller runs part 0 and waits for the rest. Workers start on first
** use; a forked child starts with none (the parent's do not exist there).
*/
#ifndef TN_POOL_H
#define TN_POOL_H

/* Runs fn(ctx, part, nparts) for part in [0, nparts) on up to nparts
** threads (the caller's included) and returns when all are done. Callers
** are serialised. nparts is clamped to [1, 64]. Returns the number of parts
** run; if workers cannot be started, runs every part on the caller. */
int tn_pool_run(void (*fn)(void *ctx, int part, int nparts), void *ctx, int nparts);

/* Runs parts on an OpenMP runtime instead (PyTorch's own, so kernels and
** PyTorch's ops share one set of threads): its GOMP_parallel,
** omp_get_thread_num and omp_get_num_threads. All NULL: back to the pool
** above. Set it before any thread launches kernels. A forked child goes
** back to the pool (the runtime's threads do not exist there). */
void tn_pool_use_openmp(void *gomp_parallel, void *thread_num, void *num_threads);

#endif /* TN_POOL_H */
