// rhymerl.workers.model._cached_attention: stores a ragged block of new tokens' keys and values in
// their slots' KV cache and computes their attention over it, for the torch engine on CPU in float32.
//
// Why native: verifying drafts appends W tokens per slot, and torch's attention then materialises
// scores [slots, heads, W, span] and walks them four times (mask, softmax, values), so a pass of
// 9 tokens per slot costs about twice a pass of one. Here each (slot, head) reads its keys and
// values once for all its W queries, scores stay in a cache-sized scratch buffer, and keys are
// stored transposed ([dim, positions]) so scores are computed 16 keys per vector instruction with
// no horizontal reductions. Each query sees exactly its own prefix (no mask tensor, no padding to
// the batch's longest slot).
//
// Grouped-query attention: a task is one (slot, key/value head), and the query heads of its group are
// scored together as extra query rows, so the group's keys and values are read once for all of them.
//
// Determinism: every query's arithmetic (sums in dimension order, then key order; a softmax over
// its own prefix) is the same whatever W is and whichever tile it shares loads with, so the kernel
// gives a token the same bits whether it is verified alone or among others. (The model sends
// one-token passes to torch's matmuls, so plain and speculative decoding still agree only to
// rounding, as before.)
#include <dlfcn.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace py = pybind11;

namespace {

constexpr int64_t kLanes = 16;
constexpr int64_t kTile = 4;  // queries that share one load of a key block or value row
typedef float v16 __attribute__((vector_size(64)));
typedef int32_t i16 __attribute__((vector_size(64)));

inline v16 load(const float* p) {
  v16 x;
  std::memcpy(&x, p, sizeof x);
  return x;
}
inline void store(float* p, v16 x) { std::memcpy(p, &x, sizeof x); }
inline v16 splat(float f) { return v16{} + f; }

// e^x lane-wise for x <= 0: Cephes expf (range reduction, degree-6 polynomial), branch-free; exactly 0
// below -87, where float underflows anyway.
inline v16 exp_nonpositive(v16 x) {
  const v16 lo = splat(-87.f);
  const v16 v = x < lo ? lo : x;
  const v16 k = (v * 1.44269504088896341f + 12582912.f) - 12582912.f;  // round to nearest
  v16 r = v - k * 0.693359375f;
  r = r + k * 2.12194440e-4f;
  v16 p = splat(1.9875691500E-4f);
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * r * r + r + 1.f;
  const i16 bits = (__builtin_convertvector(k, i16) + 127) << 23;
  v16 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x < lo ? v16{} : p * scale;
}

struct Args {
  const float* q;      // [cells, heads, dim], the block's real tokens, slot by slot
  const float* k_new;  // [cells, kv_heads, dim], their keys and values, stored into the cache first
  const float* v_new;
  float* keys;         // [slots, kv_heads, dim, max_len] (strides below; the last is 1)
  float* values;       // [slots, kv_heads, max_len, dim] (strides below; the last is 1)
  float* out;          // [cells, heads, dim]
  const int64_t* start;   // [slots] cached tokens before the block (position of its first token)
  const int64_t* counts;  // [slots] the block's tokens in each slot (0 for none)
  const int64_t* offsets; // [slots] index of each slot's first cell
  int64_t heads, kv_heads, dim;
  int64_t ks0, ks1, ks2, vs0, vs1, vs2;
  float scale;
};

struct Scratch {
  std::vector<float> scores, queries, acc, total;
};

// Scores of `T` queries (rows of Q, dim apart) against keys [j, j + 16), one vector per query.
template <int T>
inline void score_tile(const float* Q, const float* keys, int64_t ks2, int64_t dim, int64_t j, float* S,
                       int64_t npad) {
  v16 a[T] = {};
  for (int64_t d = 0; d < dim; ++d) {
    const v16 k = load(keys + d * ks2 + j);
    for (int t = 0; t < T; ++t) a[t] += Q[t * dim + d] * k;
  }
  for (int t = 0; t < T; ++t) store(S + t * npad + j, a[t]);
}

// acc[t, d0:d0+16] = sum_j e[t, j] * values[j, d0:d0+16] for `T` queries, keys in order.
template <int T>
inline void value_tile(const float* E, int64_t npad, const float* values, int64_t vs2, int64_t n, int64_t d0,
                       float* A, int64_t dim) {
  v16 a[T] = {};
  for (int64_t j = 0; j < n; ++j) {
    const v16 x = load(values + j * vs2 + d0);
    for (int t = 0; t < T; ++t) a[t] += E[t * npad + j] * x;
  }
  for (int t = 0; t < T; ++t) store(A + t * dim + d0, a[t]);
}

// x86-64: AVX-512, AVX2 and a portable build side by side, the loader picking one; elsewhere (arm64)
// the portable build alone, as target_clones names are per architecture.
#if defined(__x86_64__)
#define RHYMERL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define RHYMERL_CLONES
#endif

RHYMERL_CLONES
void attend_one(const Args& g, int64_t s, int64_t kv, Scratch& sc) {
  const int64_t tokens = g.counts[s];
  if (tokens == 0) return;
  const int64_t group = g.heads / g.kv_heads;  // query rows: token-major, the group's heads within a token
  const int64_t w_n = tokens * group;
  const int64_t D = g.dim, p0 = g.start[s], n = p0 + tokens;
  const int64_t npad = (n + kLanes - 1) / kLanes * kLanes;
  sc.scores.resize(w_n * npad);
  sc.queries.resize(w_n * D);
  sc.acc.resize(w_n * D);
  sc.total.resize(w_n);
  float* S = sc.scores.data();
  float* Q = sc.queries.data();
  float* A = sc.acc.data();
  const int64_t c0 = g.offsets[s];
  float* keys = g.keys + s * g.ks0 + kv * g.ks1;
  float* values = g.values + s * g.vs0 + kv * g.vs1;
  for (int64_t w = 0; w < tokens; ++w) {
    const int64_t cell = ((c0 + w) * g.kv_heads + kv) * D;
    for (int64_t d = 0; d < D; ++d) {
      keys[d * g.ks2 + p0 + w] = g.k_new[cell + d];
      values[(p0 + w) * g.vs2 + d] = g.v_new[cell + d];
    }
    for (int64_t r = 0; r < group; ++r) {
      const float* q = g.q + ((c0 + w) * g.heads + kv * group + r) * D;
      for (int64_t d = 0; d < D; ++d) Q[(w * group + r) * D + d] = q[d] * g.scale;
    }
  }

  for (int64_t j = 0; j < npad; j += kLanes) {
    int64_t w = 0;
    for (; w + kTile <= w_n; w += kTile) score_tile<kTile>(Q + w * D, keys, g.ks2, D, j, S + w * npad, npad);
    for (; w + 2 <= w_n; w += 2) score_tile<2>(Q + w * D, keys, g.ks2, D, j, S + w * npad, npad);
    for (; w < w_n; ++w) score_tile<1>(Q + w * D, keys, g.ks2, D, j, S + w * npad, npad);
  }

  for (int64_t w = 0; w < w_n; ++w) {
    float* row = S + w * npad;
    for (int64_t j = p0 + w / group + 1; j < npad; ++j) row[j] = -3.0e38f;  // beyond this query's own prefix
    v16 top = splat(-3.0e38f);
    for (int64_t j = 0; j < npad; j += kLanes) {
      const v16 x = load(row + j);
      top = x > top ? x : top;
    }
    float m = top[0];
    for (int i = 1; i < kLanes; ++i) m = std::max(m, top[i]);
    v16 sum{};
    for (int64_t j = 0; j < npad; j += kLanes) {
      const v16 e = exp_nonpositive(load(row + j) - m);
      store(row + j, e);
      sum += e;
    }
    float total = 0.f;
    for (int i = 0; i < kLanes; ++i) total += sum[i];
    sc.total[w] = total;
  }

  for (int64_t d0 = 0; d0 < D; d0 += kLanes) {
    int64_t w = 0;
    for (; w + kTile <= w_n; w += kTile) value_tile<kTile>(S + w * npad, npad, values, g.vs2, n, d0, A + w * D, D);
    for (; w + 2 <= w_n; w += 2) value_tile<2>(S + w * npad, npad, values, g.vs2, n, d0, A + w * D, D);
    for (; w < w_n; ++w) value_tile<1>(S + w * npad, npad, values, g.vs2, n, d0, A + w * D, D);
  }
  for (int64_t w = 0; w < w_n; ++w) {
    float* o = g.out + ((c0 + w / group) * g.heads + kv * group + w % group) * D;
    const float inv = 1.f / sc.total[w];
    for (int64_t d = 0; d < D; ++d) o[d] = A[w * D + d] * inv;
  }
}

// torch's own OpenMP runtime, found by `use_openmp`. Parallel regions go through it so the kernel
// runs on torch's worker threads: threads of our own would compete for the cores with OpenMP
// workers that spin for a while after every torch op (measured: a 0.5 ms linear layer followed
// by a 2.3 ms attention call took 6.1 ms with std::thread workers).
struct OpenMP {
  void (*parallel)(void (*)(void*), void*, unsigned, unsigned) = nullptr;  // GOMP_parallel (libgomp ABI)
  int (*thread_num)() = nullptr;
  int (*num_threads)() = nullptr;
};
OpenMP omp;

bool use_openmp(const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_LAZY | RTLD_NOLOAD);  // only a library already loaded
  if (handle == nullptr) return false;
  OpenMP found;
  found.parallel = reinterpret_cast<decltype(found.parallel)>(dlsym(handle, "GOMP_parallel"));
  found.thread_num = reinterpret_cast<decltype(found.thread_num)>(dlsym(handle, "omp_get_thread_num"));
  found.num_threads = reinterpret_cast<decltype(found.num_threads)>(dlsym(handle, "omp_get_num_threads"));
  if (found.parallel == nullptr || found.thread_num == nullptr || found.num_threads == nullptr) return false;
  omp = found;
  return true;
}

template <typename Run>
struct Region {
  const Run* run;
  int64_t tasks;
  static void body(void* self) {
    const auto* r = static_cast<const Region*>(self);
    const int64_t n = omp.num_threads(), i = omp.thread_num();
    const int64_t per = (r->tasks + n - 1) / n;
    (*r->run)(std::min(r->tasks, i * per), std::min(r->tasks, (i + 1) * per));
  }
};

// Below this many (query, key) pairs a second thread costs more to start than it saves.
constexpr int64_t kPairsPerThread = 1 << 15;

void attend(uintptr_t q, uintptr_t k_new, uintptr_t v_new, uintptr_t keys, uintptr_t values, uintptr_t out, uintptr_t start, uintptr_t counts,
            uintptr_t offsets, int64_t slots, int64_t heads, int64_t kv_heads, int64_t dim, int64_t max_len, int64_t ks0, int64_t ks1,
            int64_t ks2, int64_t vs0, int64_t vs1, int64_t vs2, float scale, int threads) {
  if (dim % kLanes != 0) throw std::invalid_argument("head_dim must be a multiple of 16");
  if (kv_heads <= 0 || heads % kv_heads != 0)
    throw std::invalid_argument("heads must be a multiple of kv_heads");
  Args g{reinterpret_cast<const float*>(q), reinterpret_cast<const float*>(k_new),
         reinterpret_cast<const float*>(v_new), reinterpret_cast<float*>(keys), reinterpret_cast<float*>(values),
         reinterpret_cast<float*>(out),
         reinterpret_cast<const int64_t*>(start), reinterpret_cast<const int64_t*>(counts),
         reinterpret_cast<const int64_t*>(offsets), heads, kv_heads, dim, ks0, ks1, ks2, vs0, vs1, vs2, scale};
  int64_t pairs = 0;
  for (int64_t s = 0; s < slots; ++s) {
    const int64_t end = g.start[s] + g.counts[s];
    if (g.start[s] < 0 || g.counts[s] < 0 || (g.counts[s] > 0 && (end + kLanes - 1) / kLanes * kLanes > max_len))
      throw std::out_of_range("slot " + std::to_string(s) + ": positions " + std::to_string(g.start[s]) + ".." +
                              std::to_string(end - 1) + " do not fit a cache of " + std::to_string(max_len) +
                              " positions");
    pairs += end * g.counts[s];
  }
  const int64_t tasks = slots * kv_heads;
  std::atomic<bool> failed{false};  // an exception must not leave a parallel region (std::terminate)
  auto run = [&g, &failed, kv_heads](int64_t lo, int64_t hi) {
    try {
      Scratch sc;
      for (int64_t t = lo; t < hi && !failed.load(std::memory_order_relaxed); ++t)
        attend_one(g, t / kv_heads, t % kv_heads, sc);
    } catch (...) {
      failed = true;
    }
  };
  const int64_t n_threads = std::clamp<int64_t>(std::min<int64_t>(threads, pairs * heads / kPairsPerThread), 1, tasks);
  if (n_threads <= 1) {
    run(0, tasks);
  } else if (omp.parallel != nullptr) {
    Region<decltype(run)> region{&run, tasks};
    omp.parallel(&Region<decltype(run)>::body, &region, static_cast<unsigned>(n_threads), 0);
  } else {
    std::vector<std::thread> pool;
    const int64_t per = (tasks + n_threads - 1) / n_threads;
    for (int64_t i = 1; i < n_threads; ++i)
      pool.emplace_back(run, std::min(tasks, i * per), std::min(tasks, (i + 1) * per));
    run(0, std::min(tasks, per));
    for (auto& t : pool) t.join();
  }
  if (failed) throw std::runtime_error("cached attention: out of memory for scratch buffers");
}

}  // namespace

PYBIND11_MODULE(_cached_attention, m) {
  m.doc() = "Fused cached attention for ragged blocks of new tokens (CPU, float32).";
  m.def("attend", &attend, py::call_guard<py::gil_scoped_release>(), py::arg("q"), py::arg("k_new"), py::arg("v_new"), py::arg("keys"),
        py::arg("values"), py::arg("out"), py::arg("start"), py::arg("counts"), py::arg("offsets"),
        py::arg("slots"), py::arg("heads"), py::arg("kv_heads"), py::arg("dim"), py::arg("max_len"), py::arg("ks0"), py::arg("ks1"),
        py::arg("ks2"), py::arg("vs0"), py::arg("vs1"), py::arg("vs2"), py::arg("scale"), py::arg("threads"),
        "Raw float32 / int64 buffers (addresses); the typed wrapper is rhymerl.workers.model.cached_attention.");
  m.def("use_openmp", &use_openmp, py::arg("library"),
        "Run parallel regions on the already loaded OpenMP runtime at this path; False if unusable.");
}
