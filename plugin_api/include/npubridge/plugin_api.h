/*
 * npubridge plugin C ABI, major version 1.
 *
 * This header is the whole contract between npubridge (the host) and an
 * acceleration-library plugin. It is pure C99 so that a plugin may be written
 * in C, C++ or anything that can export a C symbol.
 *
 * A plugin is a shared library that exports exactly one symbol,
 * `npub_plugin_init_v1` (see NPUB_PLUGIN_ENTRY_SYMBOL). The host calls it once,
 * reads the returned NpubPluginApi, checks it, then calls `initialize` with a
 * table of host services (NpubHostApi). During `initialize` the plugin defines
 * op schemas and registers kernels. After that the host calls the kernels.
 *
 * Compatibility promises (read these before changing anything below):
 *  - The major version is part of the entry symbol's name. A plugin built for
 *    another major is reported as such; it is never half-read.
 *  - Minor versions only append: fields are added at the end of a struct,
 *    never removed, retyped or reordered. Every struct that crosses the
 *    boundary begins with `struct_size`, and a reader uses only the fields that
 *    `struct_size` covers. An optional function is called only when
 *    `struct_size` covers it and it is non-NULL.
 *  - Released layouts are frozen by golden sizeof/offsetof tests
 *    (tests/abi/test_abi_layout.cpp).
 *  - Enum values are fixed numbers. A reader rejects a tag it does not know.
 *  - Nothing C++ crosses the boundary: no exceptions, no std:: types. Errors
 *    are opaque objects created by the host (NpubHostApi.error_create), so
 *    they outlive the plugin and never cross allocators.
 *  - Tensors cross as DLPack DLTensor (the subset shared by DLPack 0.6 and
 *    1.x: DLTensor, DLDevice, DLDataType).
 */
#ifndef NPUBRIDGE_PLUGIN_API_H_
#define NPUBRIDGE_PLUGIN_API_H_

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Versions                                                                  */
/* ------------------------------------------------------------------------ */

/** Removing, retyping or reordering anything bumps the major version. */
#define NPUB_ABI_MAJOR 1
/** Appending a field or a function to a struct bumps the minor version. */
#define NPUB_ABI_MINOR 3

/** The one symbol a plugin exports. Its name carries the major version. */
#define NPUB_PLUGIN_ENTRY_SYMBOL "npub_plugin_init_v1"

/** Visibility for the entry point; build plugins with -fvisibility=hidden. */
#if defined(_WIN32)
#define NPUB_PLUGIN_EXPORT __declspec(dllexport)
#else
#define NPUB_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------------ */
/* Device and dtype constants                                                */
/* ------------------------------------------------------------------------ */

/**
 * The simulated NPU is DLPack's extension device: a tensor on npu:N has
 * `device.device_type == NPUB_DEVICE_NPU` and `device.device_id == N`.
 */
#define NPUB_DEVICE_NPU 12 /* == kDLExtDev */
/** Host memory; used by kernels registered for the CPU device type. */
#define NPUB_DEVICE_CPU 1 /* == kDLCPU */

/**
 * DLPack 0.6 has no boolean type code; DLPack >= 0.8 names code 6 kDLBool.
 * npubridge uses {code 6, bits 8, lanes 1} for bool, as PyTorch does.
 */
#define NPUB_DL_BOOL 6

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

/**
 * An error. Opaque; created by the host through NpubHostApi.error_create and
 * owned by whoever holds it. A kernel or `initialize` returns NULL on success
 * or an error it created; returning it hands ownership to the host. A plugin
 * that receives an error from a host function either returns it (handing it
 * back) or destroys it with NpubHostApi.error_destroy.
 */
typedef struct NpubError NpubError;

/** Error codes. Fixed numbers; 0 is never an error. */
typedef enum NpubErrorCode {
  NPUB_ERR_INVALID_ARGUMENT = 1, /**< bad shape, dtype or value */
  NPUB_ERR_UNSUPPORTED = 2,      /**< valid input this kernel cannot serve */
  NPUB_ERR_OUT_OF_MEMORY = 3,    /**< a device allocation failed */
  NPUB_ERR_INTERNAL = 4,         /**< a bug in the plugin or the host */
  NPUB_ERR_ABI = 5,              /**< a struct or version mismatch */
  NPUB_ERR_NOT_FOUND = 6,        /**< an op, kernel or name does not exist */
  /** An index argument out of range (hosts raise their index error class:
   * IndexError in Python). \since 1.3; a 1.2 host reads it as INTERNAL. */
  NPUB_ERR_INDEX = 7
} NpubErrorCode;

/* ------------------------------------------------------------------------ */
/* Boxed values: the one calling convention of every kernel                  */
/* ------------------------------------------------------------------------ */

/** Tag of an NpubValue. Fixed numbers; readers reject unknown tags. */
typedef enum NpubValueTag {
  NPUB_VALUE_NONE = 0,        /**< absent optional argument */
  NPUB_VALUE_TENSOR = 1,      /**< `tensor`: borrowed DLTensor* */
  NPUB_VALUE_INT = 2,         /**< `i`: int64 (also ScalarType, Layout...) */
  NPUB_VALUE_DOUBLE = 3,      /**< `d`: double */
  NPUB_VALUE_BOOL = 4,        /**< `i`: 0 or 1 */
  NPUB_VALUE_STRING = 5,      /**< `s`: NUL-terminated UTF-8, `count` bytes */
  NPUB_VALUE_INT_LIST = 6,    /**< `ints`: `count` int64 values */
  NPUB_VALUE_TENSOR_LIST = 7, /**< `tensors`: `count` borrowed DLTensor* */
  NPUB_VALUE_DOUBLE_LIST = 8  /**< `doubles`: `count` double values */
} NpubValueTag;

/**
 * One boxed argument or return value: 16 bytes, no ownership.
 *
 * Every pointer inside is borrowed: it is valid for the duration of the
 * kernel call that received it and must not be kept afterwards. A kernel may
 * write through a tensor's `data` only for arguments the schema marks as
 * written (`Tensor(a!)`) and for its return tensors.
 */
typedef struct NpubValue {
  int32_t tag;   /**< an NpubValueTag */
  int32_t count; /**< element count of lists, byte length of strings */
  union {
    DLTensor* tensor;
    int64_t i;
    double d;
    const char* s;
    const int64_t* ints;
    DLTensor* const* tensors;
    const double* doubles;
  } u;
} NpubValue;

/* ------------------------------------------------------------------------ */
/* Opaque host handles                                                       */
/* ------------------------------------------------------------------------ */

/** The registration session handed to `initialize`. Host-owned. */
typedef struct NpubRegistrar NpubRegistrar;
/** One kernel invocation. Host-owned; valid during the kernel call only. */
typedef struct NpubCallContext NpubCallContext;
/** A device stream. Host-owned; valid while the device exists. */
typedef struct NpubStream NpubStream;
/** Opaque: the state of one meta-function call (\since 1.2). */
typedef struct NpubMetaContext NpubMetaContext;

/** Log levels for NpubHostApi.log. */
typedef enum NpubLogLevel {
  NPUB_LOG_TRACE = 0,
  NPUB_LOG_DEBUG = 1,
  NPUB_LOG_INFO = 2,
  NPUB_LOG_WARN = 3,
  NPUB_LOG_ERROR = 4
} NpubLogLevel;

/* ------------------------------------------------------------------------ */
/* Kernels                                                                   */
/* ------------------------------------------------------------------------ */

/**
 * A kernel. `args` follows the op's schema argument by argument (all of them,
 * defaults already filled in by the host). `rets` follows the schema's
 * returns: a return the caller preallocated arrives as NPUB_VALUE_TENSOR; a
 * return that arrives as NPUB_VALUE_NONE must be produced by the kernel with
 * NpubHostApi.alloc_output (tensors) or by setting it (int, double, bool).
 * Returns aliasing a written argument (`Tensor(a!)`) arrive filled in.
 *
 * Thread safety: kernels must be reentrant; the host calls a kernel from many
 * threads at once. Returns NULL on success or an error (ownership moves to the
 * host).
 */
typedef NpubError* (*NpubKernelFn)(NpubCallContext* ctx, const NpubValue* args, int32_t num_args,
                                   NpubValue* rets, int32_t num_rets);

/**
 * Optional predicate: may this kernel serve these arguments? Called during
 * kernel selection, after the dtype check; must be cheap and must not fail.
 * Returns non-zero for yes.
 */
typedef int32_t (*NpubSupportsFn)(void* user_data, const NpubValue* args, int32_t num_args);

/**
 * Optional workspace query, phase one of a two-phase call (as CANN's
 * aclnnXxxGetWorkspaceSize). The host allocates `*bytes` of device memory and
 * passes it to the kernel through NpubHostApi.workspace. Returns NULL or an
 * error (ownership moves to the host).
 */
typedef NpubError* (*NpubWorkspaceSizeFn)(void* user_data, const NpubValue* args, int32_t num_args,
                                          uint64_t* bytes /* out */);

/**
 * A meta (shape) function of an op: computes the dtype and shape of every
 * tensor return from the arguments' metadata alone, without running the
 * kernel. Tensor arguments carry shape, strides, dtype and device, but
 * `data` is NULL and must not be read. Declares each tensor return with
 * NpubHostApi.set_output_meta (returns that alias an argument, Tensor(a!),
 * need nothing). Returns NULL, or an error for arguments the kernel would
 * reject, with the kernel's message. PyTorch's fake tensors, torch.compile
 * and torch.export trace a plugin's own ops with it. \since 1.2
 */
typedef NpubError* (*NpubMetaFn)(NpubMetaContext* ctx, const NpubValue* args, int32_t num_args);

/** Kernel flags (bit set). */
typedef enum NpubKernelFlags {
  /** The kernel reads and writes only contiguous tensors; the host copies
   * strided inputs to contiguous ones and strided outputs back. */
  NPUB_KERNEL_CONTIGUOUS_ONLY = 1u << 0,
  /** The kernel is correct when a tensor it writes is the very same view
   * as a tensor it reads (x.add_(x); add(x, y, out=x)), as elementwise
   * kernels are. Without it, the host serves such calls with its fallback.
   * \since 1.3 (hosts before 1.3 ignore the flag and do not check overlap) */
  NPUB_KERNEL_ALIAS_SAFE = 1u << 1
} NpubKernelFlags;

/**
 * Describes one kernel; passed to NpubHostApi.register_kernel.
 * The host copies everything it needs during the call: the struct, its
 * strings and its arrays may be freed when register_kernel returns.
 * \since 1.0
 */
typedef struct NpubKernelDesc {
  size_t struct_size;  /**< sizeof(NpubKernelDesc) as the plugin saw it */
  const char* op_name; /**< qualified op, "ns::name.overload"; must be defined */
  int32_t device_type; /**< NPUB_DEVICE_NPU or NPUB_DEVICE_CPU */
  int32_t priority;    /**< higher wins among capable kernels */
  /** dtypes this kernel accepts for the call's dispatch dtype (the dtype of
   * the first tensor argument); borrowed for the call. 0 entries = any. */
  const DLDataType* dtypes;
  int32_t num_dtypes;
  uint32_t flags;                     /**< NpubKernelFlags */
  NpubKernelFn fn;                    /**< required */
  NpubSupportsFn supports;            /**< optional, may be NULL */
  NpubWorkspaceSizeFn workspace_size; /**< optional, may be NULL */
  /** Passed to fn (through NpubHostApi.kernel_user_data), supports and
   * workspace_size. Owned by the host after a successful registration: it
   * calls `user_data_deleter` (if non-NULL) when the kernel is dropped, before
   * the library is unloaded. On a failed registration the plugin keeps it. */
  void* user_data;
  void (*user_data_deleter)(void* user_data);
  /** Lowest optimisation level (1..3) at which this kernel is eligible; 0 is
   * read as 1. Level 1: basic ops; 2: fused ops; 3: ops that may trade
   * precision for speed. The dispatcher's level 0 disables every plugin. */
  int32_t min_opt_level;
} NpubKernelDesc;

/* ------------------------------------------------------------------------ */
/* Host services                                                             */
/* ------------------------------------------------------------------------ */

/** Body of a parallel_for: processes indices [begin, end). Must not fail. */
typedef void (*NpubParallelBody)(void* user, int64_t begin, int64_t end);

/**
 * Host services, passed to `initialize` and reachable from every kernel via
 * the call context. Host-owned; valid until the plugin is unloaded. All
 * functions are thread-safe unless noted.
 * \since 1.0
 */
typedef struct NpubHostApi {
  size_t struct_size; /**< sizeof(NpubHostApi) as the host built it */
  uint32_t abi_major; /**< the host's NPUB_ABI_MAJOR */
  uint32_t abi_minor; /**< the host's NPUB_ABI_MINOR */

  /* --- errors and logging --- */

  /** Creates an error; `message` is copied. Never returns NULL. */
  NpubError* (*error_create)(int32_t code, const char* message);
  /** Destroys an error the caller owns. */
  void (*error_destroy)(NpubError* error);
  /** Code of an error (borrowed). */
  int32_t (*error_code)(const NpubError* error);
  /** Message of an error; valid while the error lives. */
  const char* (*error_message)(const NpubError* error);
  /** Logs one line through the host's logger; `message` is copied. */
  void (*log)(int32_t level, const char* message);

  /* --- registration: only from inside `initialize`, single-threaded --- */

  /** Defines an op from an ATen-style schema string, e.g.
   * "myns::scale(Tensor self, float factor) -> Tensor". Defining an op that
   * exists with the identical schema is a no-op; a different one is an error. */
  NpubError* (*define_op)(NpubRegistrar* registrar, const char* schema);
  /** Registers a kernel for a defined op. See NpubKernelDesc for ownership. */
  NpubError* (*register_kernel)(NpubRegistrar* registrar, const NpubKernelDesc* desc);

  /* --- inside a kernel call (ctx is the call's context) --- */

  /** The `user_data` the kernel was registered with. */
  void* (*kernel_user_data)(NpubCallContext* ctx);
  /** The device index the call runs on. */
  int32_t (*device_index)(NpubCallContext* ctx);
  /** The stream the call runs on. */
  NpubStream* (*current_stream)(NpubCallContext* ctx);
  /** The workspace sized by workspace_size (NULL when none was asked for). */
  void* (*workspace)(NpubCallContext* ctx, uint64_t* bytes /* out */);
  /**
   * Allocates return `ret_index` as a contiguous tensor of `shape` and
   * `dtype` on the call's device and stores it in rets[ret_index]. For
   * outputs whose shape depends on data. The host owns the tensor; the
   * kernel writes its data. `shape` is copied.
   */
  NpubError* (*alloc_output)(NpubCallContext* ctx, int32_t ret_index, int32_t ndim, const int64_t* shape,
                             DLDataType dtype, DLTensor** out /* out */);
  /** Allocates scratch device memory freed when the call returns. */
  NpubError* (*alloc_scratch)(NpubCallContext* ctx, uint64_t bytes, void** out /* out */);
  /**
   * Runs body over [begin, end) split into chunks of at least `grain`
   * indices on the device's compute threads; the calling thread takes part.
   * Returns when every chunk is done.
   */
  void (*parallel_for)(NpubCallContext* ctx, int64_t begin, int64_t end, int64_t grain, NpubParallelBody body,
                       void* user);
  /** Number of compute threads of the call's device (>= 1). */
  int32_t (*num_threads)(NpubCallContext* ctx);

  /* --- \since 1.1 (check struct_size before use) --- */

  /**
   * Reserves `count` 128-bit counters of the call's generator, a
   * Philox-4x32-10 stream as PyTorch's CUDA generator uses: the generator
   * the caller passed for the op's `Generator?` argument (that argument
   * itself reaches the kernel as none), else the default generator of the
   * call's device. Returns the generator's seed and the first reserved
   * counter (`offset`). The kernel
   * draws counter offset + i for i < count (npubridge/philox.hpp). The same
   * seed and the same sequence of reservations give the same numbers;
   * concurrent calls get disjoint ranges. \since 1.1
   */
  void (*philox_reserve)(NpubCallContext* ctx, uint64_t count, uint64_t* seed /* out */,
                         uint64_t* offset /* out */);

  /* --- \since 1.2 (check struct_size before use) --- */

  /** Registers the meta function of a defined op (one per op). Only from
   * inside `initialize`. \since 1.2 */
  NpubError* (*register_meta)(NpubRegistrar* registrar, const char* op_name, NpubMetaFn fn);
  /** Inside a meta function: return `ret_index` is a tensor of `dtype` and
   * `shape` (copied). \since 1.2 */
  NpubError* (*set_output_meta)(NpubMetaContext* ctx, int32_t ret_index, int32_t ndim, const int64_t* shape,
                                DLDataType dtype);
  /**
   * Declares how to differentiate a defined, functional op through another
   * defined op, in the spirit of PyTorch's derivatives.yaml: a host with
   * autograd (the PyTorch extension) then trains through the op without
   * per-op code. `formula` is
   *
   *     "<inputs>: <backward op>(<argument>, ...)"
   *
   * where <inputs> names the op's Tensor arguments that receive gradients,
   * in the order the backward op returns them, and each <argument> is
   * `grads[i]` (the gradient of return i; `grad` is grads[0]), `results[i]`
   * (return i of the forward call; `result` is results[0]) or the name of a
   * forward argument. Example, for
   * "ns::rms_norm(Tensor self, Tensor gamma, float epsilon) -> (Tensor, Tensor)":
   *
   *     "self, gamma: ns::rms_norm_backward(grads[0], self, gamma, results[1])"
   *
   * Checked at registration (names, indices, argument count and return
   * count against both schemas). Only from inside `initialize`. \since 1.2
   */
  NpubError* (*define_derivative)(NpubRegistrar* registrar, const char* op_name, const char* formula);
} NpubHostApi;

/* ------------------------------------------------------------------------ */
/* The plugin                                                                */
/* ------------------------------------------------------------------------ */

/**
 * What the entry point returns. Plugin-owned, static storage: it must stay
 * valid until the library is unloaded.
 * \since 1.0
 */
typedef struct NpubPluginApi {
  size_t struct_size;  /**< sizeof(NpubPluginApi) as the plugin saw it */
  uint32_t abi_major;  /**< NPUB_ABI_MAJOR the plugin was built with */
  uint32_t abi_minor;  /**< NPUB_ABI_MINOR the plugin was built with */
  const char* name;    /**< unique plugin name, [A-Za-z0-9_]+ */
  const char* version; /**< free-form version string */
  /**
   * Required. Defines ops and registers kernels through `host`. Called once,
   * single-threaded. Returns NULL or an error (ownership moves to the host);
   * on error nothing the plugin registered is kept and it is unloaded.
   */
  NpubError* (*initialize)(const NpubHostApi* host, NpubRegistrar* registrar);
  /** Optional. Called once before the library is unloaded. */
  void (*shutdown)(void);
} NpubPluginApi;

/** Signature of the entry point `npub_plugin_init_v1`. */
typedef const NpubPluginApi* (*NpubPluginInitFn)(void);

/* ------------------------------------------------------------------------ */
/* Frozen sizes                                                              */
/* ------------------------------------------------------------------------ */

/**
 * The size of `type` up to and including `last_field`: what a struct built
 * against the version that ended with that field has (and at least what its
 * `struct_size` says). A reader checks `struct_size` against the size of the
 * version that introduced what it is about to read, never against today's
 * sizeof: when a minor version appends a field, a struct from an older
 * plugin or host is smaller than the new sizeof and still valid.
 */
#define NPUB_STRUCT_SIZE(type, last_field) (offsetof(type, last_field) + sizeof(((type*)0)->last_field))

/** NpubKernelDesc as ABI 1.0 defined it (unchanged through 1.3). */
#define NPUB_KERNEL_DESC_STRUCT_SIZE_1_0 NPUB_STRUCT_SIZE(NpubKernelDesc, min_opt_level)
/** NpubHostApi as each minor version left it. */
#define NPUB_HOST_API_STRUCT_SIZE_1_0 NPUB_STRUCT_SIZE(NpubHostApi, num_threads)
#define NPUB_HOST_API_STRUCT_SIZE_1_1 NPUB_STRUCT_SIZE(NpubHostApi, philox_reserve)
#define NPUB_HOST_API_STRUCT_SIZE_1_2 NPUB_STRUCT_SIZE(NpubHostApi, define_derivative)
/** NpubPluginApi as ABI 1.0 defined it (unchanged through 1.3). */
#define NPUB_PLUGIN_API_STRUCT_SIZE_1_0 NPUB_STRUCT_SIZE(NpubPluginApi, shutdown)

/** What a writer built against this header puts in `struct_size`: the
 * current version's size, without tail padding (a reader must never take
 * padding for a field a later version appended there). */
#define NPUB_KERNEL_DESC_STRUCT_SIZE NPUB_KERNEL_DESC_STRUCT_SIZE_1_0
#define NPUB_HOST_API_STRUCT_SIZE NPUB_HOST_API_STRUCT_SIZE_1_2
#define NPUB_PLUGIN_API_STRUCT_SIZE NPUB_PLUGIN_API_STRUCT_SIZE_1_0

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NPUBRIDGE_PLUGIN_API_H_ */
