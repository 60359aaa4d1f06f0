/* Compiled with -std=c99 -pedantic -Werror by CTest (abi.header_is_c99). */
#include <npubridge/plugin_api.h>

static NpubError* kernel(NpubCallContext* ctx, const NpubValue* args, int32_t num_args, NpubValue* rets,
                         int32_t num_rets) {
  (void)ctx;
  (void)args;
  (void)num_args;
  (void)rets;
  (void)num_rets;
  return NULL;
}

int main(void) {
  NpubKernelDesc desc;
  NpubValue v;
  desc.struct_size = sizeof desc;
  desc.fn = kernel;
  v.tag = NPUB_VALUE_INT;
  v.u.i = 1;
  return (int)(v.u.i - 1) + (desc.fn == NULL);
}
