/* A plugin from the future: built against a later minor of ABI 1, whose
 * structs have grown at their end. Today's host reads only what it knows. */
#include <npubridge/plugin_api.h>

#include <string.h>

typedef struct {
  NpubPluginApi v1;          /* the part today's host knows */
  void (*future_hook)(void); /* appended in a later minor */
  const char* future_string;
} FuturePluginApi;

typedef struct {
  NpubKernelDesc v1;
  int64_t future_field;
  void* future_pointer;
} FutureKernelDesc;

static const NpubHostApi* g_host = NULL;

static NpubError* copy_kernel(NpubCallContext* ctx, const NpubValue* args, int32_t num_args, NpubValue* rets,
                              int32_t num_rets) {
  const DLTensor* x = args[0].u.tensor;
  DLTensor* out = args[1].u.tensor;
  int64_t n = 1;
  int i;
  (void)ctx;
  (void)num_args;
  (void)rets;
  (void)num_rets;
  for (i = 0; i < x->ndim; ++i) n *= x->shape[i];
  memcpy((char*)out->data + out->byte_offset, (const char*)x->data + x->byte_offset, (size_t)n * 4);
  return NULL;
}

static NpubError* initialize(const NpubHostApi* host, NpubRegistrar* reg) {
  static const DLDataType f32 = {kDLFloat, 32, 1};
  FutureKernelDesc d;
  NpubError* err;
  g_host = host;
  if (host->struct_size < NPUB_HOST_API_STRUCT_SIZE)
    return host->error_create(NPUB_ERR_ABI, "host table too small");
  if ((err = host->define_op(reg, "future::copy(Tensor self, Tensor(a!) out) -> Tensor(a!)")) != NULL)
    return err;
  memset(&d, 0, sizeof d);
  d.v1.struct_size = sizeof d;
  d.v1.op_name = "future::copy";
  d.v1.device_type = NPUB_DEVICE_NPU;
  d.v1.dtypes = &f32;
  d.v1.num_dtypes = 1;
  d.v1.fn = copy_kernel;
  d.v1.flags = NPUB_KERNEL_CONTIGUOUS_ONLY;
  d.future_field = 12345;
  return host->register_kernel(reg, &d.v1);
}

static void future_hook(void) {}

NPUB_PLUGIN_EXPORT const NpubPluginApi* npub_plugin_init_v1(void) {
  static const FuturePluginApi api = {
      {sizeof(FuturePluginApi), NPUB_ABI_MAJOR, NPUB_ABI_MINOR + 7, "future", "9.9.9", initialize, NULL},
      future_hook,
      "from the future"};
  return &api.v1;
}
