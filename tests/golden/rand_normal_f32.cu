// launch: Elementwise { numel: 64 }
// kiln kernel k0_add — generated from kernel IR; do not edit.
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
// kiln_random.cuh — the counter-based generator of src/random.rs: every sample is a pure
// function of (seed, element index). rand (all dtypes) and f32/f16/bf16 randn are
// bit-identical to the CPU: randn uses the same log and cos polynomials as the CPU backend
// (src/math/f32.rs), with the same operations in the same order, every multiply-add
// an explicit fmaf and no other contraction (kernels are compiled with --fmad=false).
// f64 randn uses CUDA's log/cos and may differ from the CPU in the last bit.

// Constants of src/math/f32.rs as f32 bit patterns (a unit test there checks that
// these lines match the Rust constants).
#define KILN_RNG_L3 0x3eaaaaaau
#define KILN_RNG_L4 0xbe800117u
#define KILN_RNG_L5 0x3e4cd022u
#define KILN_RNG_L6 0xbe2a3832u
#define KILN_RNG_L7 0x3e11698eu
#define KILN_RNG_L8 0xbe06c89au
#define KILN_RNG_L9 0x3e02c924u
#define KILN_RNG_L10 0xbd9c7d5cu
#define KILN_RNG_LN2_HI 0x3f317218u
#define KILN_RNG_LN2_LO 0xb102e308u
#define KILN_RNG_FRAC_2_PI 0x3f22f983u
#define KILN_RNG_PIO2_1 0x3fc90fdbu
#define KILN_RNG_PIO2_2 0xb33bbd2eu
#define KILN_RNG_PIO2_3 0xa6f72cedu
#define KILN_RNG_S3 0xbe2aaaa2u
#define KILN_RNG_S5 0x3c088361u
#define KILN_RNG_S7 0xb94c8ce7u
#define KILN_RNG_C4 0x3d2aaaaau
#define KILN_RNG_C6 0xbab60889u
#define KILN_RNG_C8 0x37cd8982u
#define KILN_RNG_TAU 0x40c90fdbu
#define KILN_RNG_F(name) __uint_as_float(KILN_RNG_##name)

__device__ __forceinline__ unsigned long long kiln_rand_bits(unsigned long long seed, unsigned long long index) {
    unsigned long long z = seed * 0xD1B54A32D192ED03ULL + (index + 1ULL) * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
__device__ __forceinline__ float kiln_uniform_f32(unsigned long long seed, unsigned long long i) {
    return (float)(kiln_rand_bits(seed, i) >> 40) * (1.0f / 16777216.0f);
}
__device__ __forceinline__ double kiln_uniform_f64(unsigned long long seed, unsigned long long i) {
    return (double)(kiln_rand_bits(seed, i) >> 11) * (1.0 / 9007199254740992.0);
}
// ln x for normal positive x (math.rs log_f32 without its subnormal and special-value
// branches, which Box-Muller's u1 in [2^-24, 1] never takes).
__device__ __forceinline__ float kiln_rng_log(float x) {
    unsigned int ix = __float_as_uint(x) + (0x3F800000u - 0x3F3504F3u);
    float e = (float)((int)(ix >> 23) - 127);
    float m = __uint_as_float((ix & 0x007FFFFFu) + 0x3F3504F3u);
    float f = m - 1.0f;
    float f2 = f * f;
    float p = fmaf(KILN_RNG_F(L10), f, KILN_RNG_F(L9));
    p = fmaf(p, f, KILN_RNG_F(L8));
    p = fmaf(p, f, KILN_RNG_F(L7));
    p = fmaf(p, f, KILN_RNG_F(L6));
    p = fmaf(p, f, KILN_RNG_F(L5));
    p = fmaf(p, f, KILN_RNG_F(L4));
    p = fmaf(p, f, KILN_RNG_F(L3));
    float y = (f2 * f) * p;
    y = fmaf(e, KILN_RNG_F(LN2_LO), y);
    y = fmaf(-0.5f, f2, y);
    float r = f + y;
    return fmaf(e, KILN_RNG_F(LN2_HI), r);
}
// cos x for finite x >= 0 below 2^18 (f32.rs cos_f32_fast: Cody-Waite reduction by pi/2, the
// sin or cos polynomial by quadrant).
__device__ __forceinline__ float kiln_rng_cos(float ax) {
    const float two23 = 8388608.0f;
    float t = fmaf(ax, KILN_RNG_F(FRAC_2_PI), two23);
    float n = t - two23;
    unsigned int q = __float_as_uint(t) + 1u;
    float r = fmaf(-n, KILN_RNG_F(PIO2_1), ax);
    r = fmaf(-n, KILN_RNG_F(PIO2_2), r);
    r = fmaf(-n, KILN_RNG_F(PIO2_3), r);
    float r2 = r * r;
    float ps = fmaf(fmaf(KILN_RNG_F(S7), r2, KILN_RNG_F(S5)), r2, KILN_RNG_F(S3));
    float s = fmaf(r * r2, ps, r);
    float pc = fmaf(fmaf(KILN_RNG_F(C8), r2, KILN_RNG_F(C6)), r2, KILN_RNG_F(C4));
    float c = fmaf(r2, fmaf(r2, pc, -0.5f), 1.0f);
    float v = (q & 1u) == 0u ? s : c;
    return __uint_as_float(__float_as_uint(v) ^ ((q & 2u) << 30));
}
__device__ __forceinline__ float kiln_normal_f32(unsigned long long seed, unsigned long long i) {
    float u1 = (float)((kiln_rand_bits(seed, 2ULL * i) >> 40) + 1ULL) * (1.0f / 16777216.0f);
    float u2 = kiln_uniform_f32(seed, 2ULL * i + 1ULL);
    return __fsqrt_rn(-2.0f * kiln_rng_log(u1)) * kiln_rng_cos(KILN_RNG_F(TAU) * u2);
}
__device__ __forceinline__ double kiln_normal_f64(unsigned long long seed, unsigned long long i) {
    double u1 = (double)((kiln_rand_bits(seed, 2ULL * i) >> 11) + 1ULL) * (1.0 / 9007199254740992.0);
    double u2 = kiln_uniform_f64(seed, 2ULL * i + 1ULL);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

extern "C" __global__ void __launch_bounds__(256) k0_add(float* __restrict__ a0, const unsigned long long p0, const unsigned long long p1) {
    const long long n_ = 64LL, nv_ = 16LL;
    const long long stride_ = (long long)gridDim.x * blockDim.x;
    for (long long j_ = (long long)blockIdx.x * blockDim.x + threadIdx.x; j_ < nv_; j_ += stride_) {
        const int i__0 = (int)(4 * j_ + 0);
        int r__0 = i__0;
        const int c1_0 = r__0 % 8; r__0 /= 8;
        const int c0_0 = r__0;
        const float v0_0 = kiln_uniform_f32(p0, (unsigned long long)(c0_0 * 8 + c1_0));
        const float v1_0 = kiln_normal_f32(p1, (unsigned long long)(c0_0 * 8 + c1_0));
        const float v2_0 = kiln_add((float)v0_0, (float)v1_0);
        const int i__1 = (int)(4 * j_ + 1);
        int r__1 = i__1;
        const int c1_1 = r__1 % 8; r__1 /= 8;
        const int c0_1 = r__1;
        const float v0_1 = kiln_uniform_f32(p0, (unsigned long long)(c0_1 * 8 + c1_1));
        const float v1_1 = kiln_normal_f32(p1, (unsigned long long)(c0_1 * 8 + c1_1));
        const float v2_1 = kiln_add((float)v0_1, (float)v1_1);
        const int i__2 = (int)(4 * j_ + 2);
        int r__2 = i__2;
        const int c1_2 = r__2 % 8; r__2 /= 8;
        const int c0_2 = r__2;
        const float v0_2 = kiln_uniform_f32(p0, (unsigned long long)(c0_2 * 8 + c1_2));
        const float v1_2 = kiln_normal_f32(p1, (unsigned long long)(c0_2 * 8 + c1_2));
        const float v2_2 = kiln_add((float)v0_2, (float)v1_2);
        const int i__3 = (int)(4 * j_ + 3);
        int r__3 = i__3;
        const int c1_3 = r__3 % 8; r__3 /= 8;
        const int c0_3 = r__3;
        const float v0_3 = kiln_uniform_f32(p0, (unsigned long long)(c0_3 * 8 + c1_3));
        const float v1_3 = kiln_normal_f32(p1, (unsigned long long)(c0_3 * 8 + c1_3));
        const float v2_3 = kiln_add((float)v0_3, (float)v1_3);
        reinterpret_cast<float4*>(a0)[j_] = make_float4(v2_0, v2_1, v2_2, v2_3);
    }
}
