// CPU stand-in for the CUDA features used by attention.cu, for testing without a GPU.
//
// A launch runs the grid's blocks one after another; each block is NT std::threads that
// share the kernel's __shared__ arrays (static locals: one copy, used by one block at a
// time) and meet at __syncthreads() (a std::barrier).  A missing barrier in the kernel is
// a data race here too, and shows up as wrong results.
#pragma once
#define TPDE_CPU_SHIM 1

#include <math.h>
#include <pthread.h>
#include <stddef.h>

#define TPDE_DEVICE inline
#define TPDE_HUGE_F 3.402823466e38f
#define TPDE_HUGE_D 1.7976931348623157e308
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

struct tpde_dim3 {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local tpde_dim3 threadIdx, blockIdx, blockDim, gridDim;
inline pthread_barrier_t tpde_block_barrier;
#define __syncthreads() pthread_barrier_wait(&tpde_block_barrier)

inline float tpde_exp2(float x) { return exp2f(x); }
inline double tpde_exp2(double x) { return exp2(x); }
inline double tpde_log2(double x) { return log2(x); }
inline float tpde_rcp(float x) { return 1.0f / x; }
inline double tpde_rcp(double x) { return 1.0 / x; }
inline double tpde_neg_inf() { return -(double)INFINITY; }

// Run body() as the grid (gx, gy) of blocks of nt threads (one launch at a time).
template <class F>
struct tpde_launch_state {
  F* body;
  unsigned gx, gy, nt, t;
};

template <class F>
void* tpde_thread_main(void* p) {
  auto* st = static_cast<tpde_launch_state<F>*>(p);
  threadIdx = {st->t, 0, 0};
  blockDim = {st->nt, 1, 1};
  gridDim = {st->gx, st->gy, 1};
  for (unsigned by = 0; by < st->gy; ++by) {
    for (unsigned bx = 0; bx < st->gx; ++bx) {
      blockIdx = {bx, by, 0};
      (*st->body)();
      pthread_barrier_wait(&tpde_block_barrier);  // nobody enters the next block early
    }
  }
  return nullptr;
}

template <class F>
void tpde_cpu_launch(unsigned gx, unsigned gy, unsigned nt, F body) {
  pthread_barrier_init(&tpde_block_barrier, nullptr, nt);
  tpde_launch_state<F> st[1024];
  pthread_t th[1024];
  for (unsigned t = 0; t < nt; ++t) {
    st[t] = {&body, gx, gy, nt, t};
    pthread_create(&th[t], nullptr, &tpde_thread_main<F>, &st[t]);
  }
  for (unsigned t = 0; t < nt; ++t) pthread_join(th[t], nullptr);
  pthread_barrier_destroy(&tpde_block_barrier);
}

// Call kern with its arguments taken from params (as cuLaunchKernel's kernelParams: one
// pointer to each argument's value).
template <size_t... I> struct tpde_seq {};
template <size_t N, size_t... I> struct tpde_make_seq : tpde_make_seq<N - 1, N - 1, I...> {};
template <size_t... I> struct tpde_make_seq<0, I...> { using type = tpde_seq<I...>; };

template <class... A, size_t... I>
void tpde_cpu_call(void (*kern)(A...), void** params, tpde_seq<I...>) {
  kern(*static_cast<A*>(params[I])...);
}

template <class... A>
void tpde_cpu_run(void (*kern)(A...), void** params, unsigned gx, unsigned gy, unsigned nt) {
  tpde_cpu_launch(gx, gy, nt, [=] {
    tpde_cpu_call(kern, params, typename tpde_make_seq<sizeof...(A)>::type{});
  });
}
