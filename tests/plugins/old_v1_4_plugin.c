/* A plugin built against the frozen ABI 1.4 header (tests/abi/frozen/v1_4),
 * the last before register_fusion_pattern (1.5): its NpubHostApi has no
 * such field, and a 1.5 host loads it all the same. It uses 1.4's
 * register_meta_with_data and reads the context head, and checks that the
 * host table it gets is at least the 1.4 size. */
#include <npubridge/plugin_api.h> /* resolves to the frozen copy (include path) */

#include <stddef.h>
#include <string.h>

static int g_tag = 14;

static NpubError* twice_kernel(NpubCallContext* ctx, const NpubValue* args, int32_t num_args, NpubValue* rets,
                               int32_t num_rets) {
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
  for (i = 0; i < n; ++i) dst[i] = 2.0f * src[i];
  return NULL;
}

static NpubError* twice_meta(NpubMetaContext* ctx, const NpubValue* args, int32_t num_args) {
  const NpubContextHead* head = NPUB_CONTEXT_HEAD(ctx);
  (void)args;
  (void)num_args;
  if (head->user_data != &g_tag)
    return head->host->error_create(NPUB_ERR_INTERNAL, "old14: the meta call's user data is wrong");
  return NULL; /* the only return aliases `out` */
}

static NpubError* initialize(const NpubHostApi* host, NpubRegistrar* reg) {
  static const DLDataType f32 = {kDLFloat, 32, 1};
  NpubKernelDesc d;
  NpubError* err;
  if (host->struct_size < NPUB_HOST_API_STRUCT_SIZE_1_4 || host->abi_minor < 4)
    return host->error_create(NPUB_ERR_ABI, "old14 needs a host of ABI 1.4 or later");
  if ((err = host->define_op(reg, "old14::twice(Tensor self, Tensor(a!) out) -> Tensor(a!)")) != NULL)
    return err;
  memset(&d, 0, sizeof d);
  d.struct_size = NPUB_KERNEL_DESC_STRUCT_SIZE; /* 1.4's */
  d.op_name = "old14::twice";
  d.device_type = NPUB_DEVICE_NPU;
  d.dtypes = &f32;
  d.num_dtypes = 1;
  d.fn = twice_kernel;
  d.flags = NPUB_KERNEL_CONTIGUOUS_ONLY;
  if ((err = host->register_kernel(reg, &d)) != NULL) return err;
  return host->register_meta_with_data(reg, "old14::twice", twice_meta, &g_tag);
}

NPUB_PLUGIN_EXPORT const NpubPluginApi* npub_plugin_init_v1(void) {
  static const NpubPluginApi api = {
      NPUB_PLUGIN_API_STRUCT_SIZE, NPUB_ABI_MAJOR, NPUB_ABI_MINOR, "old14", "1.4.0", initialize, NULL};
  return &api;
}
