// Fused streaming attention primitives of transformer-pde (see cupy_backend.py).
//
// One source, two compilers:
//  * NVRTC (through cupy.RawModule) for the GPU;
//  * g++ for the CPU, with cpu_shim.h defining TPDE_CPU_SHIM and mapping __global__,
//    __shared__, __syncthreads, threadIdx and blockIdx onto C++ threads and a barrier,
//    so that the test suite runs these very kernels on machines without a GPU.
// Nothing here may include a header: NVRTC compiles it without the C++ library.
//
// One kernel template, tpde_reduce<P, QPT, NT, TK>, streams the pairs (query i, key j)
// of every primitive; the accumulator policy P says what a visible pair adds and what a
// query writes at the end:
//   tpde_softmax_acc<T, R, C>         online log-sum-exp and softmax average (C = 0: lse only)
//   tpde_pointwise_acc<T, R, C, PHI>  sum_j w_j phi(q_i . k_j) v_j
//
// Layout: queries q (M, R), keys k (N, R), values v (N, C), all row-major, of type T
// (float or double); a per-key scalar s (N,) of type T (the softmax bias, or the pointwise
// weights); key ranges lo, hi (M,) int32 with 0 <= lo <= hi <= N: query i sees the keys
// lo[i] <= j < hi[i] (has_ranges == 0: every key).
//
// Grid: blockIdx.x runs over blocks of NT * QPT queries (thread t of block b owns the
// queries b * NT * QPT + u * NT + t, u < QPT), blockIdx.y over chunks of `chunk` keys
// (split over keys).  With gridDim.y == 1 the kernel writes the final results; with
// several chunks it writes per-chunk partial results in float64 (P::PART numbers per
// query) that the host code merges (cupy_backend.merge_softmax_partials /
// merge_pointwise_partials).
//
// A block visits the keys [min lo, max hi) of its queries within its chunk (the host
// sorts the queries by their ranges so that a block's ranges are alike); a key outside a
// query's own range is skipped for that query.  Keys are streamed in tiles of TK keys
// through shared memory; the tiles start at the chunk start plus a multiple of TK, so
// the arithmetic of a query (which keys share a tile) does not depend on the other
// queries of its block.  Scores are computed in base 2 with log2(e) folded into the
// queries (and the softmax bias), so each pair costs R FMAs.

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

// ------------------------------------------------------------------ softmax / lse
// Online log-sum-exp.  Per query: a running maximum m of the base-2 logits
// l = log2(e) (q.k + b) (`lowest` until a finite logit arrives), partial sums over the
// current tile in T (sp = sum 2^(l - m), ap = sum 2^(l - m) v) and totals over the
// previous tiles in double (st, at); a larger logit folds the partial sums into the
// totals and rescales them by 2^(m_old - l).  Then lse = ln2 (m + log2 st), out = at / st.
// Partials (PART = C + 2 numbers): (m, st, at[C]) in base-2 units.
template <typename T_, int R_, int C_>
struct tpde_softmax_acc {
  typedef T_ T;
  enum { R = R_, C = C_, CC = C_ > 0 ? C_ : 1, PART = C_ + 2 };
  T m, sp, ap[CC];
  double st, at[CC];

  // the key's scalar as the kernel keeps it, and the score a pair starts from
  static TPDE_DEVICE T key_scalar(const T* s, int j, int has) {
    return has ? s[j] * (T)TPDE_LOG2E : (T)0;
  }
  static TPDE_DEVICE T start(T sj) { return sj; }

  TPDE_DEVICE void init() {
    m = tpde_limits<T>::lowest();
    sp = (T)0;
    st = 0.0;
#pragma unroll
    for (int c = 0; c < CC; ++c) {
      ap[c] = (T)0;
      at[c] = 0.0;
    }
  }
  TPDE_DEVICE void add(T l, T, const T* vj) {
    if (l > m) {
      // new maximum: fold the tile's partial sums into the totals, rescale them
      const T f = tpde_exp2(m - l);
      st = (st + (double)sp) * (double)f;
      sp = (T)0;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        at[c] = (at[c] + (double)ap[c]) * (double)f;
        ap[c] = (T)0;
      }
      m = l;
    }
    const T p = tpde_exp2(l - m);                // NaN or +inf logits give NaN
    sp += p;
#pragma unroll
    for (int c = 0; c < C; ++c) ap[c] += p * vj[c];
  }
  TPDE_DEVICE void flush() {
    st += (double)sp;
    sp = (T)0;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      at[c] += (double)ap[c];
      ap[c] = (T)0;
    }
  }
  TPDE_DEVICE void finish(T* out, T* lse) const {
    // st == 0: no visible mass (an empty range, or every visible bias -inf); NaN: a NaN
    // or +inf logit (the reference answers lse = -inf and out = 0 in both cases)
    const bool ok = st > 0.0 && st <= TPDE_HUGE_D;
    const double inv = ok ? 1.0 / st : 0.0;
    *lse = ok ? (T)(((double)m + tpde_log2(st)) * TPDE_LN2) : (T)tpde_neg_inf();
#pragma unroll
    for (int c = 0; c < C; ++c) out[c] = ok ? (T)(at[c] * inv) : (T)0;
  }
  TPDE_DEVICE void partial(double* pr) const {
    pr[0] = (double)m;
    pr[1] = st;
#pragma unroll
    for (int c = 0; c < C; ++c) pr[2 + c] = at[c];
  }
};

// ------------------------------------------------------------------ pointwise
// out_i = sum_j w_j phi(q_i . k_j) v_j, PHI: 0 identity, 1 sigmoid, 2 relu.  The kernel
// hands over z2 = log2(e) q.k (identity and relu are positively homogeneous: their sums
// are multiplied by ln 2 at the end; sigmoid(z) = 1 / (1 + 2^-z2)).  Partial sums over a
// tile in T, totals in double; partials (PART = C numbers): the chunk's sums.
template <typename T_, int R_, int C_, int PHI>
struct tpde_pointwise_acc {
  typedef T_ T;
  enum { R = R_, C = C_, CC = C_, PART = C_ };
  T ap[C];
  double at[C];

  static TPDE_DEVICE T key_scalar(const T* s, int j, int) { return s[j]; }
  static TPDE_DEVICE T start(T) { return (T)0; }

  TPDE_DEVICE void init() {
#pragma unroll
    for (int c = 0; c < C; ++c) {
      ap[c] = (T)0;
      at[c] = 0.0;
    }
  }
  TPDE_DEVICE void add(T z, T wj, const T* vj) {
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
    for (int c = 0; c < C; ++c) ap[c] += f * vj[c];
  }
  TPDE_DEVICE void flush() {
#pragma unroll
    for (int c = 0; c < C; ++c) {
      at[c] += (double)ap[c];
      ap[c] = (T)0;
    }
  }
  TPDE_DEVICE void finish(T* out, T*) const {
    const double scale = PHI == 1 ? 1.0 : TPDE_LN2;
#pragma unroll
    for (int c = 0; c < C; ++c) out[c] = (T)(at[c] * scale);
  }
  TPDE_DEVICE void partial(double* pr) const {
    const double scale = PHI == 1 ? 1.0 : TPDE_LN2;
#pragma unroll
    for (int c = 0; c < C; ++c) pr[c] = at[c] * scale;
  }
};

// ------------------------------------------------------------------ the kernel
// The visible keys [a[t], b[t]) within the chunk [j_lo, j_hi) of the query u of this
// thread, t = u * NT + threadIdx.x (an empty range or no query: a = j_hi, b = j_lo; in
// shared memory, not registers: only tiles that some query sees in part read them), and
// the keys [first, last) the block visits, `first` moved down to the tile grid of the
// chunk.  Every thread of the block must call it (it contains a barrier).
template <int QPT, int NT, int TK>
TPDE_DEVICE void tpde_setup(const int* lo, const int* hi, int has_ranges, int M, int j_lo,
                            int j_hi, int* a, int* b, int* red, int& first, int& last) {
  const int tid = threadIdx.x;
  const int base = blockIdx.x * (NT * QPT);
  int s = j_hi, e = j_lo;
#pragma unroll
  for (int u = 0; u < QPT; ++u) {
    const int i = base + u * NT + tid;
    int x = j_hi, y = j_lo;                         // no query: nothing visible
    if (i < M) {
      x = has_ranges ? tpde_imax(lo[i], j_lo) : j_lo;
      y = has_ranges ? tpde_imin(hi[i], j_hi) : j_hi;
      if (x >= y) {
        x = j_hi;
        y = j_lo;
      }
    }
    a[u * NT + tid] = x;
    b[u * NT + tid] = y;
    s = tpde_imin(s, x);
    e = tpde_imax(e, y);
  }
  red[tid] = s;
  red[NT + tid] = e;
  __syncthreads();
  first = j_hi;
  last = j_lo;
  for (int t = 0; t < NT; ++t) {
    first = tpde_imin(first, red[t]);
    last = tpde_imax(last, red[NT + t]);
  }
  if (first < last) first = j_lo + (first - j_lo) / TK * TK;
}

// Cooperative load of keys [j0, j0 + nk) into shared memory (rows of `width` numbers).
template <typename T, int NT>
TPDE_DEVICE void tpde_load_rows(T* dst, const T* src, int j0, int nk, int width) {
  const long long off = (long long)j0 * width;
  const int n = nk * width;
  for (int e = threadIdx.x; e < n; e += NT) dst[e] = src[off + e];
}

// One pair: the score of the query qr with the key kj, handed to the accumulator.
template <class P>
TPDE_DEVICE void tpde_pair(P& acc, const typename P::T* qr, const typename P::T* kj,
                           typename P::T sj, const typename P::T* vj) {
  typename P::T l = P::start(sj);
#pragma unroll
  for (int r = 0; r < P::R; ++r) l += qr[r] * kj[r];
  acc.add(l, sj, vj);
}

// out (M, C) and lse (M,) of type T when gridDim.y == 1 (lse unused by pointwise
// policies); otherwise part (gridDim.y, M, P::PART) in float64.
template <class P, int QPT, int NT, int TK>
__global__ void
tpde_reduce(const typename P::T* __restrict__ q, const typename P::T* __restrict__ k,
            const typename P::T* __restrict__ v, const typename P::T* __restrict__ s,
            const int* __restrict__ lo, const int* __restrict__ hi, int M, int N, int chunk,
            int has_s, int has_ranges, typename P::T* __restrict__ out,
            typename P::T* __restrict__ lse, double* __restrict__ part) {
  typedef typename P::T T;
  enum { R = P::R, C = P::C, CC = P::CC };
  __shared__ T sk[TK * R];
  __shared__ T sv[TK * CC];
  __shared__ T ss[TK];
  __shared__ int a[NT * QPT], b[NT * QPT], red[2 * NT];

  const int tid = threadIdx.x;
  const int base = blockIdx.x * (NT * QPT);
  const int j_lo = blockIdx.y * chunk;
  const int j_hi = tpde_imin(N, j_lo + chunk);
  const T log2e = (T)TPDE_LOG2E;

  T qr[QPT][R];
  P acc[QPT];
  int first, last;
  tpde_setup<QPT, NT, TK>(lo, hi, has_ranges, M, j_lo, j_hi, a, b, red, first, last);
#pragma unroll
  for (int u = 0; u < QPT; ++u) {
    const int i = base + u * NT + tid;
#pragma unroll
    for (int r = 0; r < R; ++r) qr[u][r] = i < M ? q[(long long)i * R + r] * log2e : (T)0;
    acc[u].init();
  }

  for (int j0 = first; j0 < last; j0 += TK) {
    const int nk = tpde_imin(TK, last - j0);
    __syncthreads();                               // the previous tile is consumed
    tpde_load_rows<T, NT>(sk, k, j0, nk, R);
    if (C > 0) tpde_load_rows<T, NT>(sv, v, j0, nk, C);
    for (int e = tid; e < nk; e += NT) ss[e] = P::key_scalar(s, j0 + e, has_s);
    __syncthreads();

    bool full = nk == TK;                          // every key of the tile seen by all
#pragma unroll
    for (int u = 0; u < QPT; ++u) {
      const int t = u * NT + tid;
      full = full && a[t] <= j0 && b[t] >= j0 + TK;
    }
    // (the two loops below give the same sums; one query alone keeps fewer registers
    // with the range as the loop bounds)
    if (QPT == 1 && !full) {                       // one query: its own keys of the tile
      const int je = tpde_imin(b[tid] - j0, nk);
      for (int j = tpde_imax(a[tid] - j0, 0); j < je; ++j)
        tpde_pair(acc[0], qr[0], sk + j * R, ss[j], sv + j * CC);
    } else {
      const int jn = full ? TK : nk;               // a constant trip count when full
      for (int j = 0; j < jn; ++j) {
        T kj[R];
#pragma unroll
        for (int r = 0; r < R; ++r) kj[r] = sk[j * R + r];
#pragma unroll
        for (int u = 0; u < QPT; ++u) {
          const int t = u * NT + tid;
          if (full || (j0 + j >= a[t] && j0 + j < b[t]))
            tpde_pair(acc[u], qr[u], kj, ss[j], sv + j * CC);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < QPT; ++u) acc[u].flush();
  }

#pragma unroll
  for (int u = 0; u < QPT; ++u) {
    const int i = base + u * NT + tid;
    if (i >= M) continue;
    if (gridDim.y == 1) {
      acc[u].finish(out + (long long)i * C, lse + i);
    } else {
      acc[u].partial(part + ((long long)blockIdx.y * M + i) * P::PART);
    }
  }
}
