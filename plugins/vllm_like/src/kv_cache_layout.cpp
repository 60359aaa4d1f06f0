// The KV cache's layout checks (kv_cache_layout.h).
#include "kv_cache_layout.h"

namespace vllm_like {

using npub::sdk::Call;
using npub::sdk::TensorRef;

void expect_dim(const Call& call, const TensorRef& t, const char* name, int32_t dim) {
  if (t.dim() != dim)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(name) + ": expected a " + std::to_string(dim) +
                                             "-d tensor but found shape " + Call::shape_str(t.sizes()));
}

void expect_shape(const Call& call, const TensorRef& t, const char* name, const std::vector<int64_t>& shape) {
  if (t.sizes() != shape)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(name) + ": expected shape " + Call::shape_str(shape) +
                                             " but found " + Call::shape_str(t.sizes()));
}

void expect_dtype(const Call& call, const TensorRef& t, const char* name, DLDataType dtype) {
  if (!t.is(dtype))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(name) + ": expected dtype " +
                                             npub::sdk::dtype_name(dtype) + " but found " +
                                             npub::sdk::dtype_name(t.dtype()));
}

KvCacheLayout check_legacy_caches(const Call& call, int32_t key_index, int32_t value_index,
                                  DLDataType dtype) {
  const TensorRef k = call.tensor(key_index), v = call.tensor(value_index);
  expect_dtype(call, k, "key_cache", dtype);
  expect_dtype(call, v, "value_cache", dtype);
  expect_dim(call, k, "key_cache", 5);
  expect_dim(call, v, "value_cache", 4);
  KvCacheLayout l;
  l.num_blocks = k.size(0);
  l.num_kv_heads = k.size(1);
  l.block_size = k.size(3);
  l.x = elements_per_16_bytes(dtype.bits / 8);
  l.head_size = k.size(2) * l.x;
  if (k.size(4) != l.x)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "key_cache: expected the layout [num_blocks, num_kv_heads, head_size/x, block_size, x] with x "
              "= 16 / " +
                  std::to_string(dtype.bits / 8) + " = " + std::to_string(l.x) + " for " +
                  npub::sdk::dtype_name(dtype) + ", but found x = " + std::to_string(k.size(4)) +
                  " in shape " + Call::shape_str(k.sizes()));
  expect_shape(call, v,
               "value_cache (the layout [num_blocks, num_kv_heads, head_size, block_size] of key_cache's)",
               {l.num_blocks, l.num_kv_heads, l.head_size, l.block_size});
  return l;
}

KvCacheLayout check_flash_caches(const Call& call, int32_t key_index, int32_t value_index, DLDataType dtype) {
  const TensorRef k = call.tensor(key_index), v = call.tensor(value_index);
  expect_dtype(call, k, "key_cache", dtype);
  expect_dtype(call, v, "value_cache", dtype);
  expect_dim(call, k, "key_cache", 4);
  KvCacheLayout l;
  l.num_blocks = k.size(0);
  l.block_size = k.size(1);
  l.num_kv_heads = k.size(2);
  l.head_size = k.size(3);
  expect_shape(call, v, "value_cache (key_cache's shape)", k.sizes());
  return l;
}

void check_kv_cache_dtype(const Call& call, int32_t dtype_index, int32_t k_scale_index,
                          int32_t v_scale_index) {
  const std::string kv = call.string_arg(dtype_index);
  if (kv != "auto")
    call.fail(
        NPUB_ERR_INVALID_ARGUMENT,
        "kv_cache_dtype: expected 'auto' (the cache in the model's dtype; fp8 caches are not supported) "
        "but found '" +
            kv + "'");
  const double ks = call.double_arg(k_scale_index), vs = call.double_arg(v_scale_index);
  if (ks != 1.0 || vs != 1.0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "k_scale, v_scale: expected 1.0 (they scale fp8 caches only) but found " + std::to_string(ks) +
                  ", " + std::to_string(vs));
}

void fail_block_id(const Call& call, int64_t id, int64_t num_blocks, const std::string& what) {
  call.fail(NPUB_ERR_INDEX, what + " " + std::to_string(id) + " is out of range for " +
                                std::to_string(num_blocks) + " cache blocks (expected 0 <= id < " +
                                std::to_string(num_blocks) + ")");
}

}  // namespace vllm_like
