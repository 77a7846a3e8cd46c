/* test_recipe.c — the per-tensor recipes' C entry points (recipe.c) against a
 * reference written from fp8mix.h's prose in double precision: delayed-scaling
 * records over random schedules (zeros, infinities, NaN, every algo, interval,
 * margin, pow2, a history shorter than its buffer), the pending-gradient ring,
 * the delayed forward cast and the gradient cast with its column sums. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "internal.h"

static uint64_t rs = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 11);
}

/* fp8mix_compute_scale's rule, written again in double from the header. */
static float ref_scale(float a, fp8mix_format f, int margin, int pow2)
{
    if (!(a > 0.0f) || isinf(a)) return 1.0f;
    float fmax = f == FP8MIX_E4M3 ? 448.0f : 57344.0f;
    float s = fmax / a; /* one correctly rounded float32 division */
    s = ldexpf(s, -margin);
    if (isinf(s)) s = pow2 ? 0x1p127f : FLT_MAX;
    else if (s < FLT_MIN) s = FLT_MIN;
    if (pow2) {
        int e;
        frexpf(s, &e);
        s = ldexpf(1.0f, e - 1);
    }
    return s;
}

typedef struct ref_role {
    float h[64];
    float scale;
    int64_t steps;
} ref_role;

static void ref_record(ref_role *r, int64_t L, fp8mix_amax_algo algo, int64_t interval, fp8mix_format f, int margin,
                       int pow2, float amax)
{
    float v = isfinite(amax) ? fabsf(amax) : 0.0f;
    memmove(r->h + 1, r->h, (size_t)(L - 1) * sizeof(float));
    r->h[0] = v;
    r->steps++;
    if (r->steps == 1 && v > 0.0f) r->scale = ref_scale(v, f, margin, pow2);
    float a = r->h[0];
    if (algo == FP8MIX_AMAX_MAX)
        for (int64_t k = 1; k < L; k++) a = r->h[k] > a ? r->h[k] : a;
    if (r->steps % interval == 0 && a > 0.0f) r->scale = ref_scale(a, f, margin, pow2);
}

static float rnd_amax(void)
{
    switch (rnd() % 10) {
    case 0: return 0.0f;
    case 1: return INFINITY;
    case 2: return NAN;
    case 3: return ldexpf(1.0f, (int)(rnd() % 240) - 120); /* extreme magnitudes */
    default: return ldexpf(1.0f + (float)(rnd() % 1000) / 1000.0f, (int)(rnd() % 20) - 10);
    }
}

static void test_record_matches_reference(void)
{
    enum { R = 3, CAP = 40 };
    long bad = 0;
    for (int trial = 0; trial < 400; trial++) {
        fp8mix_delayed_recipe rc = {1 + (int64_t)(rnd() % CAP), (fp8mix_amax_algo)(rnd() % 2), (int)(rnd() % 4),
                                    (int)(rnd() % 2), 1 + (int64_t)(rnd() % 4)};
        float hist[CAP * R], scale[R] = {1.0f, 1.0f, 1.0f};
        int64_t steps[R] = {0, 0, 0};
        memset(hist, 0, sizeof hist);
        fp8mix_delayed_state st = {hist, CAP, R, scale, steps};
        ref_role ref[R];
        memset(ref, 0, sizeof ref);
        for (int r = 0; r < R; r++) ref[r].scale = 1.0f;
        for (int n = 0; n < 60; n++) {
            int role = (int)(rnd() % R);
            fp8mix_format f = (fp8mix_format)(role == 2);
            float a = rnd_amax();
            CHECK(fp8mix_delayed_record(&st, role, f, &rc, a) == FP8MIX_OK, "record");
            ref_record(&ref[role], rc.history_len, rc.algo, rc.interval, f, rc.margin, rc.pow2, a);
            for (int r = 0; r < R; r++) {
                bad += steps[r] != ref[r].steps || f32_bits(scale[r]) != f32_bits(ref[r].scale);
                for (int64_t k = 0; k < rc.history_len; k++) bad += f32_bits(hist[k * R + r]) != f32_bits(ref[r].h[k]);
                for (int64_t k = rc.history_len; k < CAP; k++) bad += hist[k * R + r] != 0.0f; /* rows not in use */
            }
        }
    }
    CHECK(bad == 0, "%ld state entries differ from the reference", bad);
}

static void test_errors_write_nothing(void)
{
    float hist[4 * 3] = {0}, scale[3] = {1, 1, 1}, pend[2] = {-1, -1}, plan[2];
    int64_t steps[3] = {0}, next = 0, res;
    fp8mix_delayed_state st = {hist, 4, 3, scale, steps};
    fp8mix_delayed_recipe rc = {4, FP8MIX_AMAX_MAX, 0, 0, 1};
    CHECK(fp8mix_delayed_record(&st, 3, FP8MIX_E4M3, &rc, 1.0f) == FP8MIX_ERR_BAD_SHAPE, "role out of range");
    CHECK(fp8mix_delayed_record(&st, -1, FP8MIX_E4M3, &rc, 1.0f) == FP8MIX_ERR_BAD_SHAPE, "negative role");
    rc.history_len = 5;
    CHECK(fp8mix_delayed_record(&st, 0, FP8MIX_E4M3, &rc, 1.0f) == FP8MIX_ERR_BAD_SHAPE, "history_len > capacity");
    rc.history_len = 4;
    rc.interval = 0;
    CHECK(fp8mix_delayed_record(&st, 0, FP8MIX_E4M3, &rc, 1.0f) == FP8MIX_ERR_BAD_ARG, "interval 0");
    rc.interval = 1;
    rc.algo = (fp8mix_amax_algo)7;
    CHECK(fp8mix_delayed_record(&st, 0, FP8MIX_E4M3, &rc, 1.0f) == FP8MIX_ERR_BAD_ENUM, "algo");
    rc.algo = FP8MIX_AMAX_MAX;
    CHECK(fp8mix_delayed_record(&st, 0, (fp8mix_format)9, &rc, 1.0f) == FP8MIX_ERR_BAD_ENUM, "format");
    CHECK(fp8mix_delayed_flush(&st, 2, FP8MIX_E5M2, &rc, pend, 2, &next, 0, 1, plan, &res) == FP8MIX_ERR_BAD_ARG,
          "reserve without record");
    CHECK(fp8mix_delayed_flush(&st, 2, FP8MIX_E5M2, &rc, pend, 0, &next, 1, 1, plan, &res) == FP8MIX_ERR_BAD_SHAPE,
          "no slots");
    CHECK(steps[0] == 0 && steps[2] == 0 && scale[0] == 1.0f && hist[0] == 0.0f, "nothing written on error");
}

/* The ring: reserve slots, fill some out of order (several backwards of one
 * forward keep the max), flush records the filled ones oldest first. */
static void test_pending_ring(void)
{
    enum { K = 4, CAP = 8 };
    float hist[CAP * 3] = {0}, scale[3] = {1, 1, 1}, pend[K], plan[2];
    int64_t steps[3] = {0}, next = 0, slot[6];
    for (int k = 0; k < K; k++) pend[k] = -1.0f;
    fp8mix_delayed_state st = {hist, CAP, 3, scale, steps};
    fp8mix_delayed_recipe rc = {CAP, FP8MIX_AMAX_MAX, 0, 0, 1};
    for (int c = 0; c < 6; c++) /* six forwards in flight on four slots: calls 0/4 and 1/5 share */
        CHECK(fp8mix_delayed_flush(&st, 2, FP8MIX_E5M2, &rc, pend, K, &next, 1, 1, plan, &slot[c]) == FP8MIX_OK,
              "flush %d", c);
    CHECK(plan[1] == 1.0f && plan[0] == 1.0f, "a fresh role plans current scaling");
    CHECK(slot[0] == 0 && slot[3] == 3 && slot[4] == 0 && slot[5] == 1 && next == 2, "ring positions");
    /* backwards: call 5 (slot 1) twice with amax 3 and 2, call 2 (slot 2) with 5, call 0 (slot 0) with inf */
    float g[2] = {3.0f, -2.0f};
    uint8_t q[2];
    float sinv;
    fp8mix_cast_opts o = {FP8MIX_E5M2, 1, FP8MIX_ROUND_NEAREST, 0, 0, 0};
    CHECK(fp8mix_cast_grad(g, FP8MIX_F32, 1, 2, 2, q, 2, NULL, 1, NULL, 0, 0, 0.0f, &pend[slot[5]], &o, &sinv, NULL,
                           NULL) == FP8MIX_OK, "grad cast");
    g[0] = 2.0f;
    fp8mix_cast_grad(g, FP8MIX_F32, 1, 2, 2, q, 2, NULL, 1, NULL, 0, 0, 0.0f, &pend[slot[5]], &o, &sinv, NULL, NULL);
    CHECK(pend[1] == 3.0f, "two backwards of one forward keep the max, got %g", (double)pend[1]);
    g[0] = 5.0f;
    fp8mix_cast_grad(g, FP8MIX_F32, 1, 2, 2, q, 2, NULL, 1, NULL, 0, 0, 0.0f, &pend[slot[2]], &o, &sinv, NULL, NULL);
    g[0] = INFINITY;
    fp8mix_cast_grad(g, FP8MIX_F32, 1, 2, 2, q, 2, NULL, 1, NULL, 0, 0, 0.0f, &pend[slot[0]], &o, &sinv, NULL, NULL);
    CHECK(pend[0] == 0.0f, "an infinite gradient amax is kept as 0 (no information)");
    int64_t r7;
    CHECK(fp8mix_delayed_flush(&st, 2, FP8MIX_E5M2, &rc, pend, K, &next, 1, 1, plan, &r7) == FP8MIX_OK, "flush");
    /* ring order from next = 2: slot 2 (5), slot 3 (empty), slot 0 (0), slot 1 (3) */
    CHECK(steps[2] == 3, "three filled slots recorded, got %lld", (long long)steps[2]);
    CHECK(hist[0 * 3 + 2] == 3.0f && hist[1 * 3 + 2] == 0.0f && hist[2 * 3 + 2] == 5.0f, "oldest first: %g %g %g",
          (double)hist[2], (double)hist[5], (double)hist[8]);
    CHECK(pend[0] == -1.0f && pend[1] == -1.0f && pend[2] == -1.0f && pend[3] == -1.0f, "slots emptied");
    CHECK(plan[1] == 0.0f && plan[0] == scale[2] && scale[2] == ref_scale(5.0f, FP8MIX_E5M2, 0, 0), "plan after");
    CHECK(r7 == 2 && next == 3, "reservation continues the ring");
}

static void test_cast_delayed(void)
{
    enum { M = 37, N = 150 };
    float *x = malloc(M * N * sizeof(float));
    uint8_t *q = malloc(M * N), *qr = malloc(M * N), *qt = malloc(M * N);
    for (int i = 0; i < M * N; i++) x[i] = ldexpf((float)((int)(rnd() % 2001) - 1000), -6);
    float hist[16 * 3] = {0}, scale[3] = {1, 1, 1}, sc[2], am;
    int64_t steps[3] = {0};
    fp8mix_delayed_state st = {hist, 16, 3, scale, steps};
    fp8mix_delayed_recipe rc = {8, FP8MIX_AMAX_MAX, 1, 0, 1};
    fp8mix_cast_opts o = {FP8MIX_E4M3, 1, FP8MIX_ROUND_NEAREST, 0, 0, 1};
    float a_true = 0.0f;
    for (int i = 0; i < M * N; i++) a_true = fabsf(x[i]) > a_true ? fabsf(x[i]) : a_true;
    /* read-only first use: scale from the tensor, state untouched */
    CHECK(fp8mix_cast_delayed(x, FP8MIX_F32, M, N, N, q, N, qt, M, &st, 0, &rc, NULL, 0, &o, sc, &am) == FP8MIX_OK,
          "cast");
    float s0 = ref_scale(a_true, FP8MIX_E4M3, 1, 0);
    CHECK(sc[0] == s0 && sc[1] == 1.0f / s0 && am == a_true, "fresh scale %g expected %g", (double)sc[0], (double)s0);
    CHECK(steps[0] == 0 && hist[0] == 0.0f && scale[0] == 1.0f, "record=0 changes nothing");
    fp8mix_cast(x, FP8MIX_F32, M, N, N, FP8MIX_GRAN_TENSOR, &s0, qr, N, NULL, 1, NULL, &o);
    CHECK(memcmp(q, qr, M * N) == 0, "bytes are fp8mix_cast's with that scale");
    int tr_ok = 1;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) tr_ok &= qt[j * M + i] == q[i * N + j];
    CHECK(tr_ok, "qt is q transposed");
    /* recording uses: the second cast uses the recorded scale */
    fp8mix_cast_delayed(x, FP8MIX_F32, M, N, N, q, N, NULL, 1, &st, 0, &rc, NULL, 1, &o, sc, NULL);
    CHECK(steps[0] == 1 && hist[0] == a_true && scale[0] == s0, "first record");
    for (int i = 0; i < M * N; i++) x[i] *= 4.0f;
    fp8mix_cast_delayed(x, FP8MIX_F32, M, N, N, q, N, NULL, 1, &st, 0, &rc, NULL, 1, &o, sc, NULL);
    CHECK(sc[0] == s0, "delayed: the cast uses the scale from before this tensor");
    CHECK(scale[0] == ref_scale(4.0f * a_true, FP8MIX_E4M3, 1, 0) && hist[0] == 4.0f * a_true && hist[3] == a_true,
          "then records it");
    /* the given fresh amax (e.g. all-reduced) wins over the tensor's own on a first use */
    float fa = 1000.0f;
    fp8mix_cast_delayed(x, FP8MIX_F32, M, N, N, q, N, NULL, 1, &st, 1, &rc, &fa, 0, &o, sc, NULL);
    CHECK(sc[0] == ref_scale(1000.0f, FP8MIX_E4M3, 1, 0), "fresh_amax");
    free(x); free(q); free(qr); free(qt);
}

static void test_cast_grad(void)
{
    enum { M = 70, N = 33 };
    float *dy = malloc(M * N * sizeof(float)), cs[N], plan[2] = {8.0f, 0.0f}, sinv, am, slot = -1.0f;
    uint8_t *q = malloc(M * N), *qr = malloc(M * N);
    for (int i = 0; i < M * N; i++) dy[i] = ((float)((int)(rnd() % 20001) - 10000)) * 1e-3f;
    fp8mix_cast_opts o = {FP8MIX_E5M2, 1, FP8MIX_ROUND_NEAREST, 0, 0, 1};
    CHECK(fp8mix_cast_grad(dy, FP8MIX_F32, M, N, N, q, N, NULL, 1, plan, 0, 0, 0.0f, &slot, &o, &sinv, &am, cs) ==
              FP8MIX_OK, "delayed grad cast");
    float s = 8.0f;
    fp8mix_cast(dy, FP8MIX_F32, M, N, N, FP8MIX_GRAN_TENSOR, &s, qr, N, NULL, 1, NULL, &o);
    CHECK(memcmp(q, qr, M * N) == 0 && sinv == 0.125f, "uses the plan's scale");
    CHECK(slot == am && am > 0.0f, "fills the pending slot with its amax");
    long bad = 0;
    double worst = 0.0;
    for (int j = 0; j < N; j++) {
        float f = 0.0f;
        double d = 0.0;
        for (int i = 0; i < M; i++) f += dy[i * N + j], d += dy[i * N + j];
        bad += f32_bits(f) != f32_bits(cs[j]);
        worst = fmax(worst, fabs(d - cs[j]));
    }
    CHECK(bad == 0 && worst < 1e-3, "column sums: %ld differ from the in-order float32 sum, worst %g vs float64",
          bad, worst);
    plan[1] = 1.0f; /* fresh: current scaling with margin 2 */
    fp8mix_cast_grad(dy, FP8MIX_F32, M, N, N, q, N, NULL, 1, plan, 2, 0, 0.0f, NULL, &o, &sinv, &am, NULL);
    CHECK(sinv == 1.0f / ref_scale(am, FP8MIX_E5M2, 2, 0), "current scaling when the plan says fresh");
    plan[0] = NAN;
    plan[1] = 0.0f;
    CHECK(fp8mix_cast_grad(dy, FP8MIX_F32, M, N, N, q, N, NULL, 1, plan, 0, 0, 0.0f, NULL, &o, &sinv, NULL, NULL) ==
              FP8MIX_ERR_BAD_SCALE, "NaN plan scale");
    free(dy); free(q); free(qr);
}

int main(void)
{
    test_record_matches_reference();
    test_errors_write_nothing();
    test_pending_ring();
    test_cast_delayed();
    test_cast_grad();
    return check_report("test_recipe");
}
