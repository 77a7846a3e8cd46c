#!/usr/bin/env python3
"""Print a folder holding cuBLASLt's headers (cublasLt.h), for the nvcc compile check.

The machine's nvcc has no cuBLAS; NVIDIA's pip wheel does. Download it (no dependencies)
into a temporary folder, extract only its C headers and print their include directory.
Prints nothing and exits 1 when that fails (the compile check then skips that file).
"""
import glob
import os
import subprocess
import sys
import tempfile
import zipfile


def main() -> int:
    d = tempfile.mkdtemp(prefix="cublas_hdr_")
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", d, "nvidia-cublas>=13,<14"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wheels = glob.glob(os.path.join(d, "*.whl"))
    if r.returncode != 0 or not wheels:
        return 1
    with zipfile.ZipFile(wheels[0]) as z:
        for name in z.namelist():
            if "/include/" in name and name.endswith(".h"):
                z.extract(name, d)
    os.remove(wheels[0])
    hits = glob.glob(os.path.join(d, "nvidia", "*", "include", "cublasLt.h"))
    if not hits:
        return 1
    print(os.path.dirname(hits[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
