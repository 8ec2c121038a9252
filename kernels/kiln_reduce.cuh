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

template <int OP, typename T> __device__ long long kiln_block_arg_reduce(T v, long long i, unsigned long long* smem) {
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
        if (lane == 0) si[0] = i;
    }
    __syncthreads();
    return si[0] < 0 ? 0 : si[0];
}
