/*
 * host_rules.cpp — the CUDA backend's host+device rules, run on the CPU against the
 * C core (no GPU, no CUDA toolkit: the headers it includes are CUDA-free when not
 * compiled by nvcc).  Built and run by tests/test_cuda_host.py:
 *   c++ -std=c++17 -ffp-contract=off -Icsrc/include -Icsrc/core host_rules.cpp libfp8mix_core.a
 * Checks
 *   - recipe_plan.h's argument checks give the C core's status for the same bad
 *     input (fp8mix_delayed_record / _flush / fp8mix_cast_grad);
 *   - stats_rules.cuh, run serially in the order stats.cu's threads follow (one
 *     (task, lane) per thread, tasks of stats_rows_per_task rows, the lane tree, tasks
 *     added in order), equals fp8mix_quant_stats bit for bit on every granularity,
 *     format, input type, the pivot cases, bad scales and more than 262144 rows;
 *   - stats_frexp equals frexpf (normals, subnormals).
 * Exit status 0 and "host_rules: ok (N checks)", else the first failure and 1.
 */
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../stats_rules.cuh"

using namespace fp8mix_cuda;

static long g_checks = 0;

#define CHECK(cond, ...)                                                                                             \
    do {                                                                                                             \
        g_checks++;                                                                                                  \
        if (!(cond)) {                                                                                               \
            std::fprintf(stderr, "host_rules: FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond);                       \
            std::fprintf(stderr, __VA_ARGS__);                                                                       \
            std::fprintf(stderr, "\n");                                                                              \
            std::exit(1);                                                                                            \
        }                                                                                                            \
    } while (0)

/* ---- a tiny deterministic generator -------------------------------------------- */
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t next_u32()
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}
static float next_normal()
{
    float u1 = ((next_u32() >> 8) + 1) * (1.0f / 16777217.0f), u2 = (next_u32() >> 8) * (1.0f / 16777216.0f);
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
}

/* ---- recipe_plan.h checks vs the C core ----------------------------------------- */
static void check_delayed_statuses()
{
    float hist[8 * 3] = {0}, scale[3] = {1, 1, 1};
    int64_t steps[3] = {0, 0, 0};
    for (int variant = 0; variant < 16; variant++) {
        fp8mix_delayed_state st = {hist, 8, 3, scale, steps};
        fp8mix_delayed_recipe r = {4, FP8MIX_AMAX_MAX, 0, 0, 1};
        int64_t role = 1;
        fp8mix_format fmt = FP8MIX_E4M3;
        switch (variant) {
        case 1: st.history = nullptr; break;
        case 2: st.steps = nullptr; break;
        case 3: fmt = (fp8mix_format)7; break;
        case 4: r.algo = (fp8mix_amax_algo)5; break;
        case 5: role = 3; break;
        case 6: role = -1; break;
        case 7: r.history_len = 9; break;
        case 8: r.history_len = 0; break;
        case 9: st.capacity = 0; break;
        case 10: st.roles = 0; break;
        case 11: r.margin = 127; break;
        case 12: r.margin = -1; break;
        case 13: r.interval = 0; break;
        case 14: st.capacity = INT64_MAX / 2; break;
        default: break; /* 0, 15: valid */
        }
        const fp8mix_status mine = check_delayed(&st, role, fmt, &r);
        if (mine != FP8MIX_OK || variant == 0) { /* the C core mutates a valid state: compare errors only */
            float amax = 2.0f;
            const fp8mix_status core = variant == 0 ? FP8MIX_OK : fp8mix_delayed_record(&st, role, fmt, &r, amax);
            CHECK(mine == core, "variant %d: recipe_plan %d, C core %d", variant, (int)mine, (int)core);
            float pending[2] = {-1, -1}, plan[2];
            int64_t next = 0, reserved;
            const fp8mix_status fl = variant == 0 ? FP8MIX_OK
                                                  : fp8mix_delayed_flush(&st, role, fmt, &r, pending, 2, &next, 1, 1,
                                                                         plan, &reserved);
            CHECK(mine == fl, "variant %d (flush): recipe_plan %d, C core %d", variant, (int)mine, (int)fl);
        }
    }
    CHECK(check_delayed(nullptr, 0, FP8MIX_E4M3, nullptr) == FP8MIX_ERR_NULL_POINTER, "null state");
}

static void check_grad_statuses()
{
    float dy[4] = {1, 2, 3, 4}, sinv, amax, cs[2];
    uint8_t q[4];
    fp8mix_cast_opts o;
    std::memset(&o, 0, sizeof o);
    o.saturate = 1;
    const struct {
        int fmt, margin;
        float eps;
    } bad[] = {{7, 0, 0.0f}, {0, -1, 0.0f}, {0, 127, 0.0f}, {1, 0, -1.0f}, {0, 0, INFINITY}, {0, 0, NAN}};
    for (const auto &b : bad) {
        o.fmt = (fp8mix_format)b.fmt;
        const fp8mix_status core = fp8mix_cast_grad(dy, FP8MIX_F32, 2, 2, 2, q, 2, nullptr, 1, nullptr, b.margin, 0,
                                                    b.eps, nullptr, &o, &sinv, &amax, cs);
        const fp8mix_status mine = check_grad(o.fmt, b.margin, b.eps, nullptr, 0, nullptr, cs, 2, 2, dy);
        CHECK(mine == core && mine != FP8MIX_OK, "fmt %d margin %d eps %g: recipe_plan %d, C core %d", b.fmt,
              b.margin, (double)b.eps, (int)mine, (int)core);
    }
    o.fmt = FP8MIX_E4M3;
    CHECK(check_grad(o.fmt, 0, 0.0f, nullptr, 0, nullptr, cs, 2, 2, nullptr) ==
              fp8mix_cast_grad(nullptr, FP8MIX_F32, 2, 2, 2, q, 2, nullptr, 1, nullptr, 0, 0, 0.0f, nullptr, &o, &sinv,
                               &amax, cs),
          "colsum without dy");
    float pend[2];
    int64_t slot = 0;
    CHECK(check_grad(o.fmt, 0, 0.0f, pend, 2, nullptr, nullptr, 2, 2, dy) == FP8MIX_ERR_NULL_POINTER, "no slot");
    CHECK(check_grad(o.fmt, 0, 0.0f, pend, 0, &slot, nullptr, 2, 2, dy) == FP8MIX_ERR_BAD_SHAPE, "no slots");
    CHECK(check_grad(o.fmt, 0, 0.0f, pend, 2, &slot, nullptr, 2, 2, dy) == FP8MIX_OK, "valid ring");
}

static void check_grids()
{
    CHECK(prepass_blocks(0) == 1 && prepass_blocks(1) == 1 && prepass_blocks(INT64_MAX / 8) == kPrepassMax, "prepass");
    CHECK(cast_blocks(0, 256) == 1 && cast_blocks(257, 256) == 2 && cast_blocks(INT64_MAX / 8, 1) == kCastMaxBlocks,
          "cast blocks");
    CHECK(colsum_blocks(0) == 0 && colsum_blocks(256) == 1 && colsum_blocks(257) == 2, "colsum blocks");
    CHECK(stats_rows_per_task(1) == 64 && stats_rows_per_task(262144) == 64 && stats_rows_per_task(262145) == 128,
          "rows per task");
    CHECK(stats_tasks(0, 5) == 0 && stats_tasks(5, 0) == 0 && stats_tasks(65, 1) == 2, "tasks");
}

/* ---- statistics: the device order, serially ------------------------------------- */
static float load(const void *x, fp8mix_dtype xt, int64_t k)
{
    if (xt == FP8MIX_F32) return ((const float *)x)[k];
    const uint16_t h = ((const uint16_t *)x)[k];
    if (xt == FP8MIX_BF16) return bits_f32((uint32_t)h << 16);
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0x1Fu) return bits_f32(sign | 0x7F800000u | (m << 13));
    if (e == 0) return bits_f32(sign | f32_bits((float)m * 0x1p-24f));
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

static int64_t tile_of(fp8mix_granularity g, int64_t i, int64_t j, int64_t cols)
{
    const int64_t nbc = (cols + 127) / 128;
    switch (g) {
    case FP8MIX_GRAN_TENSOR: return 0;
    case FP8MIX_GRAN_ROW: return i;
    case FP8MIX_GRAN_BLOCK: return i * nbc + j / 128;
    default: return (i / 128) * nbc + j / 128;
    }
}

/* What stats.cu computes, in its order (rows x cols dense, ld = cols). */
static void emulate(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, const uint8_t *q, fp8mix_format fmt,
                    fp8mix_granularity g, const float *sinv, int bad_as_one, double out[FP8MIX_STATS_N])
{
    const float kmax = 3.40282346638528859812e+38f;
    float pivot = 0.0f;
    for (int64_t e = 0; e < rows * cols; e++)
        if (std::fabs(load(x, xt, e)) <= kmax) {
            pivot = load(x, xt, e);
            break;
        }
    unsigned long long cnt[kStatsCounts] = {0}, hist[FP8MIX_STATS_HIST_BINS] = {0};
    uint32_t mn = 0x7F800000u, mx = 0;
    double sums[kStatsSums] = {0};
    const int64_t per = stats_rows_per_task(rows), ntasks = stats_tasks(rows, cols);
    for (int64_t t = 0; t < ntasks; t++) {
        StatsLane lanes[kStatsLanes];
        for (auto &l : lanes) stats_lane_init(l);
        for (int64_t i = t * per; i < rows && i < (t + 1) * per; i++)
            for (int64_t j = 0; j < cols; j++) {
                float si = sinv[tile_of(g, i, j, cols)];
                if (bad_as_one && !(si > 0.0f && si <= kmax)) si = 1.0f;
                StatsSeg seg;
                stats_seg(seg, fmt, si, pivot);
                const int bin = stats_elem(lanes[j % kStatsLanes], load(x, xt, i * cols + j),
                                           fp8mix_decode_ref(q[i * cols + j], fmt), seg);
                if (bin >= 0) hist[bin]++;
            }
        for (int k = 0; k < kStatsSums; k++) {
            double p[kStatsLanes];
            for (int l = 0; l < kStatsLanes; l++) p[l] = lanes[l].sum[k];
            sums[k] = d_add(sums[k], stats_tree(p, 1));
        }
        for (auto &l : lanes) {
            for (int k = 0; k < kStatsCounts; k++) cnt[k] += l.count[k];
            mn = l.min_bits < mn ? l.min_bits : mn;
            mx = l.max_bits > mx ? l.max_bits : mx;
        }
    }
    std::memset(out, 0, sizeof(double) * FP8MIX_STATS_N);
    out[FP8MIX_STATS_NUMEL] = (double)(rows * cols);
    for (int k = 0; k < kStatsCounts; k++) out[stats_count_entry(k)] = (double)cnt[k];
    for (int k = 0; k < kStatsSums; k++) out[stats_sum_entry(k)] = sums[k];
    for (int b = 0; b < FP8MIX_STATS_HIST_BINS; b++) out[FP8MIX_STATS_HIST + b] = (double)hist[b];
    out[FP8MIX_STATS_MIN_NONZERO] = (double)bits_f32(mn);
    out[FP8MIX_STATS_MAX_FINITE] = (double)bits_f32(mx);
    out[FP8MIX_STATS_PIVOT] = (double)pivot;
    const int64_t ns = rows == 0 || cols == 0 ? 0 : fp8mix_scale_count(g, rows, cols);
    double bad = 0;
    float lo = INFINITY, hi = 0.0f;
    for (int64_t k = 0; k < ns; k++) {
        if (!(sinv[k] > 0.0f && sinv[k] <= kmax)) {
            bad++;
            continue;
        }
        lo = sinv[k] < lo ? sinv[k] : lo;
        hi = sinv[k] > hi ? sinv[k] : hi;
    }
    out[FP8MIX_STATS_BAD_SCALES] = bad;
    out[FP8MIX_STATS_SCALE_INV_MIN] = (double)lo;
    out[FP8MIX_STATS_SCALE_INV_MAX] = (double)hi;
}

/* Inputs of one case: wide-range values with specials, bytes from a real cast (a few
 * random bytes mixed in, NaN codes among them), scales per granularity. */
struct StatsCase {
    std::vector<uint8_t> x;
    std::vector<uint8_t> q;
    std::vector<float> sinv;
};

static StatsCase make_case(fp8mix_dtype xt, int64_t rows, int64_t cols, fp8mix_format fmt, fp8mix_granularity g,
                           int lead_nonfinite, int bad_scale)
{
    StatsCase c;
    const int64_t n = rows * cols, es = xt == FP8MIX_F32 ? 4 : 2;
    std::vector<float> f((size_t)n);
    for (int64_t k = 0; k < n; k++) f[k] = next_normal() * std::ldexp(1.0f, (int)(next_u32() % 40) - 20);
    const float specials[] = {INFINITY, -INFINITY, NAN, -NAN, 0.0f, -0.0f, 1e-30f, 7e4f, -1e-42f};
    for (int64_t k = 0; k < n; k++)
        if (next_u32() % 50 == 0) f[k] = specials[next_u32() % 9];
    for (int64_t k = 0; k < lead_nonfinite && k < n; k++) f[k] = k % 2 ? NAN : -INFINITY;
    c.x.resize((size_t)(n * es));
    for (int64_t k = 0; k < n; k++) {
        if (xt == FP8MIX_F32) std::memcpy(&c.x[k * 4], &f[k], 4);
        else {
            const uint16_t h = xt == FP8MIX_BF16 ? fp8r_f32_to_bf16(f[k]) : fp8r_f32_to_f16(f[k]);
            std::memcpy(&c.x[k * 2], &h, 2);
        }
    }
    const int64_t ns = fp8mix_scale_count(g, rows, cols);
    c.sinv.assign((size_t)(ns > 0 ? ns : 1), 1.0f);
    c.q.assign((size_t)(n > 0 ? n : 1), 0);
    if (n > 0) {
        std::vector<float> amax((size_t)ns);
        fp8mix_cast_opts o;
        std::memset(&o, 0, sizeof o);
        o.fmt = fmt;
        o.saturate = next_u32() % 2;
        CHECK(fp8mix_quantize_current(c.x.data(), xt, rows, cols, cols, g, (int)(next_u32() % 3), 0, 0.0f,
                                      c.q.data(), cols, nullptr, 1, c.sinv.data(), amax.data(), &o) == FP8MIX_OK,
              "quantize_current");
        for (int64_t k = 0; k < n; k++)
            if (next_u32() % 97 == 0) c.q[k] = (uint8_t)next_u32();
    }
    if (bad_scale && ns > 0) c.sinv[next_u32() % ns] = bad_scale == 1 ? 0.0f : NAN;
    return c;
}

static void check_stats_case(fp8mix_dtype xt, int64_t rows, int64_t cols, fp8mix_format fmt, fp8mix_granularity g,
                             int lead_nonfinite, int bad_scale)
{
    StatsCase c = make_case(xt, rows, cols, fmt, g, lead_nonfinite, bad_scale);
    double want[FP8MIX_STATS_N], got[FP8MIX_STATS_N];
    fp8mix_stats_opts o = {bad_scale ? 1 : 0};
    CHECK(fp8mix_quant_stats(c.x.data(), xt, rows, cols, cols > 0 ? cols : 1, c.q.data(), cols > 0 ? cols : 1, fmt,
                             g, c.sinv.data(), &o, want) == FP8MIX_OK,
          "fp8mix_quant_stats");
    emulate(c.x.data(), xt, rows, cols, c.q.data(), fmt, g, c.sinv.data(), bad_scale ? 1 : 0, got);
    for (int k = 0; k < FP8MIX_STATS_N; k++) {
        uint64_t a, b;
        std::memcpy(&a, &got[k], 8);
        std::memcpy(&b, &want[k], 8);
        CHECK(a == b, "entry %d of %lldx%lld xt %d fmt %d gran %d: emulation %.17g (0x%016llx), C core %.17g "
                      "(0x%016llx)",
              k, (long long)rows, (long long)cols, (int)xt, (int)fmt, (int)g, got[k], (unsigned long long)a, want[k],
              (unsigned long long)b);
    }
}

static void check_stats()
{
    const int64_t shapes[][2] = {{64, 256}, {37, 203}, {257, 129}, {1, 16}, {3, 17}, {130, 300}, {0, 8}, {5, 0}};
    int i = 0;
    for (const auto &sh : shapes)
        for (int xt = 0; xt < 3; xt++)
            for (int g = 0; g < 4; g++) {
                i++;
                check_stats_case((fp8mix_dtype)xt, sh[0], sh[1], (fp8mix_format)(i % 2), (fp8mix_granularity)g,
                                 i % 5 == 0 ? 3 : 0, i % 7 == 0 ? 1 + i % 2 : 0);
            }
    check_stats_case(FP8MIX_F32, 4, 8, FP8MIX_E4M3, FP8MIX_GRAN_TENSOR, 32, 0); /* no finite x: pivot 0 */
    check_stats_case(FP8MIX_BF16, 300000, 1, FP8MIX_E5M2, FP8MIX_GRAN_ROW, 0, 0); /* 128 rows per task */
}

static void check_frexp()
{
    for (int k = 0; k < 200000; k++) {
        uint32_t u = next_u32() & 0x7FFFFFFFu;
        if (k < 1000) u = (uint32_t)k + 1; /* the smallest subnormals */
        if (u == 0 || u >= 0x7F800000u) continue;
        int e1, e2;
        const float a = bits_f32(u), f1 = stats_frexp(a, &e1), f2 = std::frexp(a, &e2);
        CHECK(e1 == e2 && f32_bits(f1) == f32_bits(f2), "frexp of 0x%08x: (%a, %d) vs (%a, %d)", u, (double)f1, e1,
              (double)f2, e2);
    }
}

int main()
{
    check_delayed_statuses();
    check_grad_statuses();
    check_grids();
    check_frexp();
    check_stats();
    std::printf("host_rules: ok (%ld checks)\n", g_checks);
    return 0;
}
