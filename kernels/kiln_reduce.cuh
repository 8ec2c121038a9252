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
