/*
 * gemm_cublaslt.cu — the scaled FP8 GEMM on tensor cores through cuBLASLt
 * (fp8mix_cuda_gemm; contract in fp8mix_cuda.h).
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
 * the heuristic sees.  All guarded by one mutex (held only around lookups).
 * Not here: the bias add fallback kernel (scale.cu).
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
constexpr size_t kWorkspace = 32u << 20;
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
    switch (s) {
    case CUBLAS_STATUS_NOT_SUPPORTED: return FP8MIX_ERR_UNSUPPORTED;
    case CUBLAS_STATUS_INVALID_VALUE: return FP8MIX_ERR_BAD_ARG;
    case CUBLAS_STATUS_ALLOC_FAILED: return FP8MIX_ERR_NO_MEMORY;
    default: return FP8MIX_ERR_UNSUPPORTED;
    }
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

} // namespace
} // namespace fp8mix_cuda

using namespace fp8mix_cuda;

extern "C" int fp8mix_cuda_gemm_bias_in_epilogue(fp8mix_dtype bias_t, fp8mix_dtype out_t, fp8mix_mm_scale kind)
{
    if (kind == FP8MIX_MM_SCALE_BLOCK) return 0;
    if (out_t == FP8MIX_F32) return bias_t == FP8MIX_BF16;
    return (out_t == FP8MIX_BF16 || out_t == FP8MIX_F16) && bias_t == out_t;
}

extern "C" fp8mix_status fp8mix_cuda_gemm(const fp8mix_cuda_gemm_args *g, cudaStream_t stream)
{
    if (!g) return FP8MIX_ERR_NULL_POINTER;
    const bool fmt_ok = (g->fmt_a == FP8MIX_E4M3 || g->fmt_a == FP8MIX_E5M2) &&
                        (g->fmt_b == FP8MIX_E4M3 || g->fmt_b == FP8MIX_E5M2);
    const bool kind_ok = g->scale_a_kind >= FP8MIX_MM_SCALE_TENSOR && g->scale_a_kind <= FP8MIX_MM_SCALE_BLOCK &&
                         g->scale_b_kind >= FP8MIX_MM_SCALE_TENSOR && g->scale_b_kind <= FP8MIX_MM_SCALE_BLOCK;
    const bool out_ok = g->out_t == FP8MIX_F32 || g->out_t == FP8MIX_BF16 || g->out_t == FP8MIX_F16;
    const bool bias_ok = !g->bias || g->bias_t == FP8MIX_F32 || g->bias_t == FP8MIX_BF16 || g->bias_t == FP8MIX_F16;
    if (!fmt_ok || !kind_ok || !out_ok || !bias_ok) return FP8MIX_ERR_BAD_ENUM;
    const int64_t M = g->m, N = g->n, K = g->k;
    if (M < 0 || N < 0 || K < 0 || g->lda < K || g->ldb < K || g->ldo < N) return FP8MIX_ERR_BAD_SHAPE;
    if (M == 0 || N == 0) return FP8MIX_OK;
    if (!g->a || !g->b || !g->out || !g->scale_a || !g->scale_b) return FP8MIX_ERR_NULL_POINTER;
    if (g->fmt_a == FP8MIX_E5M2 && g->fmt_b == FP8MIX_E5M2) {
        set_error("fp8mix_cuda_gemm: E5M2 x E5M2 has no FP8 tensor-core kernel; cast one operand to E4M3");
        return FP8MIX_ERR_UNSUPPORTED;
    }
    const size_t osz = g->out_t == FP8MIX_F32 ? 4 : 2;
    if (K == 0 || K % 16 || N % 16) {
        set_error("fp8mix_cuda_gemm: K (%lld) and N (%lld) must be positive multiples of 16 for cuBLASLt FP8",
                  (long long)K, (long long)N);
        return FP8MIX_ERR_BAD_SHAPE;
    }
    if (g->lda % 16 || g->ldb % 16 || ((size_t)g->ldo * osz) % 16 || ((uintptr_t)g->a & 15) ||
        ((uintptr_t)g->b & 15) || ((uintptr_t)g->out & 15) || (g->bias && ((uintptr_t)g->bias & 15))) {
        set_error("fp8mix_cuda_gemm: operands must be 16-byte aligned with leading dimensions that are multiples of "
                  "16 bytes (lda %lld, ldb %lld, ldo %lld)",
                  (long long)g->lda, (long long)g->ldb, (long long)g->ldo);
        return FP8MIX_ERR_BAD_ARG;
    }
    fp8mix_mm_scale ka = g->scale_a_kind, kb = g->scale_b_kind;
    const bool block = ka == FP8MIX_MM_SCALE_BLOCK || kb == FP8MIX_MM_SCALE_BLOCK;
    if (ka != kb) {
        set_error("fp8mix_cuda_gemm: scale kinds of A and B differ (%d, %d); expand a TENSOR scale to OUTER first",
                  (int)ka, (int)kb);
        return FP8MIX_ERR_BAD_ARG;
    }
    if (block && g->fast_accum) {
        set_error("fp8mix_cuda_gemm: fast accumulation is not available with 128-block scales");
        return FP8MIX_ERR_BAD_ARG;
    }
#if !FP8MIX_HAVE_SCALE_MODES
    if (ka != FP8MIX_MM_SCALE_TENSOR) {
        set_error("fp8mix_cuda_gemm: row-wise and block scales need cuBLAS >= 12.9 (built with %d)", CUBLAS_VERSION);
        return FP8MIX_ERR_UNSUPPORTED;
    }
#endif
    const bool epi_bias = g->bias != nullptr;
    if (epi_bias && !fp8mix_cuda_gemm_bias_in_epilogue(g->bias_t, g->out_t, ka)) {
        set_error("fp8mix_cuda_gemm: this bias dtype / output dtype / scale kind has no cuBLASLt epilogue; "
                  "add the bias with fp8mix_cuda_bias_add");
        return FP8MIX_ERR_UNSUPPORTED;
    }

    int dev = 0;
    fp8mix_status st = cuda_status(cudaGetDevice(&dev), "fp8mix_cuda_gemm (cudaGetDevice)");
    if (st) return st;
    DeviceState ds;
    if ((st = device_state(dev, g->workspace == nullptr, &ds))) return st;
    void *ws = g->workspace ? g->workspace : ds.workspace;
    const size_t ws_size = g->workspace ? g->workspace_size : kWorkspace;

    Desc D;
    const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
    if ((st = blas_status(cublasLtMatmulDescCreate(&D.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate")))
        return st;
    if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_TRANSA, opT, "TRANSA"))) return st;
    if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_TRANSB, opN, "TRANSB"))) return st;
    const void *sA = g->scale_b, *sB = g->scale_a; /* cuBLAS A is our b */
    if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, sA, "A_SCALE_POINTER"))) return st;
    if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, sB, "B_SCALE_POINTER"))) return st;
#if FP8MIX_HAVE_SCALE_MODES
    if (ka == FP8MIX_MM_SCALE_OUTER) {
        const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode, "A_SCALE_MODE"))) return st;
        if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode, "B_SCALE_MODE"))) return st;
    } else if (ka == FP8MIX_MM_SCALE_BLOCK) {
        const int32_t mode_w = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F; /* our b: the weight */
        const int32_t mode_x = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;     /* our a: 1x128 tiles */
        if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode_w, "A_SCALE_MODE"))) return st;
        if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode_x, "B_SCALE_MODE"))) return st;
    }
#endif
    const int8_t fast = g->fast_accum ? 1 : 0;
    if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast, "FAST_ACCUM"))) return st;
    cublasLtEpilogue_t epi = epi_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_EPILOGUE, epi, "EPILOGUE"))) return st;
    if (epi_bias) {
        const void *bp = g->bias;
        const int32_t bt = (int32_t)hp_type(g->bias_t);
        if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bp, "BIAS_POINTER"))) return st;
        if ((st = set_attr(D.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bt, "BIAS_DATA_TYPE"))) return st;
    }
    /* cuBLAS A: K x N column-major (our b); cuBLAS B: K x M column-major (our a); D: N x M (our out). */
    if ((st = blas_status(cublasLtMatrixLayoutCreate(&D.a, fp8_type(g->fmt_b), (uint64_t)K, (uint64_t)N, g->ldb),
                          "MatrixLayoutCreate(A)")))
        return st;
    if ((st = blas_status(cublasLtMatrixLayoutCreate(&D.b, fp8_type(g->fmt_a), (uint64_t)K, (uint64_t)M, g->lda),
                          "MatrixLayoutCreate(B)")))
        return st;
    if ((st = blas_status(cublasLtMatrixLayoutCreate(&D.d, hp_type(g->out_t), (uint64_t)N, (uint64_t)M, g->ldo),
                          "MatrixLayoutCreate(D)")))
        return st;

    AlgoKey key;
    memset(&key, 0, sizeof key); /* padding bytes take part in the comparison */
    key.device = dev;
    key.m = M; key.n = N; key.k = K;
    key.lda = g->lda; key.ldb = g->ldb; key.ldo = g->ldo;
    key.fa = g->fmt_a; key.fb = g->fmt_b; key.ot = g->out_t; key.bt = epi_bias ? (int)g->bias_t : -1;
    key.ska = ka; key.skb = kb; key.epilogue = (int)epi; key.fast = fast;
    key.align_a = alignment(g->a); key.align_b = alignment(g->b); key.align_d = alignment(g->out);
    key.ws = ws_size;

    cublasLtMatmulAlgo_t algo;
    bool found = false;
    {
        std::lock_guard<std::mutex> lock(g_mu);
        for (int i = 0; i < kCacheSize; i++)
            if (g_cache[i].valid && key_eq(g_cache[i].key, key)) {
                algo = g_cache[i].algo;
                found = true;
                break;
            }
    }
    if (!found) {
        if ((st = blas_status(cublasLtMatmulPreferenceCreate(&D.pref), "PreferenceCreate"))) return st;
        const uint64_t wsz = ws_size;
        if ((st = blas_status(cublasLtMatmulPreferenceSetAttribute(D.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                   &wsz, sizeof wsz),
                              "PREF_MAX_WORKSPACE_BYTES")))
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
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(ds.handle, D.op, D.a, D.b, D.d, D.d, D.pref, 1, &res, &nres);
        if (hs != CUBLAS_STATUS_SUCCESS || nres == 0) {
            if (hs == CUBLAS_STATUS_SUCCESS) hs = CUBLAS_STATUS_NOT_SUPPORTED;
            blas_status(hs, "no cuBLASLt algorithm for this FP8 problem");
            set_error("fp8mix_cuda_gemm: cuBLASLt found no FP8 algorithm (M=%lld N=%lld K=%lld, A %s, B %s, out "
                      "type %d, scale kind %d, bias %d, fast_accum %d; row-wise/block scales need sm_90 and cuBLAS "
                      ">= 12.9): %s",
                      (long long)M, (long long)N, (long long)K, g->fmt_a == FP8MIX_E4M3 ? "e4m3" : "e5m2",
                      g->fmt_b == FP8MIX_E4M3 ? "e4m3" : "e5m2", (int)g->out_t, (int)ka, (int)epi_bias, (int)fast,
                      cublasLtGetStatusString(hs));
            return FP8MIX_ERR_UNSUPPORTED;
        }
        algo = res.algo;
        std::lock_guard<std::mutex> lock(g_mu);
        g_cache[g_cache_next].key = key;
        g_cache[g_cache_next].algo = algo;
        g_cache[g_cache_next].valid = true;
        g_cache_next = (g_cache_next + 1) % kCacheSize;
    }
    const float one = 1.0f, zero = 0.0f;
    st = blas_status(cublasLtMatmul(ds.handle, D.op, &one, g->b, D.a, g->a, D.b, &zero, g->out, D.d, g->out, D.d, &algo,
                                    ws, ws_size, stream),
                     "cublasLtMatmul");
    if (st) return st;
    return check_launch("fp8mix_cuda_gemm (after cublasLtMatmul)");
}
