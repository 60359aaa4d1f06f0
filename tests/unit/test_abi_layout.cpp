// Golden sizes and offsets of ABI 1.x (LP64): 1.0 plus the slots appended
// since (marked). A failure here means a
// released layout changed: that is an ABI break (bump NPUB_ABI_MAJOR) or a
// mistake. New fields go at the end of a struct and get their own asserts.
#include <npubridge/plugin_api.h>

#include <gtest/gtest.h>

#include <cstddef>

#define NPUB_GOLDEN(type, field, offset) \
  static_assert(offsetof(type, field) == (offset), #type "." #field " moved: ABI 1.0 is frozen")

static_assert(sizeof(void*) == 8, "golden layouts are for LP64 targets");

static_assert(sizeof(NpubValue) == 16, "NpubValue must stay 16 bytes");
NPUB_GOLDEN(NpubValue, tag, 0);
NPUB_GOLDEN(NpubValue, count, 4);
NPUB_GOLDEN(NpubValue, u, 8);

static_assert(sizeof(NpubKernelDesc) == 112, "NpubKernelDesc v1.6 size");
NPUB_GOLDEN(NpubKernelDesc, struct_size, 0);
NPUB_GOLDEN(NpubKernelDesc, op_name, 8);
NPUB_GOLDEN(NpubKernelDesc, device_type, 16);
NPUB_GOLDEN(NpubKernelDesc, priority, 20);
NPUB_GOLDEN(NpubKernelDesc, dtypes, 24);
NPUB_GOLDEN(NpubKernelDesc, num_dtypes, 32);
NPUB_GOLDEN(NpubKernelDesc, flags, 36);
NPUB_GOLDEN(NpubKernelDesc, fn, 40);
NPUB_GOLDEN(NpubKernelDesc, supports, 48);
NPUB_GOLDEN(NpubKernelDesc, workspace_size, 56);
NPUB_GOLDEN(NpubKernelDesc, user_data, 64);
NPUB_GOLDEN(NpubKernelDesc, user_data_deleter, 72);
NPUB_GOLDEN(NpubKernelDesc, min_opt_level, 80);
NPUB_GOLDEN(NpubKernelDesc, arg_dtypes, 88);  // \since 1.4
NPUB_GOLDEN(NpubKernelDesc, num_arg_dtypes, 96);
NPUB_GOLDEN(NpubKernelDesc, meta, 104);  // \since 1.6

static_assert(sizeof(NpubArgDtypes) == 24, "NpubArgDtypes v1.4 size");
NPUB_GOLDEN(NpubArgDtypes, arg, 0);
NPUB_GOLDEN(NpubArgDtypes, rule, 8);
NPUB_GOLDEN(NpubArgDtypes, num_dtypes, 12);
NPUB_GOLDEN(NpubArgDtypes, dtypes, 16);

static_assert(sizeof(NpubContextHead) == 32, "NpubContextHead v1.4 size");
NPUB_GOLDEN(NpubContextHead, struct_size, 0);
NPUB_GOLDEN(NpubContextHead, host, 8);
NPUB_GOLDEN(NpubContextHead, user_data, 16);
NPUB_GOLDEN(NpubContextHead, op_name, 24);

// NpubHostApi grew in 1.1 (philox_reserve), 1.2 (register_meta,
// set_output_meta, define_derivative), 1.4 (register_meta_with_data) and
// 1.5 (register_fusion_pattern); the earlier parts are unchanged.
static_assert(sizeof(NpubHostApi) == 184, "NpubHostApi v1.5 size");
NPUB_GOLDEN(NpubHostApi, struct_size, 0);
NPUB_GOLDEN(NpubHostApi, abi_major, 8);
NPUB_GOLDEN(NpubHostApi, abi_minor, 12);
NPUB_GOLDEN(NpubHostApi, error_create, 16);
NPUB_GOLDEN(NpubHostApi, error_destroy, 24);
NPUB_GOLDEN(NpubHostApi, error_code, 32);
NPUB_GOLDEN(NpubHostApi, error_message, 40);
NPUB_GOLDEN(NpubHostApi, log, 48);
NPUB_GOLDEN(NpubHostApi, define_op, 56);
NPUB_GOLDEN(NpubHostApi, register_kernel, 64);
NPUB_GOLDEN(NpubHostApi, kernel_user_data, 72);
NPUB_GOLDEN(NpubHostApi, device_index, 80);
NPUB_GOLDEN(NpubHostApi, current_stream, 88);
NPUB_GOLDEN(NpubHostApi, workspace, 96);
NPUB_GOLDEN(NpubHostApi, alloc_output, 104);
NPUB_GOLDEN(NpubHostApi, alloc_scratch, 112);
NPUB_GOLDEN(NpubHostApi, parallel_for, 120);
NPUB_GOLDEN(NpubHostApi, num_threads, 128);
NPUB_GOLDEN(NpubHostApi, philox_reserve, 136);  // \since 1.1
NPUB_GOLDEN(NpubHostApi, register_meta, 144);   // \since 1.2
NPUB_GOLDEN(NpubHostApi, set_output_meta, 152);
NPUB_GOLDEN(NpubHostApi, define_derivative, 160);
NPUB_GOLDEN(NpubHostApi, register_meta_with_data, 168);  // \since 1.4
NPUB_GOLDEN(NpubHostApi, register_fusion_pattern, 176);  // \since 1.5

// The frozen per-version sizes readers check struct_size against.
static_assert(NPUB_KERNEL_DESC_STRUCT_SIZE_1_0 == 84, "NpubKernelDesc 1.0 ends at min_opt_level");
static_assert(NPUB_HOST_API_STRUCT_SIZE_1_0 == 136, "NpubHostApi 1.0 ends at num_threads");
static_assert(NPUB_HOST_API_STRUCT_SIZE_1_1 == 144, "NpubHostApi 1.1 ends at philox_reserve");
static_assert(NPUB_HOST_API_STRUCT_SIZE_1_2 == 168, "NpubHostApi 1.2 ends at define_derivative");
static_assert(NPUB_HOST_API_STRUCT_SIZE_1_4 == 176, "NpubHostApi 1.4 ends at register_meta_with_data");
static_assert(NPUB_HOST_API_STRUCT_SIZE_1_5 == 184, "NpubHostApi 1.5 ends at register_fusion_pattern");
static_assert(NPUB_KERNEL_DESC_STRUCT_SIZE_1_4 == 100, "NpubKernelDesc 1.4 ends at num_arg_dtypes");
static_assert(NPUB_KERNEL_DESC_STRUCT_SIZE_1_6 == 112, "NpubKernelDesc 1.6 ends at meta");
static_assert(NPUB_CONTEXT_HEAD_STRUCT_SIZE_1_4 == 32, "NpubContextHead 1.4 ends at op_name");
static_assert(NPUB_PLUGIN_API_STRUCT_SIZE_1_0 == 48, "NpubPluginApi 1.0 ends at shutdown");

static_assert(sizeof(NpubPluginApi) == 48, "NpubPluginApi v1.0 size");
NPUB_GOLDEN(NpubPluginApi, struct_size, 0);
NPUB_GOLDEN(NpubPluginApi, abi_major, 8);
NPUB_GOLDEN(NpubPluginApi, abi_minor, 12);
NPUB_GOLDEN(NpubPluginApi, name, 16);
NPUB_GOLDEN(NpubPluginApi, version, 24);
NPUB_GOLDEN(NpubPluginApi, initialize, 32);
NPUB_GOLDEN(NpubPluginApi, shutdown, 40);

TEST(Abi, EnumValuesAreFixed) {
  EXPECT_EQ(NPUB_VALUE_NONE, 0);
  EXPECT_EQ(NPUB_VALUE_TENSOR, 1);
  EXPECT_EQ(NPUB_VALUE_INT, 2);
  EXPECT_EQ(NPUB_VALUE_DOUBLE, 3);
  EXPECT_EQ(NPUB_VALUE_BOOL, 4);
  EXPECT_EQ(NPUB_VALUE_STRING, 5);
  EXPECT_EQ(NPUB_VALUE_INT_LIST, 6);
  EXPECT_EQ(NPUB_VALUE_TENSOR_LIST, 7);
  EXPECT_EQ(NPUB_VALUE_DOUBLE_LIST, 8);
  EXPECT_EQ(NPUB_ERR_INVALID_ARGUMENT, 1);
  EXPECT_EQ(NPUB_ERR_NOT_FOUND, 6);
  EXPECT_EQ(NPUB_ERR_INDEX, 7);
  EXPECT_EQ(NPUB_KERNEL_CONTIGUOUS_ONLY, 1u);
  EXPECT_EQ(NPUB_KERNEL_ALIAS_SAFE, 2u);
  EXPECT_EQ(NPUB_KERNEL_MIXED_DTYPES, 4u);
  EXPECT_EQ(NPUB_ARG_DTYPE_DISPATCH, 0);
  EXPECT_EQ(NPUB_ARG_DTYPE_ANY, 1);
  EXPECT_EQ(NPUB_ARG_DTYPE_LISTED, 2);
  EXPECT_EQ(NPUB_DEVICE_NPU, kDLExtDev);
  EXPECT_EQ(NPUB_ABI_MAJOR, 1);
  EXPECT_EQ(NPUB_ABI_MINOR, 6);
  EXPECT_STREQ(NPUB_PLUGIN_ENTRY_SYMBOL, "npub_plugin_init_v1");
}
