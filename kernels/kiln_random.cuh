// kiln_random.cuh — the counter-based generator of src/random.rs: every sample is a pure
// function of (seed, element index), bit-identical to the CPU for rand and up to the
// rounding of logf/cosf for randn.

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
__device__ __forceinline__ float kiln_normal_f32(unsigned long long seed, unsigned long long i) {
    float u1 = (float)((kiln_rand_bits(seed, 2ULL * i) >> 40) + 1ULL) * (1.0f / 16777216.0f);
    float u2 = kiln_uniform_f32(seed, 2ULL * i + 1ULL);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318548f * u2);
}
__device__ __forceinline__ double kiln_normal_f64(unsigned long long seed, unsigned long long i) {
    double u1 = (double)((kiln_rand_bits(seed, 2ULL * i) >> 11) + 1ULL) * (1.0 / 9007199254740992.0);
    double u2 = kiln_uniform_f64(seed, 2ULL * i + 1ULL);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
