// module.cpp — the fp8mix._C module: PyInit__C makes an empty module with the CPython C
// API (the ops register themselves with torch's dispatcher when the library is loaded:
// schema.cpp, ops_cpu.cpp, ops_cuda.cpp), hands the C core's parallel loops to torch's
// intra-op threads, and adds the direct calls (direct.cpp). Not here: any op.
#include <Python.h>

#include <ATen/Parallel.h>

#include <exception>

#include "fp8mix.h"
#include "ops.h"

// The C core's parallel loops run on PyTorch's intra-op threads: two pools on the same
// cores would compete (torch's OpenMP threads spin after each of torch's loops). With an
// OpenMP torch, at::parallel_for is a pragma compiled here: only a file built with
// OpenMP (setup.py's -fopenmp) runs it in parallel; otherwise the C core keeps its pool.
#if AT_PARALLEL_NATIVE || (AT_PARALLEL_OPENMP && defined(_OPENMP))
#define FP8MIX_TORCH_THREADS 1
namespace {
void run_on_torch_threads(int workers, fp8mix_worker_body body, void *job)
{
    at::parallel_for(0, workers, 1, [&](int64_t b, int64_t e) {
        for (int64_t w = b; w < e; w++) body(job, static_cast<int>(w));
    });
}
} // namespace
#endif

extern "C" PyObject *PyInit__C(void)
{
#ifdef FP8MIX_TORCH_THREADS
    fp8mix_set_thread_pool(run_on_torch_threads);
    const long torch_threads = 1;
#else
    const long torch_threads = 0;
#endif
    static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C", "fp8mix native ops (registered as torch.ops.fp8mix)", -1,
                              nullptr};
    PyObject *m = PyModule_Create(&def);
    // whether the C core's loops run on torch's threads (tests/test_threads.py)
    if (m && PyModule_AddIntConstant(m, "torch_threads", torch_threads) < 0) {
        Py_DECREF(m);
        return nullptr;
    }
    try {
        if (m) fp8mix_torch::add_direct_calls(m);
    } catch (const std::exception &e) {
        Py_DECREF(m);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ImportError, e.what());
        return nullptr;
    }
    return m;
}
