/* test_parallel.c — fp8mix_parallel_for on fp8mix's own pool and on a host's
 * (fp8mix_set_thread_pool): every task runs exactly once with a worker index
 * below the worker count, the host is asked for the loop's workers, and a GEMM
 * and a cast give the same bytes on either pool as on one thread. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "internal.h"

enum { NTASK = 1000, MAXW = 8 };

static atomic_int hits[NTASK];
static atomic_int bad_worker;
static int g_workers;

static void count_task(void *ctx, int64_t t, int worker)
{
    (void)ctx;
    atomic_fetch_add(&hits[t], 1);
    if (worker < 0 || worker >= g_workers) atomic_store(&bad_worker, 1);
}

/* Hosts: one runs the workers one after another on the calling thread (a pool with
 * one thread); the other starts a thread per worker. */
static atomic_int host_calls, host_workers_seen;

static void host_serial(int workers, fp8mix_worker_body body, void *job)
{
    atomic_fetch_add(&host_calls, 1);
    atomic_store(&host_workers_seen, workers);
    for (int w = workers - 1; w >= 0; w--) body(job, w); /* any order */
}

typedef struct th_arg {
    fp8mix_worker_body body;
    void *job;
    int w;
} th_arg;

static void *th_main(void *p)
{
    th_arg *a = (th_arg *)p;
    a->body(a->job, a->w);
    return NULL;
}

static void host_threads(int workers, fp8mix_worker_body body, void *job)
{
    atomic_fetch_add(&host_calls, 1);
    atomic_store(&host_workers_seen, workers);
    pthread_t t[MAXW];
    th_arg a[MAXW];
    for (int w = 1; w < workers; w++) {
        a[w] = (th_arg){body, job, w};
        pthread_create(&t[w], NULL, th_main, &a[w]);
    }
    body(job, 0);
    for (int w = 1; w < workers; w++) pthread_join(t[w], NULL);
}

static void check_loop(const char *pool, int workers)
{
    for (int t = 0; t < NTASK; t++) atomic_store(&hits[t], 0);
    atomic_store(&bad_worker, 0);
    g_workers = workers;
    fp8mix_parallel_for(NTASK, workers, count_task, NULL);
    int once = 1;
    for (int t = 0; t < NTASK; t++) once &= atomic_load(&hits[t]) == 1;
    CHECK(once, "%s pool, %d workers: every task ran exactly once", pool, workers);
    CHECK(!atomic_load(&bad_worker), "%s pool, %d workers: worker indices below the worker count", pool, workers);
}

/* A GEMM (several K steps and column chunks) and a per-tensor cast, under the current
 * pool and thread count; returns a checksum of their output bytes. */
static uint64_t work_bytes(void)
{
    const int64_t M = 300, N = 1100, K = 700;
    uint8_t *a = malloc((size_t)(M * K)), *b = malloc((size_t)(K * N));
    float *out = malloc(sizeof(float) * (size_t)(M * N)), *x = malloc(sizeof(float) * (size_t)(M * N));
    uint8_t *q = malloc((size_t)(M * N));
    uint32_t s = 12345;
    for (int64_t i = 0; i < M * K; i++) a[i] = (uint8_t)((s = s * 1103515245u + 12345u) >> 24) & 0xF7;
    for (int64_t i = 0; i < K * N; i++) b[i] = (uint8_t)((s = s * 1103515245u + 12345u) >> 24) & 0xF7;
    float sa = 0.5f, sb = 2.0f;
    fp8mix_gemm_args g;
    memset(&g, 0, sizeof g);
    g.m = M, g.n = N, g.k = K, g.a = a, g.fmt_a = FP8MIX_E4M3, g.lda = K, g.b = b, g.fmt_b = FP8MIX_E4M3, g.ldb = K;
    g.b_layout = FP8MIX_B_NK, g.scale_a = &sa, g.scale_a_kind = FP8MIX_MM_SCALE_TENSOR, g.scale_b = &sb;
    g.scale_b_kind = FP8MIX_MM_SCALE_TENSOR, g.out = out, g.out_t = FP8MIX_F32, g.ldo = N, g.accum = FP8MIX_ACCUM_FP32;
    CHECK(fp8mix_gemm(&g) == FP8MIX_OK, "gemm");
    for (int64_t i = 0; i < M * N; i++) x[i] = out[i] * 1e-3f;
    fp8mix_cast_opts o;
    memset(&o, 0, sizeof o);
    o.fmt = FP8MIX_E4M3, o.saturate = 1, o.rounding = FP8MIX_ROUND_STOCHASTIC, o.seed = 7;
    float scale = 3.0f, amax = 0;
    CHECK(fp8mix_cast(x, FP8MIX_F32, M, N, N, FP8MIX_GRAN_TENSOR, &scale, q, N, NULL, 0, &amax, &o) == FP8MIX_OK,
          "cast");
    uint64_t h = 1469598103934665603ull;
    const uint8_t *ob = (const uint8_t *)out;
    for (int64_t i = 0; i < M * N * 4; i++) h = (h ^ ob[i]) * 1099511628211ull;
    for (int64_t i = 0; i < M * N; i++) h = (h ^ q[i]) * 1099511628211ull;
    free(a), free(b), free(out), free(x), free(q);
    return h;
}

int main(void)
{
    fp8mix_set_num_threads(1);
    uint64_t ref = work_bytes();
    for (int w = 1; w <= 4; w++) check_loop("own", w);
    fp8mix_set_num_threads(4);
    CHECK(work_bytes() == ref, "own pool, 4 threads: same bytes as 1 thread");

    fp8mix_run_workers hosts[] = {host_serial, host_threads};
    const char *names[] = {"serial host", "threaded host"};
    for (int h = 0; h < 2; h++) {
        fp8mix_set_thread_pool(hosts[h]);
        atomic_store(&host_calls, 0);
        for (int w = 2; w <= 4; w++) {
            check_loop(names[h], w);
            CHECK(atomic_load(&host_workers_seen) == w, "%s asked for %d workers (got %d)", names[h], w,
                  atomic_load(&host_workers_seen));
        }
        int calls = atomic_load(&host_calls);
        check_loop(names[h], 1); /* one worker: the caller alone, the host is not asked */
        CHECK(atomic_load(&host_calls) == calls, "%s: a one-worker loop does not go to the host", names[h]);
        fp8mix_set_num_threads(4);
        CHECK(work_bytes() == ref, "%s, 4 threads: same bytes as 1 thread", names[h]);
        CHECK(atomic_load(&host_calls) > calls, "%s ran the GEMM's and the cast's loops", names[h]);
    }
    fp8mix_set_thread_pool(NULL);
    atomic_store(&host_calls, 0);
    check_loop("own (restored)", 3);
    CHECK(atomic_load(&host_calls) == 0, "NULL restores fp8mix's own pool");
    return check_report("test_parallel");
}
