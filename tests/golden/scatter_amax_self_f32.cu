// launch: Elementwise { numel: 3200 }
// kiln kernel k0_scatter_amax_start — generated; do not edit.
extern "C" __global__ void __launch_bounds__(256) k0_scatter_amax_start(const float* __restrict__ init, float* __restrict__ out) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < 3200LL; i += (long long)gridDim.x * blockDim.x) {
        long long r_ = i;
        const long long c1 = r_ % 32LL; r_ /= 32LL;
        const long long c0 = r_ % 100LL; r_ /= 100LL;
        out[i] = init[(long long)0 + c0 * (long long)1 + c1 * (long long)100];
    }
}
// launch: Elementwise { numel: 256 }
// kiln kernel k0_scatter_amax — generated from a scatter; do not edit.
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

extern "C" __global__ void __launch_bounds__(256) k0_scatter_amax(const long long* __restrict__ a0, const float* __restrict__ a1, const float* __restrict__ a2, float* __restrict__ a3, unsigned long long* __restrict__ kerr) {
    for (long long i_ = (long long)blockIdx.x * blockDim.x + threadIdx.x; i_ < 256LL; i_ += (long long)gridDim.x * blockDim.x) {
        long long r_ = i_;
        const long long c1 = r_ % 32LL; r_ /= 32LL;
        const long long c0 = r_ % 8LL; r_ /= 8LL;
        const long long j_ = kiln_index(a0[(long long)0 + c0 * (long long)32 + c1 * (long long)1], 100LL, kerr);
        { int* p_ = (int*)&a3[c1 * 1LL + j_ * 32LL]; const float b = (float)(a1[(long long)0 + c0 * (long long)100 + c1 * (long long)1]); int old_ = *p_, seen_; do { seen_ = old_; const float a = __int_as_float(seen_); const float n_ = (a != a || a > b) ? a : b; const int nb_ = __float_as_int(n_); if (nb_ == seen_) break; old_ = atomicCAS(p_, seen_, nb_); } while (old_ != seen_); }
    }
}
