/*
 * common.cu — host-side plumbing shared by the CUDA launchers: the per-thread
 * last-error message, CUDA error -> fp8mix_status mapping, and the switch for
 * the hardware FP8 convert instruction.  No kernels, no environment reads.
 */
#include <atomic>
#include <cstdarg>
#include <cstdio>

#include "encode.cuh"

namespace fp8mix_cuda {

static thread_local char g_last_error[512];
static std::atomic<int> g_hw_convert{1};

void set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
    va_end(ap);
}

fp8mix_status cuda_status(cudaError_t e, const char *where)
{
    if (e == cudaSuccess) return FP8MIX_OK;
    set_error("%s: CUDA error %d (%s): %s", where, (int)e, cudaGetErrorName(e), cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? FP8MIX_ERR_NO_MEMORY : FP8MIX_ERR_UNSUPPORTED;
}

fp8mix_status check_launch(const char *where)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return FP8MIX_OK;
    set_error("%s: CUDA error %d (%s): %s (cudaGetLastError also reports errors of earlier asynchronous "
              "launches on this thread, so it may not be this launch's)",
              where, (int)e, cudaGetErrorName(e), cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? FP8MIX_ERR_NO_MEMORY : FP8MIX_ERR_UNSUPPORTED;
}

} // namespace fp8mix_cuda

extern "C" const char *fp8mix_cuda_last_error(void) { return fp8mix_cuda::g_last_error; }

extern "C" void fp8mix_cuda_clear_error(void) { fp8mix_cuda::g_last_error[0] = 0; }

extern "C" void fp8mix_cuda_set_hw_convert(int on) { fp8mix_cuda::g_hw_convert.store(on ? 1 : 0); }

extern "C" int fp8mix_cuda_get_hw_convert(void) { return fp8mix_cuda::g_hw_convert.load(); }
