/* A plugin built against the frozen ABI 1.5 header (tests/abi/frozen/v1_5),
 * the last before NpubKernelDesc.meta (1.6): its kernel description ends
 * before that field (a stack object of the 1.5 size, so that a host reading
 * past it is caught under AddressSanitizer), and a 1.6 host loads it all
 * the same. Its functional op allocates its result in the kernel; the op's
 * own meta function (register_meta_with_data, 1.4) says the result, which
 * is what a metadata call plan's returns come from when the kernel has no
 * meta function of its own. */
#include <npubridge/plugin_api.h> /* resolves to the frozen copy (include path) */

#include <stddef.h>
#include <string.h>

static int g_tag = 15;

static int64_t numel(const DLTensor* t) {
  int64_t n = 1;
  int d;
  for (d = 0; d < t->ndim; ++d) n *= t->shape[d];
  return n;
}

/* old15::halve(Tensor self) -> Tensor: self / 2, in a result it allocates. */
static NpubError* halve_kernel(NpubCallContext* ctx, const NpubValue* args, int32_t num_args, NpubValue* rets,
                               int32_t num_rets) {
  const NpubContextHead* head = NPUB_CONTEXT_HEAD(ctx);
  const DLTensor* x = args[0].u.tensor;
  DLTensor* out = NULL;
  NpubError* err;
  const float* src;
  float* dst;
  int64_t i, n = numel(x);
  (void)num_args;
  (void)num_rets;
  if ((err = head->host->alloc_output(ctx, 0, x->ndim, x->shape, x->dtype, &out)) != NULL) return err;
  src = (const float*)((const char*)x->data + x->byte_offset);
  dst = (float*)((char*)out->data + out->byte_offset);
  for (i = 0; i < n; ++i) dst[i] = 0.5f * src[i];
  rets[0].tag = NPUB_VALUE_TENSOR;
  rets[0].u.tensor = out;
  return NULL;
}

static NpubError* halve_meta(NpubMetaContext* ctx, const NpubValue* args, int32_t num_args) {
  const NpubContextHead* head = NPUB_CONTEXT_HEAD(ctx);
  const DLTensor* x = args[0].u.tensor;
  (void)num_args;
  if (head->user_data != &g_tag)
    return head->host->error_create(NPUB_ERR_INTERNAL, "old15: the meta call's user data is wrong");
  return head->host->set_output_meta(ctx, 0, x->ndim, x->shape, x->dtype);
}

static NpubError* initialize(const NpubHostApi* host, NpubRegistrar* reg) {
  static const DLDataType f32 = {kDLFloat, 32, 1};
  NpubKernelDesc d; /* 1.5's: no `meta` */
  NpubError* err;
  if (host->struct_size < NPUB_HOST_API_STRUCT_SIZE_1_5 || host->abi_minor < 5)
    return host->error_create(NPUB_ERR_ABI, "old15 needs a host of ABI 1.5 or later");
  if ((err = host->define_op(reg, "old15::halve(Tensor self) -> Tensor")) != NULL) return err;
  memset(&d, 0, sizeof d);
  d.struct_size = NPUB_KERNEL_DESC_STRUCT_SIZE; /* 1.5's (the 1.4 layout) */
  d.op_name = "old15::halve";
  d.device_type = NPUB_DEVICE_NPU;
  d.dtypes = &f32;
  d.num_dtypes = 1;
  d.fn = halve_kernel;
  d.flags = NPUB_KERNEL_CONTIGUOUS_ONLY;
  if ((err = host->register_kernel(reg, &d)) != NULL) return err;
  return host->register_meta_with_data(reg, "old15::halve", halve_meta, &g_tag);
}

NPUB_PLUGIN_EXPORT const NpubPluginApi* npub_plugin_init_v1(void) {
  static const NpubPluginApi api = {
      NPUB_PLUGIN_API_STRUCT_SIZE, NPUB_ABI_MAJOR, NPUB_ABI_MINOR, "old15", "1.5.0", initialize, NULL};
  return &api;
}
