/*
 * parallel.c — fan a loop of independent tasks out over a persistent pool of
 * POSIX threads.
 *
 * Why a pool: the GEMM runs two parallel loops per (column chunk, K step) and
 * a training step makes dozens of casts and GEMMs; creating and joining
 * threads for each (tens of microseconds) would cost more than the work at
 * the sizes of a linear layer, and would grow with the core count.  The pool
 * is the one piece of process-wide state here besides the thread-count
 * setting; it is created lazily, grows to the largest worker count asked for,
 * and is reset in a forked child (whose threads do not exist).
 *
 * Protocol: a caller that finds the pool free owns it for one loop: it posts
 * the job under the mutex (a new generation), runs tasks itself as worker 0
 * and waits until every helper it asked for has finished.  Helpers 1 .. n-1
 * take tasks from the same atomic counter.  A caller that finds the pool busy
 * (another thread's loop, or a loop started from inside a task) runs its
 * tasks on its own thread: same results, no deadlock.  Helpers spin briefly
 * after a job (the next loop of the same GEMM usually follows within
 * microseconds), then sleep on a condition variable, so an idle pool costs
 * no CPU.
 *
 * A host pool (fp8mix_set_thread_pool) replaces all of this: each of its
 * workers takes tasks from the loop's own atomic counter, so tasks are
 * handed out as they are here, whichever threads the host runs them on.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define MAX_WORKERS 256
#define SPIN_NS 20000 /* how long an idle helper (or a waiting caller) spins before sleeping */

static atomic_int g_num_threads = 0; /* 0: number of online CPUs */
static _Atomic(fp8mix_run_workers) g_host; /* the host's pool, if it gave one (static: starts NULL) */

void fp8mix_set_thread_pool(fp8mix_run_workers run) { atomic_store(&g_host, run); }

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

typedef struct pool {
    pthread_mutex_t mu;
    pthread_cond_t wake;    /* helpers: a new generation was posted       */
    pthread_cond_t done;    /* caller: the last helper of the job finished */
    atomic_int busy;        /* 1 while a caller owns the pool              */
    int nthreads;           /* helpers started (ids 1 .. nthreads)         */
    atomic_ullong gen;      /* job generation, bumped under mu             */
    /* the current job (written under mu before gen is bumped) */
    fp8mix_task_fn fn;
    void *ctx;
    int64_t ntasks;
    int want;               /* workers of this job, caller included        */
    atomic_llong next;      /* next task index                             */
    atomic_int pending;     /* helpers of this job still running           */
} pool;

static pool g_pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER, .done = PTHREAD_COND_INITIALIZER};
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void run_tasks(atomic_llong *next, fp8mix_task_fn fn, void *ctx, int64_t ntasks, int id)
{
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(next, 1, memory_order_relaxed);
        if (t >= ntasks) return;
        fn(ctx, t, id);
    }
}

/* One loop run on the host's pool. */
typedef struct host_job {
    atomic_llong next;
    fp8mix_task_fn fn;
    void *ctx;
    int64_t ntasks;
} host_job;

static void host_body(void *job, int worker)
{
    host_job *J = (host_job *)job;
    run_tasks(&J->next, J->fn, J->ctx, J->ntasks, worker);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if FP8MIX_X86
    __builtin_ia32_pause();
#endif
}

static void *helper_main(void *arg)
{
    pool *p = &g_pool;
    int id = (int)(intptr_t)arg;
    unsigned long long seen = 0;
    for (;;) {
        /* Spin on the generation for a while, then sleep. */
        uint64_t t0 = now_ns();
        for (int i = 0; atomic_load_explicit(&p->gen, memory_order_acquire) == seen; i++) {
            if ((i & 63) == 63 && now_ns() - t0 > SPIN_NS) break;
            cpu_relax();
        }
        pthread_mutex_lock(&p->mu);
        while (atomic_load_explicit(&p->gen, memory_order_relaxed) == seen) pthread_cond_wait(&p->wake, &p->mu);
        /* A consistent snapshot of the job: it is only rewritten under mu. */
        seen = atomic_load_explicit(&p->gen, memory_order_relaxed);
        fp8mix_task_fn fn = p->fn;
        void *ctx = p->ctx;
        int64_t ntasks = p->ntasks;
        int mine = id < p->want;
        pthread_mutex_unlock(&p->mu);
        if (!mine) continue;
        run_tasks(&p->next, fn, ctx, ntasks, id);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

/* In a forked child the helpers are gone and the mutex may be held by a
 * thread that no longer exists: start over with a fresh, empty pool. */
static void pool_after_fork(void)
{
    pool *p = &g_pool;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    p->nthreads = 0;
    atomic_store(&p->gen, 0);
    atomic_store(&p->pending, 0);
    atomic_store(&p->busy, 0);
}

static void pool_once(void) { pthread_atfork(NULL, NULL, pool_after_fork); }

/* Start helpers up to `workers - 1`; returns the worker count available.
 * Helpers block every signal: signals go to the application's threads. */
static int pool_grow(pool *p, int workers)
{
    if (p->nthreads >= workers - 1) return workers;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (p->nthreads < workers - 1) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &attr, helper_main, (void *)(intptr_t)(p->nthreads + 1));
        pthread_attr_destroy(&attr);
        if (rc != 0) break;
        p->nthreads++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return p->nthreads + 1 < workers ? p->nthreads + 1 : workers;
}

int fp8mix_parallel_for(int64_t ntasks, int workers, fp8mix_task_fn fn, void *ctx)
{
    if (ntasks <= 0) return 0;
    if (workers > ntasks) workers = (int)ntasks;
    if (workers > MAX_WORKERS) workers = MAX_WORKERS;
    fp8mix_run_workers host = atomic_load_explicit(&g_host, memory_order_acquire);
    if (host && workers > 1) {
        host_job J = {.fn = fn, .ctx = ctx, .ntasks = ntasks};
        atomic_init(&J.next, 0);
        host(workers, host_body, &J);
        return workers;
    }
    pool *p = &g_pool;
    int expected = 0;
    if (workers <= 1 || !atomic_compare_exchange_strong(&p->busy, &expected, 1)) {
        /* serial: one worker, or the pool is owned by another loop */
        atomic_llong next;
        atomic_init(&next, 0);
        run_tasks(&next, fn, ctx, ntasks, 0);
        return 1;
    }
    pthread_once(&g_once, pool_once);
    int got = pool_grow(p, workers);
    int failed = got < workers;
    if (got <= 1) {
        atomic_store(&p->busy, 0);
        atomic_llong next;
        atomic_init(&next, 0);
        run_tasks(&next, fn, ctx, ntasks, 0);
        return -1;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->ntasks = ntasks;
    p->want = got;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, got - 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);

    run_tasks(&p->next, fn, ctx, ntasks, 0);

    uint64_t t0 = now_ns();
    for (int i = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; i++) {
        if ((i & 63) == 63 && now_ns() - t0 > SPIN_NS) break;
        cpu_relax();
    }
    if (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
    atomic_store_explicit(&p->busy, 0, memory_order_release);
    return failed ? -got : got;
}
