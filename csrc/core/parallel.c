/*
 * parallel.c — fan a loop of independent tasks out over POSIX threads.
 * Threads are created per call and joined before returning: no pool, no
 * global state but the thread-count setting.  Callers gate on size
 * (fp8mix_workers_for) so small calls never pay for thread creation.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "internal.h"

#define MAX_WORKERS 256

static atomic_int g_num_threads = 0; /* 0: number of online CPUs */

void fp8mix_set_num_threads(int n) { atomic_store(&g_num_threads, n > 0 ? n : 0); }

int fp8mix_get_num_threads(void)
{
    int n = atomic_load(&g_num_threads);
    if (n > 0) return n > MAX_WORKERS ? MAX_WORKERS : n;
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    if (c < 1) c = 1;
    return c > MAX_WORKERS ? MAX_WORKERS : (int)c;
}

int fp8mix_workers_for(int64_t work, int64_t grain)
{
    int64_t w = grain > 0 ? work / grain : 1;
    int n = fp8mix_get_num_threads();
    if (w < 1) w = 1;
    return w < n ? (int)w : n;
}

typedef struct pf_shared {
    atomic_llong next;
    int64_t ntasks;
    fp8mix_task_fn fn;
    void *ctx;
} pf_shared;

typedef struct pf_worker {
    pf_shared *sh;
    int id;
} pf_worker;

static void run_tasks(pf_shared *sh, int id)
{
    for (;;) {
        int64_t t = atomic_fetch_add(&sh->next, 1);
        if (t >= sh->ntasks) return;
        sh->fn(sh->ctx, t, id);
    }
}

static void *worker_main(void *arg)
{
    pf_worker *w = (pf_worker *)arg;
    run_tasks(w->sh, w->id);
    return NULL;
}

int fp8mix_parallel_for(int64_t ntasks, int workers, fp8mix_task_fn fn, void *ctx)
{
    if (ntasks <= 0) return 0;
    if (workers > ntasks) workers = (int)ntasks;
    if (workers > MAX_WORKERS) workers = MAX_WORKERS;
    pf_shared sh;
    atomic_init(&sh.next, 0);
    sh.ntasks = ntasks;
    sh.fn = fn;
    sh.ctx = ctx;
    if (workers <= 1) {
        run_tasks(&sh, 0);
        return 1;
    }
    pthread_t tid[MAX_WORKERS];
    pf_worker w[MAX_WORKERS];
    int started = 1, failed = 0;
    for (int i = 1; i < workers; i++) {
        w[i].sh = &sh;
        w[i].id = i;
        if (pthread_create(&tid[i], NULL, worker_main, &w[i]) != 0) {
            failed = 1;
            break;
        }
        started++;
    }
    run_tasks(&sh, 0);
    for (int i = 1; i < started; i++) pthread_join(tid[i], NULL);
    return failed ? -started : started;
}
