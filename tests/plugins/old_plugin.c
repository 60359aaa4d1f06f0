/* A plugin built against the frozen ABI 1.0 header (tests/abi/frozen/v1_0),
 * not today's: proof that released plugins keep loading. Its second kernel
 * reports struct_size as the end of its last field (84, PJRT's way), not
 * sizeof (88, with tail padding): both are valid 1.0 sizes. */
#include <npubridge/plugin_api.h> /* resolves to the frozen copy (include path) */

#include <stddef.h>
#include <string.h>

static const NpubHostApi* g_host = NULL;

static NpubError* negate_kernel(NpubCallContext* ctx, const NpubValue* args, int32_t num_args,
                                NpubValue* rets, int32_t num_rets) {
  const DLTensor* x = args[0].u.tensor;
  DLTensor* out = args[1].u.tensor;
  const float* src = (const float*)((const char*)x->data + x->byte_offset);
  float* dst = (float*)((char*)out->data + out->byte_offset);
  int64_t n = 1, i;
  int d;
  (void)ctx;
  (void)num_args;
  (void)rets;
  (void)num_rets;
  for (d = 0; d < x->ndim; ++d) n *= x->shape[d];
  for (i = 0; i < n; ++i) dst[i] = -src[i];
  return NULL;
}

static NpubError* initialize(const NpubHostApi* host, NpubRegistrar* reg) {
  static const DLDataType f32 = {kDLFloat, 32, 1};
  NpubKernelDesc d;
  NpubError* err;
  g_host = host;
  if ((err = host->define_op(reg, "old::negate(Tensor self, Tensor(a!) out) -> Tensor(a!)")) != NULL)
    return err;
  memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  d.op_name = "old::negate";
  d.device_type = NPUB_DEVICE_NPU;
  d.dtypes = &f32;
  d.num_dtypes = 1;
  d.fn = negate_kernel;
  d.flags = NPUB_KERNEL_CONTIGUOUS_ONLY;
  if ((err = host->register_kernel(reg, &d)) != NULL) return err;
  if ((err = host->define_op(reg, "old::negate_sized(Tensor self, Tensor(a!) out) -> Tensor(a!)")) != NULL)
    return err;
  d.struct_size = offsetof(NpubKernelDesc, min_opt_level) + sizeof d.min_opt_level;
  d.op_name = "old::negate_sized";
  return host->register_kernel(reg, &d);
}

NPUB_PLUGIN_EXPORT const NpubPluginApi* npub_plugin_init_v1(void) {
  static const NpubPluginApi api = {sizeof(NpubPluginApi), 1, 0, "old_v1_0", "1.0.0", initialize, NULL};
  return &api;
}
