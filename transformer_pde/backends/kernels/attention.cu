// Fused streaming attention primitives of transformer-pde (see cupy_backend.py).
//
// One source, two compilers:
//  * NVRTC (through cupy.RawModule) for the GPU;
//  * g++ for the CPU, with cpu_shim.h defining TPDE_CPU_SHIM and mapping __global__,
//    __shared__, __syncthreads, threadIdx and blockIdx onto C++ threads and a barrier,
//    so that the test suite runs these very kernels on machines without a GPU.
// Nothing here may include a header: NVRTC compiles it without the C++ library.
//
// Layout: queries q (M, R), keys k (N, R), values v (N, C), all row-major, of type T
// (float or double); bias (N,) and pointwise weights w (N,) of type T; limits (M,) int32
// already clipped to [0, N] (keys sorted by position: query i sees keys j < limits[i]).
//
// Grid: blockIdx.x runs over blocks of NT * QPT queries (thread t of block b owns the
// queries b * NT * QPT + u * NT + t, u < QPT), blockIdx.y over chunks of `chunk` keys
// (split over keys).  With gridDim.y == 1 the kernels write the final out / lse; with
// several chunks they write per-chunk partial results in float64 that the host code
// merges (cupy_backend.merge_softmax_partials / merge_pointwise_partials).
//
// Keys are streamed in tiles of TK keys through shared memory.  Logits are computed in
// base 2 with log2(e) folded into the queries and the bias, so each pair costs R FMAs
// and one exp2.  Per query the softmax kernel keeps a running maximum m (online
// log-sum-exp, rescaling when a larger logit arrives), partial sums over the tile in T
// and totals in double, to which the partial sums are added at the end of every tile.

#ifndef TPDE_CPU_SHIM
#define TPDE_DEVICE __device__ __forceinline__
#define TPDE_HUGE_F 3.402823466e38f
#define TPDE_HUGE_D 1.7976931348623157e308

TPDE_DEVICE float tpde_exp2(float x) {
  // MUFU ex2: relative error < 2^-22, flushes subnormal results to zero, exp2(-inf) = 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
TPDE_DEVICE double tpde_exp2(double x) { return exp2(x); }
TPDE_DEVICE double tpde_log2(double x) { return log2(x); }
TPDE_DEVICE float tpde_rcp(float x) { return __frcp_rn(x); }
TPDE_DEVICE double tpde_rcp(double x) { return 1.0 / x; }
TPDE_DEVICE double tpde_neg_inf() { return __longlong_as_double(0xfff0000000000000ULL); }
#endif

#define TPDE_LOG2E 1.4426950408889634
#define TPDE_LN2 0.6931471805599453

template <typename T> struct tpde_limits;
template <> struct tpde_limits<float> {
  static TPDE_DEVICE float lowest() { return -TPDE_HUGE_F; }
};
template <> struct tpde_limits<double> {
  static TPDE_DEVICE double lowest() { return -TPDE_HUGE_D; }
};

TPDE_DEVICE int tpde_imin(int a, int b) { return a < b ? a : b; }
TPDE_DEVICE int tpde_imax(int a, int b) { return a > b ? a : b; }

// Query range of this thread and the block's furthest visible key.  Every thread of the
// block must call it (it contains a barrier).
template <int QPT, int NT>
TPDE_DEVICE int tpde_setup(const int* limits, int has_limits, int M, int j_lo, int j_hi,
                           int* lim, int* red) {
  const int tid = threadIdx.x;
  const int base = blockIdx.x * (NT * QPT);
  int hi = j_lo;
#pragma unroll
  for (int u = 0; u < QPT; ++u) {
    const int i = base + u * NT + tid;
    int l = j_lo;                                   // no query: nothing visible
    if (i < M) l = has_limits ? tpde_imin(limits[i], j_hi) : j_hi;
    lim[u] = l;
    hi = tpde_imax(hi, l);
  }
  red[tid] = hi;
  __syncthreads();
  int most = j_lo;
  for (int t = 0; t < NT; ++t) most = tpde_imax(most, red[t]);
  return most;
}

// Cooperative load of keys [j0, j0 + nk) into shared memory (rows of `width` numbers),
// multiplied by `scale`.
template <typename T, int TK, int NT>
TPDE_DEVICE void tpde_load_rows(T* dst, const T* src, int j0, int nk, int width, T scale) {
  const long long off = (long long)j0 * width;
  const int n = nk * width;
  for (int e = threadIdx.x; e < n; e += NT) dst[e] = src[off + e] * scale;
}

// ------------------------------------------------------------------ softmax / lse
// C == 0: log-sum-exp only (v unused).  out (M, C), lse (M,) of type T when gridDim.y
// == 1; otherwise part (gridDim.y, M, C + 2) in float64: (m, s, acc[C]) with
// lse = ln2 * (m + log2 s), out = acc / s, m in base-2 units.
template <typename T, int R, int C, int QPT, int NT, int TK>
__global__ void
tpde_softmax(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
             const T* __restrict__ bias, const int* __restrict__ limits, int M, int N,
             int chunk, int has_bias, int has_limits, T* __restrict__ out,
             T* __restrict__ lse, double* __restrict__ part) {
  constexpr int CC = C > 0 ? C : 1;
  __shared__ T sk[TK * R];
  __shared__ T sv[TK * CC];
  __shared__ T sb[TK];
  __shared__ int red[NT];

  const int tid = threadIdx.x;
  const int base = blockIdx.x * (NT * QPT);
  const int j_lo = blockIdx.y * chunk;
  const int j_hi = tpde_imin(N, j_lo + chunk);
  const T lowest = tpde_limits<T>::lowest();
  const T log2e = (T)TPDE_LOG2E;

  int lim[QPT];
  T qr[QPT][R];
  T m[QPT];          // running maximum (base 2); `lowest` until a finite logit arrives
  T sp[QPT];         // partial sum over the current tile, relative to m
  T ap[QPT][CC];
  double st[QPT];    // totals over the previous tiles, relative to m
  double at[QPT][CC];

  const int most = tpde_setup<QPT, NT>(limits, has_limits, M, j_lo, j_hi, lim, red);
#pragma unroll
  for (int u = 0; u < QPT; ++u) {
    const int i = base + u * NT + tid;
#pragma unroll
    for (int a = 0; a < R; ++a) qr[u][a] = i < M ? q[(long long)i * R + a] * log2e : (T)0;
    m[u] = lowest;
    sp[u] = (T)0;
    st[u] = 0.0;
#pragma unroll
    for (int c = 0; c < CC; ++c) {
      ap[u][c] = (T)0;
      at[u][c] = 0.0;
    }
  }

  for (int j0 = j_lo; j0 < most; j0 += TK) {
    const int nk = tpde_imin(TK, most - j0);
    __syncthreads();                               // the previous tile is consumed
    tpde_load_rows<T, TK, NT>(sk, k, j0, nk, R, (T)1);
    if (C > 0) tpde_load_rows<T, TK, NT>(sv, v, j0, nk, C, (T)1);
    for (int e = tid; e < nk; e += NT) sb[e] = has_bias ? bias[j0 + e] * log2e : (T)0;
    __syncthreads();

    bool full = nk == TK;
#pragma unroll
    for (int u = 0; u < QPT; ++u) full = full && lim[u] >= j0 + TK;
    const int jn = full ? TK : nk;
    for (int j = 0; j < jn; ++j) {
      T kj[R];
#pragma unroll
      for (int a = 0; a < R; ++a) kj[a] = sk[j * R + a];
      const T bj = sb[j];
#pragma unroll
      for (int u = 0; u < QPT; ++u) {
        if (!full && j0 + j >= lim[u]) continue;   // key not visible to this query
        T l = bj;
#pragma unroll
        for (int a = 0; a < R; ++a) l += qr[u][a] * kj[a];
        if (l > m[u]) {
          // new maximum: fold the tile's partial sums into the totals, rescale them
          const T f = tpde_exp2(m[u] - l);
          st[u] = (st[u] + (double)sp[u]) * (double)f;
          sp[u] = (T)0;
#pragma unroll
          for (int c = 0; c < C; ++c) {
            at[u][c] = (at[u][c] + (double)ap[u][c]) * (double)f;
            ap[u][c] = (T)0;
          }
          m[u] = l;
        }
        const T p = tpde_exp2(l - m[u]);            // NaN or +inf logits give NaN
        sp[u] += p;
#pragma unroll
        for (int c = 0; c < C; ++c) ap[u][c] += p * sv[j * CC + c];
      }
    }
#pragma unroll
    for (int u = 0; u < QPT; ++u) {
      st[u] += (double)sp[u];
      sp[u] = (T)0;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        at[u][c] += (double)ap[u][c];
        ap[u][c] = (T)0;
      }
    }
  }

#pragma unroll
  for (int u = 0; u < QPT; ++u) {
    const int i = base + u * NT + tid;
    if (i >= M) continue;
    if (gridDim.y == 1) {
      // st == 0: no visible mass; NaN: a NaN or +inf logit (the reference answers
      // lse = -inf and out = 0 in both cases)
      const bool ok = st[u] > 0.0 && st[u] <= TPDE_HUGE_D;
      const double inv = ok ? 1.0 / st[u] : 0.0;
      lse[i] = ok ? (T)(((double)m[u] + tpde_log2(st[u])) * TPDE_LN2) : (T)tpde_neg_inf();
#pragma unroll
      for (int c = 0; c < C; ++c) out[(long long)i * C + c] = ok ? (T)(at[u][c] * inv) : (T)0;
    } else {
      double* pr = part + ((long long)blockIdx.y * M + i) * (C + 2);
      pr[0] = (double)m[u];
      pr[1] = st[u];
#pragma unroll
      for (int c = 0; c < C; ++c) pr[2 + c] = at[u][c];
    }
  }
}

// ------------------------------------------------------------------ pointwise
// out_i = sum_{j < limits[i]} w_j phi(q_i . k_j) v_j, PHI: 0 identity, 1 sigmoid, 2 relu.
// The kernel works with z2 = log2(e) q.k (identity and relu are positively homogeneous:
// their sums are multiplied by ln 2 at the end; sigmoid(z) = 1 / (1 + 2^-z2)).
// gridDim.y == 1: out (M, C) of type T; otherwise part (gridDim.y, M, C) in float64.
template <typename T, int R, int C, int PHI, int QPT, int NT, int TK>
__global__ void
tpde_pointwise(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
               const T* __restrict__ w, const int* __restrict__ limits, int M, int N,
               int chunk, int has_limits, T* __restrict__ out, double* __restrict__ part) {
  __shared__ T sk[TK * R];
  __shared__ T sv[TK * C];
  __shared__ T sw[TK];
  __shared__ int red[NT];

  const int tid = threadIdx.x;
  const int base = blockIdx.x * (NT * QPT);
  const int j_lo = blockIdx.y * chunk;
  const int j_hi = tpde_imin(N, j_lo + chunk);
  const T log2e = (T)TPDE_LOG2E;

  int lim[QPT];
  T qr[QPT][R];
  T ap[QPT][C];
  double at[QPT][C];

  const int most = tpde_setup<QPT, NT>(limits, has_limits, M, j_lo, j_hi, lim, red);
#pragma unroll
  for (int u = 0; u < QPT; ++u) {
    const int i = base + u * NT + tid;
#pragma unroll
    for (int a = 0; a < R; ++a) qr[u][a] = i < M ? q[(long long)i * R + a] * log2e : (T)0;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      ap[u][c] = (T)0;
      at[u][c] = 0.0;
    }
  }

  for (int j0 = j_lo; j0 < most; j0 += TK) {
    const int nk = tpde_imin(TK, most - j0);
    __syncthreads();
    tpde_load_rows<T, TK, NT>(sk, k, j0, nk, R, (T)1);
    tpde_load_rows<T, TK, NT>(sv, v, j0, nk, C, (T)1);
    for (int e = tid; e < nk; e += NT) sw[e] = w[j0 + e];
    __syncthreads();

    bool full = nk == TK;
#pragma unroll
    for (int u = 0; u < QPT; ++u) full = full && lim[u] >= j0 + TK;
    const int jn = full ? TK : nk;
    for (int j = 0; j < jn; ++j) {
      T kj[R];
#pragma unroll
      for (int a = 0; a < R; ++a) kj[a] = sk[j * R + a];
      const T wj = sw[j];
#pragma unroll
      for (int u = 0; u < QPT; ++u) {
        if (!full && j0 + j >= lim[u]) continue;
        T z = (T)0;
#pragma unroll
        for (int a = 0; a < R; ++a) z += qr[u][a] * kj[a];
        T f;
        if (PHI == 1) {
          const T e = tpde_exp2(z >= (T)0 ? -z : z);
          f = (z >= (T)0 ? (T)1 : e) * tpde_rcp((T)1 + e);
        } else if (PHI == 2) {
          f = z > (T)0 ? z : (T)0;
        } else {
          f = z;
        }
        f *= wj;
#pragma unroll
        for (int c = 0; c < C; ++c) ap[u][c] += f * sv[j * C + c];
      }
    }
#pragma unroll
    for (int u = 0; u < QPT; ++u) {
#pragma unroll
      for (int c = 0; c < C; ++c) {
        at[u][c] += (double)ap[u][c];
        ap[u][c] = (T)0;
      }
    }
  }

  const double scale = PHI == 1 ? 1.0 : TPDE_LN2;
#pragma unroll
  for (int u = 0; u < QPT; ++u) {
    const int i = base + u * NT + tid;
    if (i >= M) continue;
    if (gridDim.y == 1) {
#pragma unroll
      for (int c = 0; c < C; ++c) out[(long long)i * C + c] = (T)(at[u][c] * scale);
    } else {
      double* pr = part + ((long long)blockIdx.y * M + i) * C;
#pragma unroll
      for (int c = 0; c < C; ++c) pr[c] = at[u][c] * scale;
    }
  }
}
