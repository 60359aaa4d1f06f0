/* The benchmark's trivial kernels: bench::touch(Tensor(a!) self) -> Tensor(a!)
 * adds 1 to the first element; bench::touch3(Tensor(a!) self, Tensor a,
 * Tensor b) -> Tensor(a!) adds a's and b's first elements (three tensors whose
 * dtypes the dispatcher checks, Note [Per-argument dtypes]). Exported so the benchmark can call the very
 * same function directly (the baseline of the dispatch overhead). */
#include <npubridge/plugin_api.h>

static const NpubHostApi* g_host;

static NpubError* touch(NpubCallContext* ctx, const NpubValue* args, int32_t num_args, NpubValue* rets,
                        int32_t num_rets) {
  DLTensor* t = args[0].u.tensor;
  (void)ctx;
  (void)num_args;
  (void)rets;
  (void)num_rets;
  *(float*)((char*)t->data + t->byte_offset) += 1.0f;
  return 0;
}

static NpubError* touch3(NpubCallContext* ctx, const NpubValue* args, int32_t num_args, NpubValue* rets,
                         int32_t num_rets) {
  DLTensor* t = args[0].u.tensor;
  const DLTensor* a = args[1].u.tensor;
  const DLTensor* b = args[2].u.tensor;
  (void)ctx;
  (void)num_args;
  (void)rets;
  (void)num_rets;
  *(float*)((char*)t->data + t->byte_offset) += *(const float*)((const char*)a->data + a->byte_offset) +
                                                *(const float*)((const char*)b->data + b->byte_offset);
  return 0;
}

static NpubError* initialize(const NpubHostApi* host, NpubRegistrar* reg) {
  static const DLDataType f32 = {kDLFloat, 32, 1};
  NpubKernelDesc d = {0};
  NpubError* err;
  g_host = host;
  if ((err = host->define_op(reg, "bench::touch(Tensor(a!) self) -> Tensor(a!)")) != 0) return err;
  d.struct_size = sizeof d;
  d.op_name = "bench::touch";
  d.device_type = NPUB_DEVICE_NPU;
  d.dtypes = &f32;
  d.num_dtypes = 1;
  d.fn = touch;
  if ((err = host->register_kernel(reg, &d)) != 0) return err;
  if ((err = host->define_op(reg, "bench::touch3(Tensor(a!) self, Tensor a, Tensor b) -> Tensor(a!)")) != 0)
    return err;
  d.op_name = "bench::touch3";
  d.fn = touch3;
  return host->register_kernel(reg, &d);
}

NPUB_PLUGIN_EXPORT const NpubPluginApi* npub_plugin_init_v1(void) {
  static const NpubPluginApi api = {
      sizeof(NpubPluginApi), NPUB_ABI_MAJOR, NPUB_ABI_MINOR, "bench_trivial", "1.0.0", initialize, 0};
  return &api;
}
