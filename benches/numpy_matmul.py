"""NumPy f32 matmul reference for kiln's `examples/gemm_probe.rs`.

Times np.matmul on f32 n×n operands (standard normal), best of REPS after one warm-up,
and prints GFLOP/s = 2·n³ / best time, plus the BLAS library and kernel in use
(via threadpoolctl when it is installed).

    python benches/numpy_matmul.py [REPS] [N...]     # defaults: 7 1024 2048

On machines that set OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE in the environment, unset
both for this command only (`env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python ...`)
to get the kernel OpenBLAS would pick for the CPU itself; the script prints which one ran.
"""

import os
import sys
import time

import numpy as np


def describe_blas():
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed"
    parts = []
    for info in threadpool_info():
        if info.get("user_api") != "blas":
            continue
        parts.append(
            "{} {} arch={} threads={}".format(
                info.get("internal_api"),
                info.get("version"),
                info.get("architecture"),
                info.get("num_threads"),
            )
        )
    return "; ".join(parts) or "no BLAS found"


def best_of(reps, fn):
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main():
    args = sys.argv[1:]
    reps = int(args[0]) if args else 7
    sizes = [int(s) for s in args[1:]] or [1024, 2048]
    env = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}
    print(f"numpy {np.__version__}  blas: {describe_blas()}  env: {env or 'unset'}")
    rng = np.random.default_rng(0)
    for n in sizes:
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        wide = rng.standard_normal((n, 2 * n), dtype=np.float32)
        strided = wide[:, ::2]  # row stride 2n, column stride 2 (as in gemm_probe)
        out = np.empty((n, n), dtype=np.float32)
        cases = [
            ("f32 a@b", lambda: np.matmul(a, b, out=out)),
            ("f32 a.T@b", lambda: np.matmul(a.T, b, out=out)),
            ("f32 a@b.T", lambda: np.matmul(a, b.T, out=out)),
            ("f32 a[:, ::2]@b", lambda: np.matmul(strided, b, out=out)),
        ]
        for name, fn in cases:
            s = best_of(reps, fn)
            print(f"n={n:<5} numpy {name:<16} {s * 1e3:>9.3f} ms {2 * n**3 / s / 1e9:>8.1f} GFLOP/s")


if __name__ == "__main__":
    main()
