// gemm_on_this_thread on oneDNN's matmul primitive (Debian's libdnnl, 2.x
// API), or on the built-in blocked kernel when the plugin is built without
// oneDNN. See Note [GEMM runs on the caller's thread only] in gemm.h.
#include <plugin_kernels/gemm.h>

#include <npubridge/plugin_sdk.hpp>

#include <array>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#if defined(NPUB_KERNELS_HAVE_ONEDNN)
#include <dlfcn.h>

#include "onednn.h"
#endif

namespace plugin_kernels {

namespace {

// C = beta * C (beta == 0: zeros, whatever C held): the product with k == 0.
void scale_by_beta(const GemmArgs& g) {
  using namespace npub::sdk;
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t j = 0; j < g.n; ++j) {
      const int64_t at = i * g.ldc + j;
      if (g.type == GemmType::f32 || g.c_float32) {
        float* c = static_cast<float*>(g.c) + at;
        *c = g.beta == 0.0f ? 0.0f : g.beta * *c;
      } else {
        uint16_t* c = static_cast<uint16_t*>(g.c) + at;
        const bool bf = g.type == GemmType::bf16;
        const float v = g.beta == 0.0f ? 0.0f : g.beta * (bf ? bf16_to_float(*c) : half_to_float(*c));
        *c = bf ? float_to_bf16(v) : float_to_half(v);
      }
    }
}

// C's rows set to the bias row, then the product added (beta 1): the bias
// where the library primitive does not take it.
GemmArgs bias_into_c(const GemmArgs& g) {
  for (int64_t i = 0; i < g.m; ++i)
    std::memcpy(static_cast<float*>(g.c) + i * g.ldc, g.bias, static_cast<size_t>(g.n) * sizeof(float));
  GemmArgs rest = g;
  rest.bias = nullptr;
  rest.beta = 1.0f;
  return rest;
}

void check_bias(const GemmArgs& g) {
  if (g.bias != nullptr && (g.type != GemmType::f32 || g.alpha != 1.0f || g.beta != 0.0f))
    throw npub::sdk::Error(NPUB_ERR_INTERNAL,
                           "gemm_on_this_thread: a bias needs float32, alpha 1 and beta 0");
}

}  // namespace

#if defined(NPUB_KERNELS_HAVE_ONEDNN)

namespace {

dnnl::memory::data_type dnnl_type(GemmType t) {
  switch (t) {
    case GemmType::bf16:
      return dnnl::memory::data_type::bf16;
    case GemmType::f16:
      return dnnl::memory::data_type::f16;
    default:
      return dnnl::memory::data_type::f32;
  }
}

struct PrimitiveKey {
  GemmType type;
  bool trans_a, trans_b;
  int64_t m, n, k, lda, ldb, ldc;
  float alpha, beta;
  bool c_float32;
  bool bias = false;
  bool operator==(const PrimitiveKey& o) const {
    return type == o.type && trans_a == o.trans_a && trans_b == o.trans_b && c_float32 == o.c_float32 &&
           bias == o.bias && m == o.m && n == o.n && k == o.k && lda == o.lda && ldb == o.ldb &&
           ldc == o.ldc && std::memcmp(&alpha, &o.alpha, 4) == 0 && std::memcmp(&beta, &o.beta, 4) == 0;
  }
};

struct PrimitiveKeyHash {
  size_t operator()(const PrimitiveKey& key) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(static_cast<uint64_t>(key.type) | (uint64_t{key.trans_a} << 8) | (uint64_t{key.trans_b} << 9) |
        (uint64_t{key.c_float32} << 10) | (uint64_t{key.bias} << 11));
    for (int64_t v : {key.m, key.n, key.k, key.lda, key.ldb, key.ldc}) mix(static_cast<uint64_t>(v));
    uint32_t a, b;
    std::memcpy(&a, &key.alpha, 4);
    std::memcpy(&b, &key.beta, 4);
    mix((uint64_t{a} << 32) | b);
    return static_cast<size_t>(h);
  }
};

// A created primitive, shared by every thread that runs its key.
struct SharedMatmul {
  bool supported = false;  // false: oneDNN has no usable implementation
  dnnl::matmul::primitive_desc desc;
  dnnl::matmul primitive;
  size_t scratchpad_bytes = 0;
};

// A thread's handle on a SharedMatmul: the memory objects it runs on, their
// data handles set per call. Owned by one thread (ThreadState).
struct CachedMatmul {
  std::shared_ptr<const SharedMatmul> shared;
  dnnl::memory a, b, c, bias, scratchpad;
};

// Note [Two oneDNN copies in one process]
// PyTorch links its own oneDNN, and exports some of the template symbols
// Debian's libdnnl also exports (the call_once thunks of
// gemm_info_t<...>::jit_init). In a process that has libtorch_cpu in its
// global symbol scope (an executable linked against LibTorch, such as
// npub-conformance and npub_bench_cann) libdnnl's references bind to
// PyTorch's copies: its gemm:jit kernels are then never initialised (every
// call fails "unimplemented") and PyTorch's initialiser runs on libdnnl's
// closure. Python imports torch with local symbols, so it is not affected.
// Where the symbols are interposed, implementations built on gemm:jit are
// skipped (the brg kernels the AVX-512 paths use do not need it; float32
// falls back to the built-in kernel if nothing else is left).
bool gemm_jit_interposed() {
  static const bool interposed = [] {
    void* own_library = dlopen("libdnnl.so.2", RTLD_LAZY | RTLD_NOLOAD);
    if (own_library == nullptr) return false;
    bool found = false;
    for (const char* name : {"_ZZNSt9once_flag18_Prepare_executionC4IZSt9call_"
                             "onceIZN4dnnl4impl3cpu3x6411gemm_info_tIfffE8jit_initEvEUlvE_JEEvRS_"
                             "OT_DpOT0_EUlvE_EERSB_ENUlvE_4_FUNEv",
                             "_ZZNSt9once_flag18_Prepare_executionC4IZSt9call_"
                             "onceIZN4dnnl4impl3cpu3x6411gemm_info_tINS4_10bfloat16_tES8_fE8jit_"
                             "initEvEUlvE_JEEvRS_OT_DpOT0_EUlvE_EERSC_ENUlvE_4_FUNEv"}) {
      void* own = dlsym(own_library, name);
      void* bound = dlsym(RTLD_DEFAULT, name);  // the scope libdnnl's relocations search: global first
      if (own != nullptr && bound != nullptr && own != bound) found = true;
    }
    dlclose(own_library);
    return found;
  }();
  return interposed;
}

dnnl::memory::desc matrix_desc(GemmType type, int64_t rows, int64_t cols, int64_t ld, bool transposed) {
  const dnnl::memory::dims strides = transposed ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1};
  return dnnl::memory::desc({rows, cols}, dnnl_type(type), strides);
}

// Creates the matmul for `key` (throws dnnl::error when oneDNN has no
// implementation, e.g. f16 on a CPU without AVX512-FP16 or AMX).
dnnl::matmul::primitive_desc make_matmul_desc(const PrimitiveKey& key) {
  const auto a = matrix_desc(key.type, key.m, key.k, key.lda, key.trans_a);
  const auto b = matrix_desc(key.type, key.k, key.n, key.ldb, key.trans_b);
  const auto c = matrix_desc(key.c_float32 ? GemmType::f32 : key.type, key.m, key.n, key.ldc, false);
  dnnl::primitive_attr attr;
  // User scratchpad: an execution touches only the buffer passed to it (the
  // thread's own), nothing the library keeps per primitive.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (key.alpha != 1.0f) attr.set_output_scales(0, {key.alpha});
  if (key.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(key.beta);
    attr.set_post_ops(ops);
  }
  dnnl::matmul::primitive_desc pd(
      key.bias ? dnnl::matmul::desc(
                     a, b, dnnl::memory::desc({1, key.n}, dnnl::memory::data_type::f32, {key.n, 1}), c)
               : dnnl::matmul::desc(a, b, c),
      attr, cpu_engine());
  if (gemm_jit_interposed())
    while (std::string(pd.impl_info_str()).find("gemm") != std::string::npos)
      if (!pd.next_impl())
        throw dnnl::error(dnnl_unimplemented, "only gemm:jit implementations, which cannot run here");
  return pd;
}

// The plugin's matmul primitives by key; a shape oneDNN has no kernel for is
// held as unsupported.
using SharedPrimitives = SharedByKey<PrimitiveKey, SharedMatmul, PrimitiveKeyHash, 1024>;

SharedPrimitives& shared_primitives() {
  static SharedPrimitives cache;
  return cache;
}

std::shared_ptr<const SharedMatmul> create_matmul(const PrimitiveKey& key) {
  auto created = std::make_shared<SharedMatmul>();
  try {
    created->desc = make_matmul_desc(key);
    created->primitive = dnnl::matmul(created->desc);
    created->scratchpad_bytes = created->desc.scratchpad_desc().get_size();
    created->supported = true;
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented) throw;
  }
  return created;
}

// Per thread: a stream, the primitives this thread ran with their memory
// objects, and its scratchpad.
class ThreadState {
 public:
  ThreadState() : stream_(cpu_engine()) {}

  void run(const GemmArgs& g) {
    const PrimitiveKey key{g.type,
                           g.trans_a,
                           g.trans_b,
                           g.m,
                           g.n,
                           g.k,
                           g.lda,
                           g.ldb,
                           g.ldc,
                           g.alpha,
                           g.beta,
                           g.c_float32 && g.type != GemmType::f32,
                           g.bias != nullptr};
    CachedMatmul& mm = lookup(key);
    if (!mm.shared->supported && g.bias != nullptr) {  // the product without it, onto the bias rows
      run(bias_into_c(g));
      return;
    }
    if (!mm.shared->supported) {
      if (g.type != GemmType::f32)
        throw npub::sdk::Error(NPUB_ERR_INTERNAL, "oneDNN has no usable matmul for this half-type product");
      gemm_blocked<float>(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, static_cast<const float*>(g.a), g.lda,
                          static_cast<const float*>(g.b), g.ldb, g.beta, static_cast<float*>(g.c), g.ldc);
      return;
    }
    char* scratch = scratchpad(mm.shared->scratchpad_bytes);
    set_handle(mm.a, const_cast<void*>(g.a));
    set_handle(mm.b, const_cast<void*>(g.b));
    set_handle(mm.c, g.c);
    set_handle(mm.scratchpad, scratch);
    // The C entry point: the C++ one builds an unordered_map per call.
    dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, mm.a.get()},
                              {DNNL_ARG_WEIGHTS, mm.b.get()},
                              {DNNL_ARG_DST, mm.c.get()},
                              {DNNL_ARG_SCRATCHPAD, mm.scratchpad.get()},
                              {DNNL_ARG_BIAS, nullptr}};
    int nargs = 4;
    if (g.bias != nullptr) {
      set_handle(mm.bias, const_cast<float*>(g.bias));
      args[nargs++].memory = mm.bias.get();
    }
    dnnl::error::wrap_c_api(dnnl_primitive_execute(mm.shared->primitive.get(), stream_.get(), nargs, args),
                            "could not execute a matmul primitive");
  }

 private:
  // A kernel's shapes repeat (a model's layers); a bounded cache keeps a
  // long-lived thread that sees many shapes from growing without limit.
  static constexpr size_t kMaxPrimitives = 256;

  CachedMatmul& lookup(const PrimitiveKey& key) {
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    if (cache_.size() >= kMaxPrimitives) cache_.clear();
    CachedMatmul mm;
    mm.shared = shared_primitives().get(key, create_matmul);
    if (!mm.shared->supported) return cache_.emplace(key, std::move(mm)).first->second;
    const auto& pd = mm.shared->desc;
    mm.a = dnnl::memory(pd.src_desc(), cpu_engine(), DNNL_MEMORY_NONE);
    mm.b = dnnl::memory(pd.weights_desc(), cpu_engine(), DNNL_MEMORY_NONE);
    mm.c = dnnl::memory(pd.dst_desc(), cpu_engine(), DNNL_MEMORY_NONE);
    if (key.bias) mm.bias = dnnl::memory(pd.bias_desc(), cpu_engine(), DNNL_MEMORY_NONE);
    mm.scratchpad = dnnl::memory(pd.scratchpad_desc(), cpu_engine(), DNNL_MEMORY_NONE);
    return cache_.emplace(key, std::move(mm)).first->second;
  }

  char* scratchpad(size_t bytes) {
    if (bytes > scratchpad_bytes_) {
      constexpr size_t kAlign = 64;
      const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
      scratchpad_.reset(static_cast<char*>(std::aligned_alloc(kAlign, rounded)));
      if (!scratchpad_)
        throw npub::sdk::Error(NPUB_ERR_OUT_OF_MEMORY,
                               "GEMM scratchpad of " + std::to_string(rounded) + " bytes");
      scratchpad_bytes_ = rounded;
    }
    return scratchpad_.get();
  }

  static void set_handle(dnnl::memory& m, void* p) {
    dnnl::error::wrap_c_api(dnnl_memory_set_data_handle(m.get(), p), "could not set a memory handle");
  }

  struct FreeDeleter {
    void operator()(char* p) const { std::free(p); }
  };

  dnnl::stream stream_;
  std::unordered_map<PrimitiveKey, CachedMatmul, PrimitiveKeyHash> cache_;
  std::unique_ptr<char, FreeDeleter> scratchpad_;
  size_t scratchpad_bytes_ = 0;
};

struct Probe {
  bool supported = false;
  std::string implementation;
};

Probe probe(GemmType type) {
  OneOpenMPThread one_thread;
  try {
    const auto pd =
        make_matmul_desc(PrimitiveKey{type, false, false, 64, 64, 64, 64, 64, 64, 1.0f, 0.0f, false});
    if (type != GemmType::f32)  // and with a float32 C
      make_matmul_desc(PrimitiveKey{type, false, false, 64, 64, 64, 64, 64, 64, 1.0f, 0.0f, true});
    return Probe{true, std::string("oneDNN ") + pd.impl_info_str()};
  } catch (const dnnl::error&) {
    return Probe{false, "none"};
  }
}

// Note [The probe runs on a thread of its own]
// Creating a primitive descriptor leaves thread-local state in oneDNN and
// libgomp (the OpenMP setting) on the thread that does it. The probe runs
// at registration, on the host's loading thread, which is often the host's
// main thread and outlives the plugin; so it runs on a short thread of its
// own, whose thread-local state ends with it. (LeakSanitizer's tracer
// crashed at exit scanning that state on the main thread.) It is the one
// thread the plugin starts, and it does no kernel work (Note [GEMM runs on
// the caller's thread only] is about products).
const Probe& probed(GemmType type) {
  static const std::array<Probe, 3> probes = [] {
    std::array<Probe, 3> found;
    std::exception_ptr failed;
    std::thread([&found, &failed] {
      try {
        found = {probe(GemmType::f32), probe(GemmType::bf16), probe(GemmType::f16)};
      } catch (...) {
        failed = std::current_exception();
      }
    }).join();
    if (failed) std::rethrow_exception(failed);
    return found;
  }();
  return probes[type == GemmType::bf16 ? 1 : type == GemmType::f16 ? 2 : 0];
}

}  // namespace

void gemm_pin_libraries() { keep_compute_libraries_loaded(); }

void gemm_on_this_thread(const GemmArgs& g) {
  check_bias(g);
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {  // oneDNN takes no empty reduction
    if (g.bias != nullptr)
      bias_into_c(g);
    else
      scale_by_beta(g);
    return;
  }
  OneOpenMPThread one_thread;
  thread_local ThreadState state;
  try {
    state.run(g);
  } catch (const dnnl::error& e) {
    throw npub::sdk::Error(NPUB_ERR_INTERNAL, std::string("oneDNN matmul: ") + e.what());
  }
}

bool gemm_supports(GemmType type) { return probed(type).supported; }

const char* gemm_implementation(GemmType type) { return probed(type).implementation.c_str(); }

#else  // no oneDNN: the built-in kernel, float32 only

void gemm_pin_libraries() {}

void gemm_on_this_thread(const GemmArgs& args) {
  check_bias(args);
  if (args.m == 0 || args.n == 0) return;
  const GemmArgs g = args.bias != nullptr ? bias_into_c(args) : args;
  if (g.k == 0) {
    scale_by_beta(g);
    return;
  }
  if (g.type != GemmType::f32)
    throw npub::sdk::Error(NPUB_ERR_INTERNAL,
                           "gemm_on_this_thread: half types need oneDNN (gemm_supports() is false)");
  gemm_blocked<float>(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, static_cast<const float*>(g.a), g.lda,
                      static_cast<const float*>(g.b), g.ldb, g.beta, static_cast<float*>(g.c), g.ldc);
}

bool gemm_supports(GemmType type) { return type == GemmType::f32; }

const char* gemm_implementation(GemmType type) {
  return type == GemmType::f32 ? "built-in blocked kernel" : "none";
}

#endif

}  // namespace plugin_kernels
