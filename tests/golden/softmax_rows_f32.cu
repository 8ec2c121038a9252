// launch: Rows { groups: 32, block: 128, splits: 1 }
// kiln kernel k0_max1_sub_exp_sum1_recip_mul — generated from kernel IR; do not edit.
// kiln_common.cuh — scalar helpers every rendered kernel may use.
// Half types are stored as 16-bit patterns and computed in f32; conversions use PTX `cvt`
// (no CUDA headers needed, so NVRTC compiles these anywhere).

__device__ __forceinline__ float kiln_f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short kiln_f32_to_f16(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float kiln_bf16_to_f32(unsigned short b) {
    return __uint_as_float(((unsigned int)b) << 16);
}
// Round to nearest even; NaN stays a (quiet) NaN.
__device__ __forceinline__ unsigned short kiln_f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
// Round an f32 value to the precision of a half type (results of f16/bf16 ops).
__device__ __forceinline__ float kiln_round_f16(float x) { return kiln_f16_to_f32(kiln_f32_to_f16(x)); }
__device__ __forceinline__ float kiln_round_bf16(float x) { return kiln_bf16_to_f32(kiln_f32_to_bf16(x)); }

// Float to integer casts with Rust `as` semantics: truncate toward zero, saturate, NaN -> 0.
__device__ __forceinline__ unsigned char kiln_f2u8(double x) {
    return x != x ? 0 : (x >= 255.0 ? 255 : (x <= 0.0 ? 0 : (unsigned char)x));
}
__device__ __forceinline__ int kiln_f2i32(double x) {
    return x != x ? 0 : (x >= 2147483647.0 ? 2147483647 : (x <= -2147483648.0 ? (-2147483647 - 1) : (int)x));
}
__device__ __forceinline__ long long kiln_f2i64(double x) {
    return x != x ? 0LL
                  : (x >= 9223372036854775807.0 ? 9223372036854775807LL
                                                : (x <= -9223372036854775808.0 ? (-9223372036854775807LL - 1) : (long long)x));
}

// Wrapping integer arithmetic (signed overflow must not be undefined behaviour).
__device__ __forceinline__ int kiln_add(int a, int b) { return (int)((unsigned int)a + (unsigned int)b); }
__device__ __forceinline__ int kiln_sub(int a, int b) { return (int)((unsigned int)a - (unsigned int)b); }
__device__ __forceinline__ int kiln_mul(int a, int b) { return (int)((unsigned int)a * (unsigned int)b); }
__device__ __forceinline__ long long kiln_add(long long a, long long b) { return (long long)((unsigned long long)a + (unsigned long long)b); }
__device__ __forceinline__ long long kiln_sub(long long a, long long b) { return (long long)((unsigned long long)a - (unsigned long long)b); }
__device__ __forceinline__ long long kiln_mul(long long a, long long b) { return (long long)((unsigned long long)a * (unsigned long long)b); }
__device__ __forceinline__ unsigned char kiln_add(unsigned char a, unsigned char b) { return (unsigned char)(a + b); }
__device__ __forceinline__ unsigned char kiln_sub(unsigned char a, unsigned char b) { return (unsigned char)(a - b); }
__device__ __forceinline__ unsigned char kiln_mul(unsigned char a, unsigned char b) { return (unsigned char)(a * b); }
__device__ __forceinline__ float kiln_add(float a, float b) { return a + b; }
__device__ __forceinline__ float kiln_sub(float a, float b) { return a - b; }
__device__ __forceinline__ float kiln_mul(float a, float b) { return a * b; }
__device__ __forceinline__ double kiln_add(double a, double b) { return a + b; }
__device__ __forceinline__ double kiln_sub(double a, double b) { return a - b; }
__device__ __forceinline__ double kiln_mul(double a, double b) { return a * b; }

// max/min that propagate NaN (a comparison with NaN is false, so test it explicitly).
template <typename T> __device__ __forceinline__ T kiln_max(T a, T b) { return (a != a || a > b) ? a : b; }
template <typename T> __device__ __forceinline__ T kiln_min(T a, T b) { return (a != a || a < b) ? a : b; }
template <typename T> __device__ __forceinline__ T kiln_relu(T a) { return (a != a || a > (T)0) ? a : (T)0; }

// An index for a gather or scatter: one outside 0..len is recorded in the kernel's error
// word (err[0] = 1, err[1] = the index, err[2] = len; the first one wins) and clamped, so
// the access stays inside the buffer. The host reads the word after the kernel.
__device__ __forceinline__ long long kiln_index(long long j, long long len, unsigned long long* err) {
    if (j < 0 || j >= len) {
        if (atomicCAS(err, 0ULL, 1ULL) == 0ULL) {
            err[1] = (unsigned long long)j;
            err[2] = (unsigned long long)len;
        }
        return j < 0 ? 0 : len - 1;
    }
    return j;
}

// Integer power, wrapping; negative exponents give the truncated real result.
__device__ __forceinline__ long long kiln_ipow(long long base, long long e) {
    if (e < 0) return base == 1 ? 1 : (base == -1 ? ((e & 1) ? -1 : 1) : 0);
    unsigned long long b = (unsigned long long)base, r = 1;
    while (e > 0) {
        if (e & 1) r *= b;
        b *= b;
        e >>= 1;
    }
    return (long long)r;
}

// Logistic function; the negative side as e^x / (1 + e^x) so tiny results keep their value.
__device__ __forceinline__ float kiln_sigmoid(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    const float e = expf(x);
    return e / (1.0f + e);
}
__device__ __forceinline__ double kiln_sigmoid(double x) {
    if (x >= 0.0) return 1.0 / (1.0 + exp(-x));
    const double e = exp(x);
    return e / (1.0 + e);
}
// PyTorch's softplus (beta 1, threshold 20): x above 20, else ln(1 + e^x) without overflow.
__device__ __forceinline__ float kiln_softplus(float x) {
    return x > 20.0f ? x : (x > 0.0f ? x + log1pf(expf(-x)) : log1pf(expf(x)));
}
__device__ __forceinline__ double kiln_softplus(double x) {
    return x > 20.0 ? x : (x > 0.0 ? x + log1p(exp(-x)) : log1p(exp(x)));
}
// SiLU x * sigmoid(x); NaN at -inf (-inf * 0), as PyTorch's x / (1 + e^-x).
__device__ __forceinline__ float kiln_silu(float x) { return x * kiln_sigmoid(x); }
__device__ __forceinline__ double kiln_silu(double x) { return x * kiln_sigmoid(x); }
// Integer fmod, remainder and floor division: 0 for a zero divisor (kiln's choice, see
// docs/semantics.md), MIN % -1 = 0 and MIN // -1 = MIN (wrapping, never undefined).
template <typename T> __device__ __forceinline__ bool kiln_is_minus_one(T b) {
    return (T)-1 < (T)0 && b == (T)-1;
}
template <typename T> __device__ __forceinline__ T kiln_ifmod(T a, T b) {
    return (b == (T)0 || kiln_is_minus_one(b)) ? (T)0 : (T)(a % b);
}
template <typename T> __device__ __forceinline__ T kiln_iremainder(T a, T b) {
    T r = kiln_ifmod(a, b);
    return (r != (T)0 && ((r < (T)0) != (b < (T)0))) ? (T)(r + b) : r;
}
template <typename T> __device__ __forceinline__ T kiln_ifloor_divide(T a, T b) {
    if (b == (T)0) return (T)0;
    if (kiln_is_minus_one(b)) return kiln_sub((T)0, a);
    T q = (T)(a / b);
    return (a % b != (T)0 && ((a < (T)0) != (b < (T)0))) ? (T)(q - (T)1) : q;
}
// Float remainder (Python's %): fmod, plus b where the signs differ.
__device__ __forceinline__ float kiln_fremainder(float a, float b) {
    float m = fmodf(a, b);
    return (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) ? m + b : m;
}
__device__ __forceinline__ double kiln_fremainder(double a, double b) {
    double m = fmod(a, b);
    return (m != 0.0 && ((b < 0.0) != (m < 0.0))) ? m + b : m;
}
// Float floor division, PyTorch's algorithm step for step (so 1 // 0.1 = 9).
__device__ __forceinline__ float kiln_ffloor_divide(float a, float b) {
    if (b == 0.0f) return a / b;
    float m = fmodf(a, b);
    float div = (a - m) / b;
    if (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) div -= 1.0f;
    if (div != 0.0f) {
        float f = floorf(div);
        return div - f > 0.5f ? f + 1.0f : f;
    }
    return copysignf(0.0f, a / b);
}
__device__ __forceinline__ double kiln_ffloor_divide(double a, double b) {
    if (b == 0.0) return a / b;
    double m = fmod(a, b);
    double div = (a - m) / b;
    if (m != 0.0 && ((b < 0.0) != (m < 0.0))) div -= 1.0;
    if (div != 0.0) {
        double f = floor(div);
        return div - f > 0.5 ? f + 1.0 : f;
    }
    return copysign(0.0, a / b);
}
// Exact GELU through erfc (accurate for negative x); -0 at -inf, its limit (not -inf * 0).
__device__ __forceinline__ float kiln_gelu(float x) { return isinf(x) && x < 0.0f ? -0.0f : 0.5f * x * erfcf(-x * 0.70710678118654752f); }
__device__ __forceinline__ double kiln_gelu(double x) { return isinf(x) && x < 0.0 ? -0.0 : 0.5 * x * erfc(-x * 0.70710678118654752); }
// kiln_reduce.cuh — block-cooperative reductions: every thread holds a partial result; warp
// shuffles combine within a warp, shared memory across warps, and the block's result is
// returned to every thread. Half types accumulate in f32 (their compute type).
// OP: 0 sum, 1 prod, 2 max, 3 min; 4 argmax, 5 argmin (value + index).

template <int OP, typename T> __device__ __forceinline__ T kiln_combine(T a, T b) {
    if (OP == 0) return kiln_add(a, b);
    if (OP == 1) return kiln_mul(a, b);
    if (OP == 2) return kiln_max(a, b);
    return kiln_min(a, b);
}

// Shuffles for every accumulator type (u8 values travel as int).
__device__ __forceinline__ float kiln_shfl_down(float v, int o) { return __shfl_down_sync(0xffffffffu, v, o); }
__device__ __forceinline__ double kiln_shfl_down(double v, int o) { return __shfl_down_sync(0xffffffffu, v, o); }
__device__ __forceinline__ int kiln_shfl_down(int v, int o) { return __shfl_down_sync(0xffffffffu, v, o); }
__device__ __forceinline__ long long kiln_shfl_down(long long v, int o) { return __shfl_down_sync(0xffffffffu, v, o); }
__device__ __forceinline__ unsigned char kiln_shfl_down(unsigned char v, int o) {
    return (unsigned char)__shfl_down_sync(0xffffffffu, (int)v, o);
}

// `smem` holds at least 32 values of 8 bytes. Every thread of the block must call this.
template <int OP, typename T> __device__ T kiln_block_reduce(T v, T identity, unsigned long long* smem) {
    T* s = (T*)smem;
    for (int o = 16; o > 0; o >>= 1) v = kiln_combine<OP>(v, kiln_shfl_down(v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) s[warp] = v;
    __syncthreads();
    const int warps = (blockDim.x + 31) >> 5;
    if (warp == 0) {
        v = lane < warps ? s[lane] : identity;
        for (int o = 16; o > 0; o >>= 1) v = kiln_combine<OP>(v, kiln_shfl_down(v, o));
        if (lane == 0) s[0] = v;
    }
    __syncthreads();
    return s[0];
}

// Arg-reductions: (value, index), index < 0 = empty. Ties go to the smaller index; a NaN
// beats every number (the first NaN wins).
template <int OP, typename T> __device__ __forceinline__ void kiln_arg_combine(T& v, long long& i, T v2, long long i2) {
    if (i2 < 0) return;
    bool better;
    if (i < 0) better = true;
    else if (v != v) better = (v2 != v2) && i2 < i;
    else if (v2 != v2) better = true;
    else better = (OP == 4 ? v2 > v : v2 < v) || (v2 == v && i2 < i);
    if (better) { v = v2; i = i2; }
}

// Leaves the block's (value, index) in every thread's `v` and `i`; `i` stays negative when the
// block saw no element, so partial results of split reductions combine correctly.
template <int OP, typename T> __device__ void kiln_block_arg_reduce(T& v, long long& i, unsigned long long* smem) {
    T* sv = (T*)smem;
    long long* si = (long long*)(smem + 32);
    for (int o = 16; o > 0; o >>= 1) {
        T v2 = kiln_shfl_down(v, o);
        long long i2 = __shfl_down_sync(0xffffffffu, i, o);
        kiln_arg_combine<OP>(v, i, v2, i2);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) { sv[warp] = v; si[warp] = i; }
    __syncthreads();
    const int warps = (blockDim.x + 31) >> 5;
    if (warp == 0) {
        if (lane < warps) { v = sv[lane]; i = si[lane]; } else { i = -1; }
        for (int o = 16; o > 0; o >>= 1) {
            T v2 = kiln_shfl_down(v, o);
            long long i2 = __shfl_down_sync(0xffffffffu, i, o);
            kiln_arg_combine<OP>(v, i, v2, i2);
        }
        if (lane == 0) { sv[0] = v; si[0] = i; }
    }
    __syncthreads();
    v = sv[0];
    i = si[0];
}

// Lane reductions, for blocks that reduce L rows at once (columns of a row-major tensor): thread
// (lane = threadIdx.x % L, t = threadIdx.x / L) holds a partial result of row `lane`; the
// partials of a lane are combined in t order through shared memory, and every thread gets its
// lane's value. A warp's threads are L consecutive rows, so their loads are coalesced where the
// rows are adjacent in memory. `smem` holds 2 * blockDim.x values of 8 bytes.
template <int OP, int L, typename T> __device__ T kiln_lane_reduce(T v, unsigned long long* smem) {
    T* s = (T*)smem;
    __syncthreads();
    s[threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.x < L) {
        for (int t = threadIdx.x + L; t < blockDim.x; t += L) v = kiln_combine<OP>(v, s[t]);
        s[threadIdx.x] = v;
    }
    __syncthreads();
    return s[threadIdx.x % L];
}

template <int OP, int L, typename T> __device__ void kiln_lane_arg_reduce(T& v, long long& i, unsigned long long* smem) {
    T* sv = (T*)smem;
    long long* si = (long long*)(smem + blockDim.x);
    __syncthreads();
    sv[threadIdx.x] = v;
    si[threadIdx.x] = i;
    __syncthreads();
    if (threadIdx.x < L) {
        for (int t = threadIdx.x + L; t < blockDim.x; t += L) kiln_arg_combine<OP>(v, i, sv[t], si[t]);
        sv[threadIdx.x] = v;
        si[threadIdx.x] = i;
    }
    __syncthreads();
    v = sv[threadIdx.x % L];
    i = si[threadIdx.x % L];
}

extern "C" __global__ void __launch_bounds__(128) k0_max1_sub_exp_sum1_recip_mul(const float* __restrict__ a0, float* __restrict__ a1) {
    __shared__ unsigned long long smem_[64];
    const int t_ = threadIdx.x;
    for (long long g_ = blockIdx.x; g_ < 32LL; g_ += gridDim.x) {
        const long long row_ = g_;
        int r_ = (int)row_;
        const int c0 = r_;
        float rc0_[1];
        float acc1 = __int_as_float(0xff800000);
        #pragma unroll
        for (int q_ = 0; q_ < 1; ++q_) {
            const int a_ = t_ + q_ * 128;
            if (a_ < 100) {
            int r_ = a_;
            const int c1 = r_;
            const float v0 = a0[c0 * 100 + c1];
            rc0_[q_] = v0;
            acc1 = kiln_combine<2>(acc1, (float)v0);
            }
        }
        acc1 = kiln_block_reduce<2, float>(acc1, __int_as_float(0xff800000), smem_);
        const float v1 = (float)acc1;
        float acc4 = (float)0;
        #pragma unroll
        for (int q_ = 0; q_ < 1; ++q_) {
            const int a_ = t_ + q_ * 128;
            if (a_ < 100) {
            int r_ = a_;
            const int c1 = r_;
            const float v0 = rc0_[q_];
            const float v2 = kiln_sub((float)v0, (float)v1);
            const float v3 = expf(v2);
            acc4 = kiln_combine<0>(acc4, (float)v3);
            }
        }
        acc4 = kiln_block_reduce<0, float>(acc4, (float)0, smem_);
        const float v4 = (float)acc4;
        const float v5 = (1.0f / v4);
        #pragma unroll
        for (int q_ = 0; q_ < 1; ++q_) {
            const int a_ = t_ + q_ * 128;
            if (a_ < 100) {
            int r_ = a_;
            const int c1 = r_;
            const float v0 = rc0_[q_];
            const float v2 = kiln_sub((float)v0, (float)v1);
            const float v3 = expf(v2);
            const float v6 = kiln_mul((float)v3, (float)v5);
            a1[c0 * 100 + c1] = v6;
            }
        }
    }
}
