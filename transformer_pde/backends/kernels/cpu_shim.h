// CPU stand-in for the CUDA features used by attention.cu, for testing without a GPU.
//
// A launch runs the grid's blocks one after another; each block is NT std::threads that
// share the kernel's __shared__ arrays (static locals: one copy, used by one block at a
// time) and meet at __syncthreads() (a std::barrier).  A missing barrier in the kernel is
// a data race here too, and shows up as wrong results.
#pragma once
#define TPDE_CPU_SHIM 1

#include <barrier>
#include <cmath>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

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
inline std::barrier<>* tpde_block_barrier = nullptr;
#define __syncthreads() tpde_block_barrier->arrive_and_wait()

inline float tpde_exp2(float x) { return std::exp2(x); }
inline double tpde_exp2(double x) { return std::exp2(x); }
inline double tpde_log2(double x) { return std::log2(x); }
inline float tpde_rcp(float x) { return 1.0f / x; }
inline double tpde_rcp(double x) { return 1.0 / x; }
inline double tpde_neg_inf() { return -std::numeric_limits<double>::infinity(); }

// Run body() as the grid (gx, gy) of blocks of nt threads.
template <class F>
void tpde_cpu_launch(unsigned gx, unsigned gy, unsigned nt, F&& body) {
  std::barrier<> bar(nt);
  tpde_block_barrier = &bar;
  std::vector<std::thread> threads;
  threads.reserve(nt);
  for (unsigned t = 0; t < nt; ++t) {
    threads.emplace_back([&, t] {
      threadIdx = {t, 0, 0};
      blockDim = {nt, 1, 1};
      gridDim = {gx, gy, 1};
      for (unsigned by = 0; by < gy; ++by) {
        for (unsigned bx = 0; bx < gx; ++bx) {
          blockIdx = {bx, by, 0};
          body();
          bar.arrive_and_wait();   // no thread enters the next block's shared memory early
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  tpde_block_barrier = nullptr;
}

// Call kern with its arguments taken from params (as cuLaunchKernel's kernelParams: one
// pointer to each argument's value).
template <class... A, std::size_t... I>
void tpde_cpu_call(void (*kern)(A...), void** params, std::index_sequence<I...>) {
  kern(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(params[I])...);
}

template <class... A>
void tpde_cpu_run(void (*kern)(A...), void** params, unsigned gx, unsigned gy, unsigned nt) {
  tpde_cpu_launch(gx, gy, nt, [&] { tpde_cpu_call(kern, params, std::index_sequence_for<A...>{}); });
}
