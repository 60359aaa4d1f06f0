// plugin_kernels/conv.h on oneDNN's convolution primitives (Debian's
// libdnnl, 2.x API). See Note [Convolutions on oneDNN's convolution
// primitives] in conv.h. Without oneDNN every pass declines.
#include <plugin_kernels/conv.h>

#if defined(NPUB_KERNELS_HAVE_ONEDNN)
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "onednn.h"
#endif

namespace plugin_kernels {

#if defined(NPUB_KERNELS_HAVE_ONEDNN)

namespace {

using dnnl::memory;
using Tag = memory::format_tag;

enum class Pass : uint8_t { forward, forward_bias, backward_data, backward_weights };

// A primitive's key: the pass and the shape, with s.n the sub-batch.
struct Key {
  Pass pass;
  Conv2dShape s;
  bool operator==(const Key& o) const { return pass == o.pass && std::memcmp(&s, &o.s, sizeof s) == 0; }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull ^ static_cast<uint64_t>(k.pass);
    for (int64_t v : {k.s.n, k.s.c, k.s.h, k.s.w, k.s.oc, k.s.kh, k.s.kw, k.s.oh, k.s.ow, k.s.stride_h,
                      k.s.stride_w, k.s.pad_h, k.s.pad_w, k.s.dil_h, k.s.dil_w, k.s.groups})
      h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

// One pass's convolution for one sub-batch size, with the reorders of its
// operands between plain NCHW (OIHW weights) and the layouts it chose. A
// reorder is empty when the primitive takes the plain layout as it is.
struct SharedConv {
  bool supported = false;
  dnnl::primitive conv;
  memory::desc x, y, w;  // the primitive's layouts
  memory::desc x_plain, y_plain, w_plain;
  dnnl::primitive x_reorder, y_reorder, w_reorder;  // in the pass's direction
  // w_reorder cut into runs of whole output-channel blocks (Note [The
  // weights are reordered on every compute thread]); empty when it is not.
  struct Slice {
    dnnl::primitive reorder;
    memory::desc from, to;
  };
  std::vector<Slice> w_slices;
  size_t scratchpad_bytes = 0;
};

memory::desc plain_x(const Conv2dShape& s) {
  return memory::desc({s.n, s.c, s.h, s.w}, memory::data_type::f32, Tag::nchw);
}
memory::desc plain_y(const Conv2dShape& s) {
  return memory::desc({s.n, s.oc, s.oh, s.ow}, memory::data_type::f32, Tag::nchw);
}
memory::desc plain_w(const Conv2dShape& s) {
  if (s.groups == 1) return memory::desc({s.oc, s.c, s.kh, s.kw}, memory::data_type::f32, Tag::oihw);
  return memory::desc({s.groups, s.oc / s.groups, s.c / s.groups, s.kh, s.kw}, memory::data_type::f32,
                      Tag::goihw);
}
memory::desc any_like(const memory::desc& d) {
  return memory::desc(d.dims(), memory::data_type::f32, Tag::any);
}

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// Skips to the first implementation that is neither oneDNN's reference
// kernel nor its im2col + GEMM (false: there is none).
template <typename PrimitiveDesc>
bool skip_to_direct_kernel(PrimitiveDesc& pd) {
  for (;;) {
    const std::string impl = pd.impl_info_str();
    if (impl.rfind("ref", 0) != 0 && impl.find("gemm:") == std::string::npos) return true;
    if (!pd.next_impl()) return false;
  }
}

// The reorder from `from` to `to` (empty when they are one layout); adds
// its scratchpad to `bytes`.
dnnl::primitive make_reorder(const memory::desc& from, const memory::desc& to, size_t* bytes) {
  if (from == to) return {};
  dnnl::reorder::primitive_desc pd(cpu_engine(), from, cpu_engine(), to, user_scratchpad());
  *bytes = std::max(*bytes, pd.scratchpad_desc().get_size());
  return dnnl::reorder(pd);
}

// Note [The weights are reordered on every compute thread]
// The forward and backward-data passes read the weights in the blocked
// layout their primitive chose, and every sub-batch reads all of them, so
// the reorder from OIHW runs before the sub-batches. On one thread it was
// most of a small-image convolution with many channels: 0.3-0.4 ms of a
// 0.95 ms [16,256,2,2] x [256,256,3,3] forward, whose compute takes 0.4 ms
// (PyTorch's runs its reorder on its OpenMP threads). Cut along the output
// channels at block boundaries, the plain and the blocked weights are each
// a run of whole blocks per slice, and the slices' reorders (sub-memory
// descriptors of the same buffers) run on the compute threads side by
// side. Weights with padded blocks (an output-channel count that is no
// multiple of the block) or groups, or under kMinSlicedBytes, keep the one
// reorder.
constexpr size_t kMinSlicedBytes = 256 << 10;
constexpr int64_t kMaxSlices = 8;

void slice_weight_reorder(const Conv2dShape& s, SharedConv* out, size_t* bytes) {
  const dnnl_memory_desc_t& d = out->w.data;
  if (!out->w_reorder || s.groups != 1 || out->w.get_size() < kMinSlicedBytes ||
      d.format_kind != dnnl_blocked)
    return;
  for (int i = 0; i < d.ndims; ++i)
    if (d.padded_dims[i] != d.dims[i]) return;
  int64_t block = 1;
  for (int i = 0; i < d.format_desc.blocking.inner_nblks; ++i)
    if (d.format_desc.blocking.inner_idxs[i] == 0) block *= d.format_desc.blocking.inner_blks[i];
  const int64_t blocks = s.oc / block;
  if (s.oc % block != 0 || blocks < 2) return;
  const int64_t per = (blocks + kMaxSlices - 1) / kMaxSlices * block;
  for (int64_t o = 0; o < s.oc; o += per) {
    const memory::dims dims{std::min(per, s.oc - o), s.c, s.kh, s.kw}, offsets{o, 0, 0, 0};
    SharedConv::Slice slice{
        {}, out->w_plain.submemory_desc(dims, offsets), out->w.submemory_desc(dims, offsets)};
    slice.reorder = make_reorder(slice.from, slice.to, bytes);
    out->w_slices.push_back(std::move(slice));
  }
}

// Creates the primitives of `key` (throws dnnl::error when oneDNN takes
// no such convolution).
void create(const Key& key, SharedConv* out) {
  const Conv2dShape& s = key.s;
  out->x_plain = plain_x(s);
  out->y_plain = plain_y(s);
  out->w_plain = plain_w(s);
  const memory::desc x = any_like(out->x_plain), y = any_like(out->y_plain), w = any_like(out->w_plain);
  const memory::desc bias({s.oc}, memory::data_type::f32, Tag::x);
  const memory::dims strides{s.stride_h, s.stride_w}, dilates{s.dil_h - 1, s.dil_w - 1},
      pad{s.pad_h, s.pad_w};
  const auto algo = dnnl::algorithm::convolution_direct;
  const dnnl::primitive_attr attr = user_scratchpad();
  const bool with_bias = key.pass == Pass::forward_bias;
  const auto prop = key.pass == Pass::backward_data || key.pass == Pass::backward_weights
                        ? dnnl::prop_kind::forward_training
                        : dnnl::prop_kind::forward_inference;
  auto fwd_desc = with_bias
                      ? dnnl::convolution_forward::desc(prop, algo, x, w, bias, y, strides, dilates, pad, pad)
                      : dnnl::convolution_forward::desc(prop, algo, x, w, y, strides, dilates, pad, pad);
  dnnl::convolution_forward::primitive_desc fwd(fwd_desc, attr, cpu_engine());
  if (!skip_to_direct_kernel(fwd)) return;
  size_t bytes = 0;
  switch (key.pass) {
    case Pass::forward:
    case Pass::forward_bias:
      out->conv = dnnl::convolution_forward(fwd);
      out->x = fwd.src_desc();
      out->w = fwd.weights_desc();
      out->y = fwd.dst_desc();
      bytes = fwd.scratchpad_desc().get_size();
      out->x_reorder = make_reorder(out->x_plain, out->x, &bytes);
      out->w_reorder = make_reorder(out->w_plain, out->w, &bytes);
      out->y_reorder = make_reorder(out->y, out->y_plain, &bytes);
      slice_weight_reorder(s, out, &bytes);
      break;
    case Pass::backward_data: {
      dnnl::convolution_backward_data::primitive_desc pd(
          dnnl::convolution_backward_data::desc(algo, x, w, y, strides, dilates, pad, pad), attr,
          cpu_engine(), fwd);
      if (!skip_to_direct_kernel(pd)) return;
      out->conv = dnnl::convolution_backward_data(pd);
      out->x = pd.diff_src_desc();
      out->w = pd.weights_desc();
      out->y = pd.diff_dst_desc();
      bytes = pd.scratchpad_desc().get_size();
      out->y_reorder = make_reorder(out->y_plain, out->y, &bytes);
      out->w_reorder = make_reorder(out->w_plain, out->w, &bytes);
      out->x_reorder = make_reorder(out->x, out->x_plain, &bytes);
      slice_weight_reorder(s, out, &bytes);
      break;
    }
    case Pass::backward_weights: {
      dnnl::convolution_backward_weights::primitive_desc pd(
          dnnl::convolution_backward_weights::desc(algo, x, w, y, strides, dilates, pad, pad), attr,
          cpu_engine(), fwd);
      if (!skip_to_direct_kernel(pd)) return;
      out->conv = dnnl::convolution_backward_weights(pd);
      out->x = pd.src_desc();
      out->w = pd.diff_weights_desc();
      out->y = pd.diff_dst_desc();
      bytes = pd.scratchpad_desc().get_size();
      out->x_reorder = make_reorder(out->x_plain, out->x, &bytes);
      out->y_reorder = make_reorder(out->y_plain, out->y, &bytes);
      out->w_reorder = make_reorder(out->w, out->w_plain, &bytes);
      break;
    }
  }
  out->scratchpad_bytes = bytes;
  out->supported = true;
}

// The plugin's convolutions by key; a shape oneDNN declines is held as
// unsupported. Unlike the GEMM's there is no per-thread cache: a
// convolution runs for a millisecond, and the lock is taken once per call,
// on the calling thread.
using SharedConvs = SharedByKey<Key, SharedConv, KeyHash, 512>;

SharedConvs& shared_convs() {
  static SharedConvs cache;
  return cache;
}

std::shared_ptr<const SharedConv> create_conv(const Key& key) {
  auto created = std::make_shared<SharedConv>();
  try {
    create(key, created.get());
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented && e.status != dnnl_invalid_arguments) throw;
    created = std::make_shared<SharedConv>();  // unsupported
  }
  return created;
}

// A grow-only 64-byte-aligned buffer.
class Buffer {
 public:
  void* get(size_t bytes) {
    if (bytes > bytes_) {
      const size_t rounded = (bytes + 63) / 64 * 64;
      data_.reset(static_cast<char*>(std::aligned_alloc(64, rounded)));
      if (!data_)
        throw npub::sdk::Error(NPUB_ERR_OUT_OF_MEMORY,
                               "convolution buffer of " + std::to_string(rounded) + " bytes");
      bytes_ = rounded;
    }
    return data_.get();
  }

 private:
  struct FreeDeleter {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, FreeDeleter> data_;
  size_t bytes_ = 0;
};

// Per thread: a stream, a scratchpad, and the buffers its sub-batch's
// operands are reordered into.
struct ThreadState {
  dnnl::stream stream{cpu_engine()};
  Buffer scratchpad, x, y, w;
};

ThreadState& thread_state() {
  thread_local ThreadState state;
  return state;
}

using Args = std::unordered_map<int, memory>;

memory mem(const memory::desc& d, const void* p) { return memory(d, cpu_engine(), const_cast<void*>(p)); }

// Runs `p`, one of sc's primitives, on this thread's scratchpad.
void run(ThreadState& t, const SharedConv& sc, const dnnl::primitive& p, Args args) {
  if (sc.scratchpad_bytes > 0) {
    const memory::desc d({static_cast<int64_t>(sc.scratchpad_bytes)}, memory::data_type::u8, Tag::x);
    args.emplace(DNNL_ARG_SCRATCHPAD, mem(d, t.scratchpad.get(sc.scratchpad_bytes)));
  }
  p.execute(t.stream, args);
}

// Reorders `from` (in layout a) to `to` (layout b) on this thread.
void reorder(ThreadState& t, const SharedConv& sc, const dnnl::primitive& r, const memory::desc& a,
             const void* from, const memory::desc& b, void* to) {
  run(t, sc, r, {{DNNL_ARG_FROM, mem(a, from)}, {DNNL_ARG_TO, mem(b, to)}});
}

// `p` in the layout `to` through the reorder `r` (into `buffer`), or `p`
// itself when there is no reorder.
const void* reordered_in(ThreadState& t, const SharedConv& sc, const dnnl::primitive& r,
                         const memory::desc& from, const void* p, const memory::desc& to, Buffer& buffer) {
  if (!r) return p;
  void* b = buffer.get(to.get_size());
  reorder(t, sc, r, from, p, to, b);
  return b;
}

// The batch split into one sub-batch per compute thread: `count` of `per`
// images, the last one possibly fewer.
struct Split {
  int64_t per = 0, count = 0, last = 0;
};

Split split(const npub::sdk::Call& call, int64_t n) {
  const int64_t threads = std::min<int64_t>(n, std::max<int32_t>(1, call.num_threads()));
  Split sp;
  sp.per = (n + threads - 1) / threads;
  sp.count = (n + sp.per - 1) / sp.per;
  sp.last = n - (sp.count - 1) * sp.per;
  return sp;
}

// The primitives of both sub-batch sizes, or nulls when oneDNN declines.
struct Prims {
  std::shared_ptr<const SharedConv> per, last;
  const SharedConv& of(const Split& sp, int64_t chunk) const { return chunk == sp.count - 1 ? *last : *per; }
};

bool lookup(Pass pass, const Conv2dShape& s, const Split& sp, Prims* out) {
  if (s.n <= 0 || s.c <= 0 || s.h <= 0 || s.w <= 0 || s.oc <= 0 || s.kh <= 0 || s.kw <= 0 || s.oh <= 0 ||
      s.ow <= 0 || s.groups <= 0 || s.c % s.groups != 0 || s.oc % s.groups != 0)
    return false;
  Conv2dShape sub = s;
  sub.n = sp.per;
  out->per = shared_convs().get(Key{pass, sub}, create_conv);
  sub.n = sp.last;
  out->last = sp.last == sp.per ? out->per : shared_convs().get(Key{pass, sub}, create_conv);
  return out->per->supported && out->last->supported;
}

// The weights in the layouts of both primitives (the plain weights when a
// primitive takes them as they are), reordered on the compute threads into
// the call's scratch memory.
// Note [Reordered weights live in the call's scratch]
// The reordered copy was a buffer of its own per call: aligned_alloc of a
// ResNet's 2.4 MB [256, 256, 3, 3] went to mmap, fresh pages faulted in on
// every call, or not, as glibc's mmap threshold had moved in that process:
// the last stage's convs ran 2x slower in some processes than in others.
// The call's scratch comes from the device's caching allocator, its pages
// long mapped (huge pages where the kernel gives them).
struct Weights {
  const void* per = nullptr;
  const void* last = nullptr;
};

void prepare_weights(const npub::sdk::Call& call, const Prims& prims, const float* w, Weights* out) {
  auto one = [&](const SharedConv& sc) -> const void* {
    if (!sc.w_reorder) return w;
    void* b = call.scratch(sc.w.get_size());
    if (sc.w_slices.empty()) {
      reorder(thread_state(), sc, sc.w_reorder, sc.w_plain, w, sc.w, b);
      return b;
    }
    call.parallel_for(0, static_cast<int64_t>(sc.w_slices.size()), 1, [&](int64_t begin, int64_t end) {
      OneOpenMPThread one_thread;
      ThreadState& t = thread_state();
      for (int64_t i = begin; i < end; ++i) {
        const SharedConv::Slice& slice = sc.w_slices[static_cast<size_t>(i)];
        reorder(t, sc, slice.reorder, slice.from, w, slice.to, b);
      }
    });
    return b;
  };
  out->per = one(*prims.per);
  out->last = prims.last == prims.per         ? out->per
              : prims.last->w == prims.per->w ? out->per
                                              : one(*prims.last);
}

size_t x_image(const Conv2dShape& s) { return static_cast<size_t>(s.c * s.h * s.w); }
size_t y_image(const Conv2dShape& s) { return static_cast<size_t>(s.oc * s.oh * s.ow); }

template <typename F>
bool guarded(F&& f) {
  OneOpenMPThread one_thread;
  try {
    return f();
  } catch (const dnnl::error& e) {
    throw npub::sdk::Error(NPUB_ERR_INTERNAL, std::string("oneDNN convolution: ") + e.what());
  }
}

}  // namespace

bool conv2d_forward(const npub::sdk::Call& call, const Conv2dShape& s, const float* x, const float* w,
                    const float* bias, float* y) {
  return guarded([&] {
    const Split sp = split(call, s.n);
    Prims prims;
    if (!lookup(bias != nullptr ? Pass::forward_bias : Pass::forward, s, sp, &prims)) return false;
    Weights wts;
    prepare_weights(call, prims, w, &wts);
    call.parallel_for(0, sp.count, 1, [&](int64_t b, int64_t e) {
      OneOpenMPThread one_thread;
      ThreadState& t = thread_state();
      for (int64_t chunk = b; chunk < e; ++chunk) {
        const SharedConv& sc = prims.of(sp, chunk);
        const float* xc = x + static_cast<size_t>(chunk * sp.per) * x_image(s);
        float* yc = y + static_cast<size_t>(chunk * sp.per) * y_image(s);
        const void* xin = reordered_in(t, sc, sc.x_reorder, sc.x_plain, xc, sc.x, t.x);
        void* yout = sc.y_reorder ? t.y.get(sc.y.get_size()) : yc;
        Args args{{DNNL_ARG_SRC, mem(sc.x, xin)},
                  {DNNL_ARG_WEIGHTS, mem(sc.w, chunk == sp.count - 1 ? wts.last : wts.per)},
                  {DNNL_ARG_DST, mem(sc.y, yout)}};
        if (bias != nullptr)
          args.emplace(DNNL_ARG_BIAS, mem(memory::desc({s.oc}, memory::data_type::f32, Tag::x), bias));
        run(t, sc, sc.conv, std::move(args));
        if (sc.y_reorder) reorder(t, sc, sc.y_reorder, sc.y, yout, sc.y_plain, yc);
      }
    });
    return true;
  });
}

bool conv2d_backward_data(const npub::sdk::Call& call, const Conv2dShape& s, const float* dy, const float* w,
                          float* dx) {
  // The blocked kernels pad the channels of a group to 16: with fewer than
  // 8 they do more than twice the work (conv.h).
  if (s.groups > 0 && s.c / s.groups < 8) return false;
  return guarded([&] {
    const Split sp = split(call, s.n);
    Prims prims;
    if (!lookup(Pass::backward_data, s, sp, &prims)) return false;
    Weights wts;
    prepare_weights(call, prims, w, &wts);
    call.parallel_for(0, sp.count, 1, [&](int64_t b, int64_t e) {
      OneOpenMPThread one_thread;
      ThreadState& t = thread_state();
      for (int64_t chunk = b; chunk < e; ++chunk) {
        const SharedConv& sc = prims.of(sp, chunk);
        const float* dyc = dy + static_cast<size_t>(chunk * sp.per) * y_image(s);
        float* dxc = dx + static_cast<size_t>(chunk * sp.per) * x_image(s);
        const void* dyin = reordered_in(t, sc, sc.y_reorder, sc.y_plain, dyc, sc.y, t.y);
        void* dxout = sc.x_reorder ? t.x.get(sc.x.get_size()) : dxc;
        run(t, sc, sc.conv,
            {{DNNL_ARG_DIFF_DST, mem(sc.y, dyin)},
             {DNNL_ARG_WEIGHTS, mem(sc.w, chunk == sp.count - 1 ? wts.last : wts.per)},
             {DNNL_ARG_DIFF_SRC, mem(sc.x, dxout)}});
        if (sc.x_reorder) reorder(t, sc, sc.x_reorder, sc.x, dxout, sc.x_plain, dxc);
      }
    });
    return true;
  });
}

bool conv2d_backward_weights(const npub::sdk::Call& call, const Conv2dShape& s, const float* x,
                             const float* dy, float* dw) {
  return guarded([&] {
    const Split sp = split(call, s.n);
    Prims prims;
    if (!lookup(Pass::backward_weights, s, sp, &prims)) return false;
    const size_t numel = static_cast<size_t>(s.oc * (s.c / s.groups) * s.kh * s.kw);
    // One sub-batch writes dw; several write plain partials, summed below.
    std::vector<float> partials(sp.count > 1 ? numel * static_cast<size_t>(sp.count) : 0);
    call.parallel_for(0, sp.count, 1, [&](int64_t b, int64_t e) {
      OneOpenMPThread one_thread;
      ThreadState& t = thread_state();
      for (int64_t chunk = b; chunk < e; ++chunk) {
        const SharedConv& sc = prims.of(sp, chunk);
        const float* xc = x + static_cast<size_t>(chunk * sp.per) * x_image(s);
        const float* dyc = dy + static_cast<size_t>(chunk * sp.per) * y_image(s);
        float* target = sp.count > 1 ? partials.data() + numel * static_cast<size_t>(chunk) : dw;
        const void* xin = reordered_in(t, sc, sc.x_reorder, sc.x_plain, xc, sc.x, t.x);
        const void* dyin = reordered_in(t, sc, sc.y_reorder, sc.y_plain, dyc, sc.y, t.y);
        void* dwout = sc.w_reorder ? t.w.get(sc.w.get_size()) : target;
        run(t, sc, sc.conv,
            {{DNNL_ARG_SRC, mem(sc.x, xin)},
             {DNNL_ARG_DIFF_DST, mem(sc.y, dyin)},
             {DNNL_ARG_DIFF_WEIGHTS, mem(sc.w, dwout)}});
        if (sc.w_reorder) reorder(t, sc, sc.w_reorder, sc.w, dwout, sc.w_plain, target);
      }
    });
    if (sp.count > 1) {
      // In sub-batch order, whichever thread ran which.
      call.parallel_for(0, static_cast<int64_t>(numel), 1 << 12, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          float sum = partials[static_cast<size_t>(i)];
          for (int64_t c = 1; c < sp.count; ++c)
            sum += partials[numel * static_cast<size_t>(c) + static_cast<size_t>(i)];
          dw[i] = sum;
        }
      });
    }
    return true;
  });
}

#else  // no oneDNN: the caller's im2col path runs every convolution

bool conv2d_forward(const npub::sdk::Call&, const Conv2dShape&, const float*, const float*, const float*,
                    float*) {
  return false;
}
bool conv2d_backward_data(const npub::sdk::Call&, const Conv2dShape&, const float*, const float*, float*) {
  return false;
}
bool conv2d_backward_weights(const npub::sdk::Call&, const Conv2dShape&, const float*, const float*, float*) {
  return false;
}

#endif

}  // namespace plugin_kernels
