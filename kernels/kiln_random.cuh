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
