// kiln_matmul.cuh — batched matmul for the dtypes cuBLAS does not cover here (integers):
// one thread per output element, grid-stride, operands read through (batch, row, column)
// strides, integer products and sums wrap.

template <typename T>
__device__ void kiln_matmul_naive(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c,
                                  long long batch, long long m, long long n, long long k,
                                  long long a_bs, long long a_rs, long long a_cs,
                                  long long b_bs, long long b_rs, long long b_cs) {
    const long long total = batch * m * n;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const long long j = i % n, r = (i / n) % m, bi = i / (m * n);
        const T* pa = a + bi * a_bs + r * a_rs;
        const T* pb = b + bi * b_bs + j * b_cs;
        T acc = (T)0;
        for (long long p = 0; p < k; ++p) acc = kiln_add(acc, kiln_mul(pa[p * a_cs], pb[p * b_rs]));
        c[i] = acc;
    }
}

#define KILN_MATMUL_ENTRY(NAME, T)                                                                  \
    extern "C" __global__ void __launch_bounds__(256) NAME(const T* a, const T* b, T* c, long long batch, \
        long long m, long long n, long long k, long long a_bs, long long a_rs, long long a_cs,   \
        long long b_bs, long long b_rs, long long b_cs) {                                       \
        kiln_matmul_naive<T>(a, b, c, batch, m, n, k, a_bs, a_rs, a_cs, b_bs, b_rs, b_cs);      \
    }

KILN_MATMUL_ENTRY(kiln_matmul_i32, int)
KILN_MATMUL_ENTRY(kiln_matmul_i64, long long)
KILN_MATMUL_ENTRY(kiln_matmul_u8, unsigned char)
