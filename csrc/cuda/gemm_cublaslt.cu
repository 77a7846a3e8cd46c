/*
 * gemm_cublaslt.cu — the scaled FP8 GEMM on tensor cores through cuBLASLt
 * (fp8mix_cuda_gemm; contract in fp8mix_cuda.h).  One problem, already in
 * cuBLASLt's layout: what to pad, copy or repack is decided by
 * fp8mix_mm_layout_plan (csrc/core/mm_layout.c) and carried out by scaled_mm.cu.
 *
 * cuBLASLt is column-major, so out[M,N] (row-major) is computed as its
 * transpose out^T[N,M] = B^T A^T: cuBLAS's "A" is our b (stored K x N
 * column-major, i.e. each of the N columns K-contiguous; op T gives N x K) and
 * cuBLAS's "B" is our a (M x K row-major = K x M column-major, op N).  That is
 * the "TN" layout FP8 kernels require.  Scales follow the operands: cuBLAS's
 * A scale is our scale_b, its B scale our scale_a.
 *
 * Host state: one cuBLASLt handle per device and, when the caller passes no
 * workspace, one 32 MiB workspace per device (created on first use, kept until
 * exit); a 64-entry round-robin cache of heuristic results keyed by everything
 * the heuristic sees, refusals included (so a refused problem costs one lookup the
 * next time).  All guarded by one mutex (held only around lookups).
 * Not here: packing, scale repacking and the bias-add fallback (scaled_mm.cu,
 * scale.cu).
 */
#include <cublasLt.h>

#include <cstring>
#include <mutex>

#include "encode.cuh"

#if !defined(CUBLAS_VERSION)
#define CUBLAS_VERSION 0
#endif
/* OUTER_VEC_32F / VEC128_32F / BLK128x128_32F scale modes: cuBLAS 12.9+. */
#define FP8MIX_HAVE_SCALE_MODES (CUBLAS_VERSION >= 120900)

namespace fp8mix_cuda {
namespace {

constexpr int kMaxDevices = 64;
constexpr size_t kWorkspace = FP8MIX_MM_WORKSPACE;
constexpr int kCacheSize = 64;

struct DeviceState {
    cublasLtHandle_t handle = nullptr;
    void *workspace = nullptr;
};

struct AlgoKey {
    int device;
    int64_t m, n, k, lda, ldb, ldo;
    int fa, fb, ot, bt, ska, skb, epilogue, fast;
    uint32_t align_a, align_b, align_d;
    size_t ws;
};

struct AlgoEntry {
    AlgoKey key;
    cublasLtMatmulAlgo_t algo;
    bool valid;
    bool found; /* false: the heuristic returned nothing for this key */
};

std::mutex g_mu;
DeviceState g_dev[kMaxDevices];
AlgoEntry g_cache[kCacheSize];
int g_cache_next = 0;

bool key_eq(const AlgoKey &a, const AlgoKey &b) { return memcmp(&a, &b, sizeof a) == 0; }

fp8mix_status blas_status(cublasStatus_t s, const char *where)
{
    if (s == CUBLAS_STATUS_SUCCESS) return FP8MIX_OK;
    set_error("fp8mix_cuda_gemm: %s: cuBLASLt %s (%s)", where, cublasLtGetStatusName(s), cublasLtGetStatusString(s));
    /* Our arguments are checked before cuBLASLt sees them, so INVALID_VALUE means a
     * combination this cuBLASLt does not take (cublasLt.h reports unsupported scale
     * types that way): a refusal, like NOT_SUPPORTED, that another library may serve. */
    return s == CUBLAS_STATUS_ALLOC_FAILED ? FP8MIX_ERR_NO_MEMORY : FP8MIX_ERR_UNSUPPORTED;
}

uint32_t alignment(const void *p)
{
    uint32_t a = 256;
    while (a > 1 && ((uintptr_t)p % a) != 0) a >>= 1;
    return a;
}

cudaDataType_t fp8_type(fp8mix_format f) { return f == FP8MIX_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

cudaDataType_t hp_type(fp8mix_dtype t)
{
    return t == FP8MIX_F32 ? CUDA_R_32F : t == FP8MIX_BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

const char *fmt_name(fp8mix_format f) { return f == FP8MIX_E4M3 ? "e4m3" : "e5m2"; }

/* The device's handle (and its workspace when `want_ws`), created on first use. */
fp8mix_status device_state(int dev, bool want_ws, DeviceState *out)
{
    if (dev < 0 || dev >= kMaxDevices) {
        set_error("fp8mix_cuda_gemm: device %d beyond the supported %d", dev, kMaxDevices);
        return FP8MIX_ERR_UNSUPPORTED;
    }
    std::lock_guard<std::mutex> lock(g_mu);
    DeviceState &d = g_dev[dev];
    if (!d.handle) {
        fp8mix_status st = blas_status(cublasLtCreate(&d.handle), "cublasLtCreate");
        if (st) {
            d.handle = nullptr;
            return st;
        }
    }
    if (want_ws && !d.workspace) {
        fp8mix_status st = cuda_status(cudaMalloc(&d.workspace, kWorkspace), "fp8mix_cuda_gemm (workspace)");
        if (st) {
            d.workspace = nullptr;
            return st;
        }
    }
    *out = d;
    return FP8MIX_OK;
}

/* RAII holders so that every early return frees the descriptors. */
struct Desc {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    ~Desc()
    {
        if (pref) cublasLtMatmulPreferenceDestroy(pref);
        if (d) cublasLtMatrixLayoutDestroy(d);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (op) cublasLtMatmulDescDestroy(op);
    }
};

template <typename T>
fp8mix_status set_attr(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attr, const T &v, const char *what)
{
    return blas_status(cublasLtMatmulDescSetAttribute(op, attr, &v, sizeof v), what);
}

/* Everything the host can check before touching cuBLASLt. */
fp8mix_status check_args(const fp8mix_cuda_gemm_args *g)
{
    const bool fmt_ok = (g->fmt_a == FP8MIX_E4M3 || g->fmt_a == FP8MIX_E5M2) &&
                        (g->fmt_b == FP8MIX_E4M3 || g->fmt_b == FP8MIX_E5M2);
    const bool kind_ok = g->scale_a_kind >= FP8MIX_MM_SCALE_TENSOR && g->scale_a_kind <= FP8MIX_MM_SCALE_BLOCK &&
                         g->scale_b_kind >= FP8MIX_MM_SCALE_TENSOR && g->scale_b_kind <= FP8MIX_MM_SCALE_BLOCK;
    const bool out_ok = g->out_t == FP8MIX_F32 || g->out_t == FP8MIX_BF16 || g->out_t == FP8MIX_F16;
    const bool bias_ok = !g->bias || g->bias_t == FP8MIX_F32 || g->bias_t == FP8MIX_BF16 || g->bias_t == FP8MIX_F16;
    if (!fmt_ok || !kind_ok || !out_ok || !bias_ok) return FP8MIX_ERR_BAD_ENUM;
    if (g->m < 0 || g->n < 0 || g->k < 0 || g->lda < g->k || g->ldb < g->k || g->ldo < g->n)
        return FP8MIX_ERR_BAD_SHAPE;
    if (g->m == 0 || g->n == 0) return FP8MIX_OK;
    if (!g->a || !g->b || !g->out || !g->scale_a || !g->scale_b) return FP8MIX_ERR_NULL_POINTER;
    if (g->fmt_a == FP8MIX_E5M2 && g->fmt_b == FP8MIX_E5M2) {
        set_error("fp8mix_cuda_gemm: E5M2 x E5M2 has no FP8 tensor-core kernel; cast one operand to E4M3");
        return FP8MIX_ERR_UNSUPPORTED;
    }
    const size_t osz = g->out_t == FP8MIX_F32 ? 4 : 2;
    if (g->k == 0 || g->k % 16 || g->n % 16) {
        set_error("fp8mix_cuda_gemm: K (%lld) and N (%lld) must be positive multiples of 16 for cuBLASLt FP8",
                  (long long)g->k, (long long)g->n);
        return FP8MIX_ERR_BAD_SHAPE;
    }
    if (g->lda % 16 || g->ldb % 16 || ((size_t)g->ldo * osz) % 16 || ((uintptr_t)g->a & 15) ||
        ((uintptr_t)g->b & 15) || ((uintptr_t)g->out & 15) || (g->bias && ((uintptr_t)g->bias & 15))) {
        set_error("fp8mix_cuda_gemm: operands must be 16-byte aligned with leading dimensions that are multiples of "
                  "16 bytes (lda %lld, ldb %lld, ldo %lld)",
                  (long long)g->lda, (long long)g->ldb, (long long)g->ldo);
        return FP8MIX_ERR_BAD_ARG;
    }
    return FP8MIX_OK;
}

/* The scale-kind, accumulation and epilogue rules of fp8mix_cuda_gemm. */
fp8mix_status check_modes(const fp8mix_cuda_gemm_args *g)
{
    const fp8mix_mm_scale ka = g->scale_a_kind, kb = g->scale_b_kind;
    if (ka != kb) {
        set_error("fp8mix_cuda_gemm: scale kinds of A and B differ (%d, %d); expand a TENSOR scale to OUTER first",
                  (int)ka, (int)kb);
        return FP8MIX_ERR_BAD_ARG;
    }
    if (ka == FP8MIX_MM_SCALE_BLOCK && g->fast_accum) {
        set_error("fp8mix_cuda_gemm: fast accumulation is not available with 128-block scales");
        return FP8MIX_ERR_BAD_ARG;
    }
    if (ka != FP8MIX_MM_SCALE_TENSOR && (!FP8MIX_HAVE_SCALE_MODES || cublasLtGetVersion() < 120900)) {
        set_error("fp8mix_cuda_gemm: row-wise and block scales need cuBLASLt >= 12.9 (built with %d, running %zu)",
                  CUBLAS_VERSION, cublasLtGetVersion());
        return FP8MIX_ERR_UNSUPPORTED;
    }
    if (g->bias && !fp8mix_cuda_gemm_bias_in_epilogue(g->bias_t, g->out_t, ka)) {
        set_error("fp8mix_cuda_gemm: this bias dtype / output dtype / scale kind has no cuBLASLt epilogue; "
                  "add the bias with fp8mix_cuda_bias_add");
        return FP8MIX_ERR_UNSUPPORTED;
    }
    return FP8MIX_OK;
}

/* The matmul descriptor: TN, compute 32F, scale pointers and modes, fast
 * accumulation, bias epilogue. */
fp8mix_status make_op_desc(const fp8mix_cuda_gemm_args *g, Desc &D)
{
    fp8mix_status st;
    const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
    if ((st = blas_status(cublasLtMatmulDescCreate(&D.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate")))
        return st;
    if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_TRANSA, opT, "TRANSA"))) return st;
    if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_TRANSB, opN, "TRANSB"))) return st;
    const void *sA = g->scale_b, *sB = g->scale_a; /* cuBLAS A is our b */
    if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, sA, "A_SCALE_POINTER"))) return st;
    if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, sB, "B_SCALE_POINTER"))) return st;
#if FP8MIX_HAVE_SCALE_MODES
    if (g->scale_a_kind == FP8MIX_MM_SCALE_OUTER) {
        const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode, "A_SCALE_MODE"))) return st;
        if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode, "B_SCALE_MODE"))) return st;
    } else if (g->scale_a_kind == FP8MIX_MM_SCALE_BLOCK) {
        const int32_t mode_w = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F; /* our b: the weight */
        const int32_t mode_x = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;     /* our a: 1x128 tiles */
        if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode_w, "A_SCALE_MODE"))) return st;
        if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode_x, "B_SCALE_MODE"))) return st;
    }
#endif
    const int8_t fast = g->fast_accum ? 1 : 0;
    if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast, "FAST_ACCUM"))) return st;
    const cublasLtEpilogue_t epi = g->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_EPILOGUE, epi, "EPILOGUE"))) return st;
    if (g->bias) {
        const void *bp = g->bias;
        const int32_t bt = (int32_t)hp_type(g->bias_t);
        if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bp, "BIAS_POINTER"))) return st;
        if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bt, "BIAS_DATA_TYPE"))) return st;
    }
    /* cuBLAS A: K x N column-major (our b); cuBLAS B: K x M column-major (our a); D: N x M (our out). */
    if ((st = blas_status(cublasLtMatrixLayoutCreate(&D.a, fp8_type(g->fmt_b), (uint64_t)g->k, (uint64_t)g->n,
                                                     g->ldb), "MatrixLayoutCreate(A)")))
        return st;
    if ((st = blas_status(cublasLtMatrixLayoutCreate(&D.b, fp8_type(g->fmt_a), (uint64_t)g->k, (uint64_t)g->m,
                                                     g->lda), "MatrixLayoutCreate(B)")))
        return st;
    return blas_status(cublasLtMatrixLayoutCreate(&D.d, hp_type(g->out_t), (uint64_t)g->n, (uint64_t)g->m, g->ldo),
                       "MatrixLayoutCreate(D)");
}

AlgoKey make_key(const fp8mix_cuda_gemm_args *g, int dev, size_t ws_size)
{
    AlgoKey key;
    memset(&key, 0, sizeof key); /* padding bytes take part in the comparison */
    key.device = dev;
    key.m = g->m; key.n = g->n; key.k = g->k;
    key.lda = g->lda; key.ldb = g->ldb; key.ldo = g->ldo;
    key.fa = g->fmt_a; key.fb = g->fmt_b; key.ot = g->out_t; key.bt = g->bias ? (int)g->bias_t : -1;
    key.ska = g->scale_a_kind; key.skb = g->scale_b_kind; key.epilogue = g->bias ? 1 : 0;
    key.fast = g->fast_accum ? 1 : 0;
    key.align_a = alignment(g->a); key.align_b = alignment(g->b); key.align_d = alignment(g->out);
    key.ws = ws_size;
    return key;
}

void cache_put(const AlgoKey &key, const cublasLtMatmulAlgo_t *algo)
{
    std::lock_guard<std::mutex> lock(g_mu);
    AlgoEntry &e = g_cache[g_cache_next];
    e.key = key;
    e.found = algo != nullptr;
    if (algo) e.algo = *algo;
    e.valid = true;
    g_cache_next = (g_cache_next + 1) % kCacheSize;
}

/* 1: cached algorithm in *algo; 0: cached refusal; -1: not cached. */
int cache_get(const AlgoKey &key, cublasLtMatmulAlgo_t *algo)
{
    std::lock_guard<std::mutex> lock(g_mu);
    for (int i = 0; i < kCacheSize; i++)
        if (g_cache[i].valid && key_eq(g_cache[i].key, key)) {
            if (g_cache[i].found) *algo = g_cache[i].algo;
            return g_cache[i].found ? 1 : 0;
        }
    return -1;
}

void set_no_algo_error(const fp8mix_cuda_gemm_args *g, cublasStatus_t hs)
{
    set_error("fp8mix_cuda_gemm: cuBLASLt found no FP8 algorithm (M=%lld N=%lld K=%lld, A %s, B %s, out type %d, "
              "scale kind %d, bias %d, fast_accum %d; row-wise/block scales need sm_90 and cuBLASLt >= 12.9): %s",
              (long long)g->m, (long long)g->n, (long long)g->k, fmt_name(g->fmt_a), fmt_name(g->fmt_b),
              (int)g->out_t, (int)g->scale_a_kind, g->bias ? 1 : 0, g->fast_accum ? 1 : 0,
              cublasLtGetStatusString(hs));
}

/* The heuristic's first algorithm for this problem (cached, refusals too). */
fp8mix_status find_algo(const fp8mix_cuda_gemm_args *g, const AlgoKey &key, cublasLtHandle_t h, Desc &D,
                        cublasLtMatmulAlgo_t *algo)
{
    const int hit = cache_get(key, algo);
    if (hit >= 0) {
        if (hit == 0) set_no_algo_error(g, CUBLAS_STATUS_NOT_SUPPORTED);
        return hit ? FP8MIX_OK : FP8MIX_ERR_UNSUPPORTED;
    }
    fp8mix_status st;
    if ((st = blas_status(cublasLtMatmulPreferenceCreate(&D.pref), "PreferenceCreate"))) return st;
    const uint64_t wsz = key.ws;
    if ((st = blas_status(cublasLtMatmulPreferenceSetAttribute(D.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz,
                                                               sizeof wsz), "PREF_MAX_WORKSPACE_BYTES")))
        return st;
    const uint32_t al[4] = {key.align_b, key.align_a, key.align_d, key.align_d}; /* cuBLAS A = our b */
    const cublasLtMatmulPreferenceAttributes_t pa[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        if ((st = blas_status(cublasLtMatmulPreferenceSetAttribute(D.pref, pa[i], &al[i], sizeof al[i]),
                              "PREF_MIN_ALIGNMENT")))
            return st;
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    int nres = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(h, D.op, D.a, D.b, D.d, D.d, D.pref, 1, &res, &nres);
    if (hs != CUBLAS_STATUS_SUCCESS || nres == 0) {
        if (hs == CUBLAS_STATUS_SUCCESS) hs = CUBLAS_STATUS_NOT_SUPPORTED;
        set_no_algo_error(g, hs);
        cache_put(key, nullptr); /* a refusal is as stable as the problem: do not ask again */
        return FP8MIX_ERR_UNSUPPORTED;
    }
    *algo = res.algo;
    cache_put(key, algo);
    return FP8MIX_OK;
}

} // namespace
} // namespace fp8mix_cuda

using namespace fp8mix_cuda;

extern "C" int64_t fp8mix_cuda_blas_version(void) { return (int64_t)cublasLtGetVersion(); }

extern "C" int fp8mix_cuda_gemm_bias_in_epilogue(fp8mix_dtype bias_t, fp8mix_dtype out_t, fp8mix_mm_scale kind)
{
    /* fp8mix_mm_layout_plan's rule R9 */
    return kind == FP8MIX_MM_SCALE_TENSOR && (out_t == FP8MIX_BF16 || out_t == FP8MIX_F16) && bias_t == out_t;
}

extern "C" fp8mix_status fp8mix_cuda_gemm(const fp8mix_cuda_gemm_args *g, cudaStream_t stream)
{
    begin_call();
    if (!g) return FP8MIX_ERR_NULL_POINTER;
    fp8mix_status st = check_args(g);
    if (st || g->m == 0 || g->n == 0) return st;
    if ((st = check_modes(g))) return st;
    int dev = 0;
    if ((st = cuda_status(cudaGetDevice(&dev), "fp8mix_cuda_gemm (cudaGetDevice)"))) return st;
    DeviceState ds;
    if ((st = device_state(dev, g->workspace == nullptr, &ds))) return st;
    void *ws = g->workspace ? g->workspace : ds.workspace;
    const size_t ws_size = g->workspace ? g->workspace_size : kWorkspace;
    Desc D;
    if ((st = make_op_desc(g, D))) return st;
    cublasLtMatmulAlgo_t algo;
    if ((st = find_algo(g, make_key(g, dev, ws_size), ds.handle, D, &algo))) return st;
    const float one = 1.0f, zero = 0.0f;
    st = blas_status(cublasLtMatmul(ds.handle, D.op, &one, g->b, D.a, g->a, D.b, &zero, g->out, D.d, g->out, D.d,
                                    &algo, ws, ws_size, stream),
                     "cublasLtMatmul");
    if (st) return st;
    return check_launch("fp8mix_cuda_gemm (after cublasLtMatmul)");
}
