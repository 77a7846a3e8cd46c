/*
 * recipe_plan.h — the host half of the CUDA recipe launchers (recipe.cu) and of the
 * statistics launcher (stats.cu), in plain C++ with no CUDA header: the argument
 * checks (the C core's statuses for the same bad input), the grid sizes and the
 * work-buffer layouts.  Being CUDA-free, a CPU test compiles it beside the C core
 * (tests/test_cuda_host.py builds csrc/cuda/tests/host_rules.cu with nvcc as host
 * code) and checks it against csrc/core/recipe.c and stats.c.
 * Not here: kernels (recipe.cu, stats.cu).
 */
#ifndef FP8MIX_CUDA_RECIPE_PLAN_H
#define FP8MIX_CUDA_RECIPE_PLAN_H

#include <stdint.h>

#include "fp8mix.h"

namespace fp8mix_cuda {

constexpr int kRecipeThreads = 256;   /* every recipe / statistics kernel's block size */
constexpr int kPrepassMax = 512;      /* blocks of the amax pre-pass (partials the cast reduces) */
constexpr int64_t kCastMaxBlocks = 4096; /* cast blocks of one state kernel (grid-stride beyond) */

/* Scratch of one recipe cast: the pre-pass's per-block maxima, the cast's amax
 * accumulator and its count of finished blocks (both zeroed by the pre-pass). */
struct RecipeWork {
    uint32_t partial[kPrepassMax];
    uint32_t acc;
    uint32_t done;
};

/* fp8mix.h's check of a delayed-scaling state and recipe (csrc/core/recipe.c
 * check_state), on the host-visible fields only. */
inline fp8mix_status check_delayed(const fp8mix_delayed_state *st, int64_t role, fp8mix_format fmt,
                                   const fp8mix_delayed_recipe *r)
{
    if (!st || !r || !st->history || !st->scale || !st->steps) return FP8MIX_ERR_NULL_POINTER;
    if ((fmt != FP8MIX_E4M3 && fmt != FP8MIX_E5M2) || (r->algo != FP8MIX_AMAX_MAX && r->algo != FP8MIX_AMAX_MOST_RECENT))
        return FP8MIX_ERR_BAD_ENUM;
    if (st->roles < 1 || role < 0 || role >= st->roles || st->capacity < 1 || r->history_len < 1 ||
        r->history_len > st->capacity || st->capacity > INT64_MAX / st->roles)
        return FP8MIX_ERR_BAD_SHAPE;
    if (r->margin < 0 || r->margin > 126 || r->interval < 1) return FP8MIX_ERR_BAD_ARG;
    return FP8MIX_OK;
}

/* The checks fp8mix_cast_grad makes before casting, beyond the cast's own: margin,
 * epsilon, the pending ring. */
inline fp8mix_status check_grad(fp8mix_format fmt, int margin, float eps, const float *pending, int64_t slots,
                                const int64_t *slot, const float *colsum, int64_t rows, int64_t cols, const void *dy)
{
    if (fmt != FP8MIX_E4M3 && fmt != FP8MIX_E5M2) return FP8MIX_ERR_BAD_ENUM;
    if (margin < 0 || margin > 126 || !(eps >= 0.0f) || eps > 3.40282346638528859812e+38f) return FP8MIX_ERR_BAD_ARG;
    if (colsum && cols > 0 && rows > 0 && !dy) return FP8MIX_ERR_NULL_POINTER;
    if (pending && !slot) return FP8MIX_ERR_NULL_POINTER;
    if (pending && slots < 1) return FP8MIX_ERR_BAD_SHAPE;
    return FP8MIX_OK;
}

inline int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Blocks of the pre-pass for `items` work items (16-byte units or elements): about
 * four per thread, at least 1, at most kPrepassMax. */
inline int prepass_blocks(int64_t items) { return (int)clamp64(ceil_div64(items, 4 * kRecipeThreads), 1, kPrepassMax); }

/* Cast blocks of a state kernel: one item (unit, element or 64x64 tile) per thread
 * (per block for tiles) up to kCastMaxBlocks, at least 1 (the last block writes the
 * outputs even for an empty tensor). */
inline int cast_blocks(int64_t items, int per_block) { return (int)clamp64(ceil_div64(items, per_block), 1, kCastMaxBlocks); }

/* Column-sum blocks: one thread per column. */
inline int colsum_blocks(int64_t cols) { return (int)ceil_div64(cols, kRecipeThreads); }

/* ---- statistics (fp8mix_quant_stats' fixed order, fp8mix.h) ------------------- */

constexpr int kStatsLanes = 16;
constexpr int kStatsMaxTasks = 4096;
constexpr int kStatsTasksPerBlock = kRecipeThreads / kStatsLanes;
constexpr int kStatsSums = 6;   /* x^2, e^2, t, t^2, t^3, t^4 */
constexpr int kStatsCounts = 7; /* nonzero, nan, nonfinite, underflow, saturated, overflow, subnormal */

/* Rows per task: 64, or the smallest multiple of 64 giving at most 4096 tasks. */
inline int64_t stats_rows_per_task(int64_t rows) { return 64 * ceil_div64(ceil_div64(rows, 64), kStatsMaxTasks); }
inline int64_t stats_tasks(int64_t rows, int64_t cols)
{
    return rows == 0 || cols == 0 ? 0 : ceil_div64(rows, stats_rows_per_task(rows));
}

/* Scratch of one statistics call (8-byte aligned). */
struct StatsWork {
    unsigned long long count[kStatsCounts];
    unsigned long long hist[FP8MIX_STATS_HIST_BINS];
    uint32_t min_bits, max_bits, done;
    float pivot;
    double task[kStatsMaxTasks][kStatsSums];
};

} // namespace fp8mix_cuda

#endif /* FP8MIX_CUDA_RECIPE_PLAN_H */
