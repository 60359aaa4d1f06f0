// vllm_like: the paged KV cache's writes and block moves, as vLLM's
// csrc/cache_kernels.cu defines them: reshape_and_cache (the legacy layout
// paged_attention reads), reshape_and_cache_flash, copy_blocks (copy-on-write
// of shared blocks, every layer) and swap_blocks (one cache's blocks to
// another's). Every index is checked before anything is written, so a bad
// call leaves the caches as they were.
#include "kv_cache_layout.h"
#include "ops.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace vllm_like {

namespace {

using npub::sdk::Call;
using npub::sdk::TensorRef;

const std::initializer_list<DLDataType> kCacheDtypes = {npub::sdk::kFloat32, npub::sdk::kFloat16,
                                                        npub::sdk::kBFloat16};

// Argument positions of reshape_and_cache and reshape_and_cache_flash.
enum ReshapeArg : int32_t {
  kKey,
  kValue,
  kKeyCache,
  kValueCache,
  kSlotMapping,
  kKvCacheDtype,
  kKScale,
  kVScale
};

struct ReshapeProblem {
  KvCacheLayout cache;
  int64_t num_tokens = 0;  // slot_mapping's length: key may have more rows (padding), as in vLLM
};

ReshapeProblem check_reshape(const Call& call, bool flash) {
  const TensorRef key = call.tensor(kKey), value = call.tensor(kValue), slots = call.tensor(kSlotMapping);
  ReshapeProblem p;
  p.cache = flash ? check_flash_caches(call, kKeyCache, kValueCache, key.dtype())
                  : check_legacy_caches(call, kKeyCache, kValueCache, key.dtype());
  check_kv_cache_dtype(call, kKvCacheDtype, kKScale, kVScale);
  expect_dim(call, key, "key", 3);
  if (key.size(1) != p.cache.num_kv_heads || key.size(2) != p.cache.head_size)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "key: expected [num_tokens, num_kv_heads, head_size] = [*, " +
                                             std::to_string(p.cache.num_kv_heads) + ", " +
                                             std::to_string(p.cache.head_size) +
                                             "] (from key_cache) but found " + Call::shape_str(key.sizes()));
  expect_shape(call, value, "value (key's shape)", key.sizes());
  expect_dtype(call, value, "value", key.dtype());
  expect_dtype(call, slots, "slot_mapping", npub::sdk::kInt64);
  expect_dim(call, slots, "slot_mapping", 1);
  p.num_tokens = slots.size(0);
  if (p.num_tokens > key.size(0))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "slot_mapping: expected at most num_tokens = " + std::to_string(key.size(0)) +
                  " slots (key's rows) but found " + std::to_string(p.num_tokens));
  return p;
}

void check_slots(const Call& call, const int64_t* slots, const ReshapeProblem& p) {
  for (int64_t t = 0; t < p.num_tokens; ++t)
    if (slots[t] >= p.cache.slots())
      call.fail(NPUB_ERR_INDEX, "slot_mapping[" + std::to_string(t) + "]: slot " + std::to_string(slots[t]) +
                                    " is out of range for " + std::to_string(p.cache.num_blocks) +
                                    " blocks of " + std::to_string(p.cache.block_size) +
                                    " slots (expected a slot < " + std::to_string(p.cache.slots()) +
                                    ", or a negative one to skip the token)");
}

// Copies the tokens' keys and values into their slots of the flash layout,
// every tensor read and written through its strides: vLLM's key and value
// are views of the fused qkv projection, and its caches views of one
// [num_blocks, num_kv_heads, block_size, 2 * head_size] tensor per layer
// (npubridge.vllm's attention backend: key and value interleaved per
// token). Bit copies, one loop per element size; a head's row is one
// memcpy where head_size is the innermost, unit-stride dim of both sides.
template <typename Bits>
void reshape_into_flash(const Call& call, const ReshapeProblem& p) {
  const TensorRef key = call.tensor(kKey), value = call.tensor(kValue);
  const TensorRef kct = call.tensor(kKeyCache), vct = call.tensor(kValueCache);
  const TensorRef slot_t = call.tensor(kSlotMapping);
  const int64_t* slots = slot_t.data<int64_t>();
  std::vector<int64_t> packed;  // a strided slot_mapping, read once into order
  if (p.num_tokens > 1 && slot_t.stride(0) != 1) {
    packed.resize(static_cast<size_t>(p.num_tokens));
    for (int64_t t = 0; t < p.num_tokens; ++t) packed[static_cast<size_t>(t)] = slots[t * slot_t.stride(0)];
    slots = packed.data();
  }
  check_slots(call, slots, p);
  const int64_t H = p.cache.num_kv_heads, D = p.cache.head_size, B = p.cache.block_size;
  struct Side {
    const Bits* src;
    int64_t ss[3];
    Bits* dst;
    int64_t ds[4];
  };
  const auto side = [&](const TensorRef& in, const TensorRef& cache) {
    Side sd{in.data<Bits>(), {in.stride(0), in.stride(1), in.stride(2)}, cache.data<Bits>(), {}};
    for (int32_t d = 0; d < 4; ++d) sd.ds[d] = cache.stride(d);
    return sd;
  };
  const Side sides[2] = {side(key, kct), side(value, vct)};
  call.parallel_for(0, p.num_tokens, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, H * D)),
                    [&](int64_t tb, int64_t te) {
                      for (int64_t t = tb; t < te; ++t) {
                        const int64_t slot = slots[t];
                        if (slot < 0) continue;  // a padding token
                        const int64_t block = slot / B, off = slot % B;
                        for (const Side& sd : sides)
                          for (int64_t h = 0; h < H; ++h) {
                            const Bits* src = sd.src + t * sd.ss[0] + h * sd.ss[1];
                            Bits* dst = sd.dst + block * sd.ds[0] + off * sd.ds[1] + h * sd.ds[2];
                            if (sd.ss[2] == 1 && sd.ds[3] == 1) {
                              std::memcpy(dst, src, sizeof(Bits) * static_cast<size_t>(D));
                            } else {
                              for (int64_t d = 0; d < D; ++d) dst[d * sd.ds[3]] = src[d * sd.ss[2]];
                            }
                          }
                      }
                    });
}

// The legacy layout's writes (contiguous tensors): bit copies, so one loop
// per element size serves every dtype of that size.
template <typename Bits>
void reshape_into_legacy(const Call& call, const ReshapeProblem& p) {
  const TensorRef key = call.tensor(kKey), value = call.tensor(kValue);
  const Bits* pk = key.data<Bits>();
  const Bits* pv = value.data<Bits>();
  Bits* kc = call.tensor(kKeyCache).data<Bits>();
  Bits* vc = call.tensor(kValueCache).data<Bits>();
  const int64_t* slots = call.tensor(kSlotMapping).data<int64_t>();
  check_slots(call, slots, p);
  const KvCacheLayout& c = p.cache;
  const int64_t H = c.num_kv_heads, D = c.head_size, B = c.block_size, x = c.x;
  call.parallel_for(0, p.num_tokens, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, H * D)),
                    [&](int64_t tb, int64_t te) {
                      for (int64_t t = tb; t < te; ++t) {
                        const int64_t slot = slots[t];
                        if (slot < 0) continue;  // a padding token
                        const int64_t block = slot / B, off = slot % B;
                        const Bits* kt = pk + t * H * D;
                        const Bits* vt = pv + t * H * D;
                        for (int64_t h = 0; h < H; ++h) {
                          Bits* kb = kc + (block * H + h) * D * B;  // [D/x, B, x]
                          Bits* vb = vc + (block * H + h) * D * B;  // [D, B]
                          for (int64_t d = 0; d < D; ++d) {
                            kb[(d / x * B + off) * x + d % x] = kt[h * D + d];
                            vb[d * B + off] = vt[h * D + d];
                          }
                        }
                      }
                    });
}

void reshape_and_cache_meta(Call& call) { check_reshape(call, false); }
void reshape_and_cache_flash_meta(Call& call) { check_reshape(call, true); }

void reshape_and_cache(Call& call) {
  const ReshapeProblem p = check_reshape(call, false);
  if (call.tensor(kKey).dtype().bits == 32)
    reshape_into_legacy<uint32_t>(call, p);
  else
    reshape_into_legacy<uint16_t>(call, p);
}
void reshape_and_cache_flash(Call& call) {
  const ReshapeProblem p = check_reshape(call, true);
  if (call.tensor(kKey).dtype().bits == 32)
    reshape_into_flash<uint32_t>(call, p);
  else
    reshape_into_flash<uint16_t>(call, p);
}

// block_mapping int64 [n, 2] of (src, dst) pairs.
void check_block_mapping(const Call& call, const TensorRef& m) {
  expect_dtype(call, m, "block_mapping", npub::sdk::kInt64);
  if (m.dim() != 2 || m.size(1) != 2)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "block_mapping: expected [num_pairs, 2] (src, dst) pairs but found shape " +
                  Call::shape_str(m.sizes()));
}

void check_pairs(const Call& call, const int64_t* pairs, int64_t n, int64_t src_blocks, int64_t dst_blocks,
                 const std::string& src_name, const std::string& dst_name) {
  for (int64_t i = 0; i < n; ++i) {
    check_block_id(call, pairs[2 * i], src_blocks, [&] {
      return "block_mapping[" + std::to_string(i) + "][0]: source block of " + src_name;
    });
    check_block_id(call, pairs[2 * i + 1], dst_blocks, [&] {
      return "block_mapping[" + std::to_string(i) + "][1]: destination block of " + dst_name;
    });
  }
}

int64_t block_bytes(const TensorRef& t) {
  int64_t n = t.dtype().bits / 8;
  for (int32_t d = 1; d < t.dim(); ++d) n *= t.size(d);
  return n;
}

// name[i], built by appending (GCC 12's -Wrestrict misreads "[" + s + "]").
std::string indexed(const char* name, size_t i) {
  std::string s(name);
  s += '[';
  s += std::to_string(i);
  s += ']';
  return s;
}

// As vLLM's copy_blocks requires: every layer's key cache has key_caches[0]'s
// shape and dtype, every value cache value_caches[0]'s, and a value block holds
// as many elements as a key block (the legacy and the flash layouts both do),
// so one block id names the same tokens in every cache.
void check_same_layout(const Call& call, const std::vector<TensorRef>& keys,
                       const std::vector<TensorRef>& values, size_t i) {
  const auto describe = [](const TensorRef& t) {
    return std::string(npub::sdk::dtype_name(t.dtype())) + " " + Call::shape_str(t.sizes());
  };
  for (const auto* list : {&keys, &values}) {
    const char* name = list == &keys ? "key_caches" : "value_caches";
    const TensorRef &first = (*list)[0], &t = (*list)[i];
    if (t.dtype().code != first.dtype().code || t.dtype().bits != first.dtype().bits ||
        t.sizes() != first.sizes())
      call.fail(NPUB_ERR_INVALID_ARGUMENT, indexed(name, i) + ": expected " + name +
                                               "[0]'s dtype and shape (" + describe(first) +
                                               "), as every layer's cache has, but found " + describe(t));
  }
  const TensorRef &k = keys[i], &v = values[i];
  if (v.dtype().code != k.dtype().code || v.dtype().bits != k.dtype().bits ||
      block_bytes(v) != block_bytes(k))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              indexed("value_caches", i) +
                  ": expected the dtype and the block size (elements per block) of " +
                  indexed("key_caches", i) + " (" + describe(k) + ") but found " + describe(v));
}

// vllm_like::copy_blocks(Tensor(a!)[] key_caches, Tensor(b!)[] value_caches, Tensor block_mapping) -> ()
std::vector<TensorRef> check_copy_blocks(const Call& call) {
  const std::vector<TensorRef> keys = call.tensor_list(0), values = call.tensor_list(1);
  if (keys.size() != values.size())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "value_caches: expected one per key cache (" +
                                             std::to_string(keys.size()) + ") but found " +
                                             std::to_string(values.size()));
  if (keys.empty())
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "key_caches, value_caches: expected one cache per layer but found empty lists");
  check_block_mapping(call, call.tensor(2));
  std::vector<TensorRef> caches;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].dim() < 1 || values[i].dim() < 1 || keys[i].size(0) != values[i].size(0))
      call.fail(NPUB_ERR_INVALID_ARGUMENT,
                indexed("key_caches", i) + ", " + indexed("value_caches", i) +
                    ": expected caches of the same number of blocks (dim 0) but found " +
                    Call::shape_str(keys[i].sizes()) + " and " + Call::shape_str(values[i].sizes()));
    check_same_layout(call, keys, values, i);
    caches.push_back(keys[i]);
    caches.push_back(values[i]);
  }
  return caches;
}

void copy_blocks_meta(Call& call) { check_copy_blocks(call); }

// The pairs are copied in parallel, as vLLM's kernel copies them: a block
// that is one pair's destination and another's source (which vLLM's
// copy-on-write mappings never produce) gets either order.
void copy_blocks(Call& call) {
  const std::vector<TensorRef> caches = check_copy_blocks(call);
  const TensorRef m = call.tensor(2);
  const int64_t n = m.size(0);
  const int64_t* pairs = m.data<int64_t>();
  for (size_t c = 0; c < caches.size(); ++c) {
    const std::string name = indexed(c % 2 == 0 ? "key_caches" : "value_caches", c / 2);
    check_pairs(call, pairs, n, caches[c].size(0), caches[c].size(0), name, name);
  }
  std::vector<char*> base(caches.size());
  std::vector<int64_t> bytes(caches.size());
  for (size_t c = 0; c < caches.size(); ++c) {
    base[c] = caches[c].data<char>();
    bytes[c] = block_bytes(caches[c]);
  }
  const int64_t items = static_cast<int64_t>(caches.size()) * n;
  call.parallel_for(0, items, 4, [&](int64_t b, int64_t e) {
    for (int64_t it = b; it < e; ++it) {
      const size_t c = static_cast<size_t>(it / n);
      const int64_t i = it % n;
      std::memcpy(base[c] + pairs[2 * i + 1] * bytes[c], base[c] + pairs[2 * i] * bytes[c],
                  static_cast<size_t>(bytes[c]));
    }
  });
}

// vllm_like::swap_blocks(Tensor src, Tensor(a!) dst, Tensor block_mapping) -> ()
void check_swap_blocks(const Call& call) {
  const TensorRef src = call.tensor(0), dst = call.tensor(1);
  expect_dtype(call, dst, "dst", src.dtype());
  std::vector<int64_t> s = src.sizes(), d = dst.sizes();
  if (s.empty() || d.empty())
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "src, dst: expected caches with a block dimension (dim 0) but found shapes " +
                  Call::shape_str(s) + " and " + Call::shape_str(d));
  if (s.size() != d.size() || !std::equal(s.begin() + 1, s.end(), d.begin() + 1))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "dst: expected blocks (dims after the first) of src's shape " +
                                             Call::shape_str(s) + " but found " + Call::shape_str(d));
  check_block_mapping(call, call.tensor(2));
}

void swap_blocks_meta(Call& call) { check_swap_blocks(call); }

void swap_blocks(Call& call) {
  check_swap_blocks(call);
  const TensorRef src = call.tensor(0), dst = call.tensor(1), m = call.tensor(2);
  const int64_t n = m.size(0);
  const int64_t* pairs = m.data<int64_t>();
  check_pairs(call, pairs, n, src.size(0), dst.size(0), "src", "dst");
  const char* ps = src.data<char>();
  char* pd = dst.data<char>();
  const int64_t bytes = block_bytes(src);
  call.parallel_for(0, n, 4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      std::memcpy(pd + pairs[2 * i + 1] * bytes, ps + pairs[2 * i] * bytes, static_cast<size_t>(bytes));
  });
}

}  // namespace

void register_cache_ops(npub::sdk::Registrar& r) {
  const char* cache_args =
      "(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor slot_mapping, "
      "str kv_cache_dtype, float k_scale=1.0, float v_scale=1.0) -> ()";
  r.def((std::string("vllm_like::reshape_and_cache") + cache_args).c_str());
  r.def((std::string("vllm_like::reshape_and_cache_flash") + cache_args).c_str());
  r.kernel("vllm_like::reshape_and_cache", &reshape_and_cache)
      .dtypes(kCacheDtypes)
      .arg_dtypes("slot_mapping", {npub::sdk::kInt64})
      .contiguous_only()
      .opt_level(1);
  // Strided: reshape_into_flash reads and writes through the strides.
  r.kernel("vllm_like::reshape_and_cache_flash", &reshape_and_cache_flash)
      .dtypes(kCacheDtypes)
      .arg_dtypes("slot_mapping", {npub::sdk::kInt64})
      .opt_level(1);
  r.meta<&reshape_and_cache_meta>("vllm_like::reshape_and_cache");
  r.meta<&reshape_and_cache_flash_meta>("vllm_like::reshape_and_cache_flash");

  r.def(
      "vllm_like::copy_blocks(Tensor(a!)[] key_caches, Tensor(b!)[] value_caches, Tensor block_mapping) -> "
      "()");
  r.kernel("vllm_like::copy_blocks", &copy_blocks)
      .dtypes(kCacheDtypes)
      .arg_dtypes("block_mapping", {npub::sdk::kInt64})
      .contiguous_only()
      .opt_level(1);
  r.meta<&copy_blocks_meta>("vllm_like::copy_blocks");

  // Same-device block copies, for npu caches and for host ones (a C++ host's
  // CPU swap space); npubridge.vllm._custom_ops.swap_blocks stages npu<->cpu.
  r.def("vllm_like::swap_blocks(Tensor src, Tensor(a!) dst, Tensor block_mapping) -> ()");
  for (int32_t device : {NPUB_DEVICE_NPU, NPUB_DEVICE_CPU})
    r.kernel("vllm_like::swap_blocks", &swap_blocks)
        .dtypes(kCacheDtypes)
        .arg_dtypes("block_mapping", {npub::sdk::kInt64})
        .contiguous_only()
        .device(device)
        .opt_level(1);
  r.meta<&swap_blocks_meta>("vllm_like::swap_blocks");
}

}  // namespace vllm_like
