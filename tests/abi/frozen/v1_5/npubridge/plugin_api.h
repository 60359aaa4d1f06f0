/* FROZEN copy of plugin_api.h as released in ABI 1.5. Never edit: tests build an
 * "old" plugin against it to prove today's host still loads it. */
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
 *    (tests/unit/test_abi_layout.cpp).
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
#define NPUB_ABI_MINOR 5

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

/**
 * Tag of an NpubValue. Fixed numbers; readers reject unknown tags.
 *
 * How each schema type arrives (the host converts the caller's values):
 *
 *   schema type            tag                      field
 *   Tensor, Tensor(a!)     NPUB_VALUE_TENSOR        u.tensor
 *   Tensor? (None)         NPUB_VALUE_NONE          -
 *   Tensor[], Tensor?[]    NPUB_VALUE_TENSOR_LIST   u.tensors, count (NULL entries: None, Tensor?[] only)
 *   int, SymInt            NPUB_VALUE_INT           u.i
 *   float                  NPUB_VALUE_DOUBLE        u.d (an int literal may arrive as NPUB_VALUE_INT)
 *   bool                   NPUB_VALUE_BOOL          u.i (0 or 1)
 *   Scalar                 NPUB_VALUE_INT, _DOUBLE or _BOOL, as the caller passed it
 *   str                    NPUB_VALUE_STRING        u.s, count = byte length
 *   int[], SymInt[]        NPUB_VALUE_INT_LIST      u.ints, count
 *   float[]                NPUB_VALUE_DOUBLE_LIST   u.doubles, count
 *   ScalarType             NPUB_VALUE_INT           PyTorch's c10::ScalarType number
 *                          (0 uint8, 1 int8, 2 int16, 3 int32, 4 int64, 5 float16, 6 float32,
 *                          7 float64, 11 bool, 15 bfloat16)
 *   Layout, MemoryFormat   NPUB_VALUE_INT           PyTorch's enum numbers
 *   bool[]                 NPUB_VALUE_INT_LIST      u.ints (0 or 1 each), count
 *   Device                 (not passed: the PyTorch extension refuses such a call)
 *   Generator?             NPUB_VALUE_NONE          (see NpubHostApi.philox_reserve)
 *   any optional T? = None NPUB_VALUE_NONE
 *
 * Defaults are filled in by the host: a kernel always receives every
 * argument of the schema.
 */
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
 *
 * What a kernel may assume of a DLTensor it receives (the host checks the
 * first before the call):
 *  - `ndim` is 0..64 and `shape` has `ndim` non-negative sizes whose product
 *    fits int64; a 0-d tensor has one element.
 *  - strides are in elements, may be 0 (expanded) or anything a view makes,
 *    and are never negative from the PyTorch extension. `strides` may be NULL (compact row-major, as
 *    DLPack before 1.2 allowed) only when a C++ host built the DLTensor
 *    itself; the PyTorch extension always sets them. A kernel registered
 *    NPUB_KERNEL_CONTIGUOUS_ONLY sees only contiguous tensors.
 *  - `byte_offset` may be non-zero (views into a larger buffer): the first
 *    element is at `(char*)data + byte_offset`.
 *  - `data + byte_offset` is aligned to the element size for every tensor
 *    the PyTorch extension passes; memory the host allocates (outputs,
 *    scratch, workspace) is aligned to at least 64 bytes.
 *  - `data` is NULL only for a tensor with no elements, and in a meta call
 *    (NpubMetaFn), where no data may be read (it is NULL when PyTorch
 *    traces; the host's own output check passes the kernel's real tensors).
 *  - `device` is {NPUB_DEVICE_NPU, index} for npu kernels (the call's device
 *    for every tensor of the call), {NPUB_DEVICE_CPU, 0} for cpu kernels.
 *  - `dtype` is one of NpubKernelDesc's accepted dtypes for the dispatch
 *    argument, and follows NpubKernelDesc.arg_dtypes for the others.
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
/** One kernel invocation. Host-owned; valid during the kernel call only.
 * On a host of ABI 1.4 or later it begins with an NpubContextHead. */
typedef struct NpubCallContext NpubCallContext;
/** A device stream. Host-owned; valid while the device exists. */
typedef struct NpubStream NpubStream;
/** Opaque: the state of one meta-function call (\since 1.2). On a host of
 * ABI 1.4 or later it begins with an NpubContextHead. */
typedef struct NpubMetaContext NpubMetaContext;

struct NpubHostApi;

/**
 * The public head of every NpubCallContext and NpubMetaContext, so that a
 * kernel or a meta function reaches the host table and its own user data
 * without a global:
 *
 *     const NpubContextHead* head = NPUB_CONTEXT_HEAD(ctx);
 *     head->host->alloc_output(ctx, ...);
 *
 * Only hosts of ABI 1.4 or later put it there: a plugin that reads it checks
 * `host->abi_minor >= 4` in `initialize` (and fails there with a clear error
 * on an older host). Host-owned, valid for the call. \since 1.4
 */
typedef struct NpubContextHead {
  size_t struct_size;             /**< NPUB_CONTEXT_HEAD_STRUCT_SIZE as the host built it */
  const struct NpubHostApi* host; /**< the host table `initialize` received */
  /** A kernel call: the kernel's NpubKernelDesc.user_data. A meta call: the
   * user data given to NpubHostApi.register_meta_with_data (else NULL). */
  void* user_data;
  const char* op_name; /**< the op being called, "ns::name.overload" */
} NpubContextHead;

/** The head of a call or meta context (a host of ABI >= 1.4 only). */
#define NPUB_CONTEXT_HEAD(ctx) ((const NpubContextHead*)(const void*)(ctx))

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
 * kernel selection, after the dtype checks; must be cheap and must not fail.
 * Returns non-zero for yes. Thread safety: called from many threads at once,
 * as kernels are; tensor data may be read but not written.
 */
typedef int32_t (*NpubSupportsFn)(void* user_data, const NpubValue* args, int32_t num_args);

/**
 * Optional workspace query, phase one of a two-phase call (as CANN's
 * aclnnXxxGetWorkspaceSize). The host allocates `*bytes` of device memory and
 * passes it to the kernel through NpubHostApi.workspace. Returns NULL or an
 * error (ownership moves to the host). Thread safety: called from many
 * threads at once, right before the kernel on the same thread.
 */
typedef NpubError* (*NpubWorkspaceSizeFn)(void* user_data, const NpubValue* args, int32_t num_args,
                                          uint64_t* bytes /* out */);

/**
 * A meta (shape) function of an op: computes the dtype and shape of every
 * tensor return from the arguments' metadata alone, without running the
 * kernel. Tensor arguments carry shape, strides, dtype and device; `data`
 * must not be read (it may be NULL, and a meta function must not test it). Declares each tensor return with
 * NpubHostApi.set_output_meta (returns that alias an argument, Tensor(a!),
 * need nothing). Returns NULL, or an error for arguments the kernel would
 * reject, with the kernel's message. PyTorch's fake tensors, torch.compile
 * and torch.export trace a plugin's own ops with it. Thread safety: called
 * from many threads at once, and at any time after `initialize` (also while
 * kernels run). \since 1.2
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
  NPUB_KERNEL_ALIAS_SAFE = 1u << 1,
  /** Every tensor argument may have any dtype: the kernel promotes or
   * checks dtypes itself (binary ops that follow PyTorch's type promotion,
   * `.out` ops whose output dtype differs from the input's). The same as an
   * NpubArgDtypes {"*", NPUB_ARG_DTYPE_ANY}. \since 1.4 */
  NPUB_KERNEL_MIXED_DTYPES = 1u << 2
} NpubKernelFlags;

/**
 * How a kernel constrains the dtype of one tensor argument (Tensor,
 * Tensor?, Tensor[], Tensor(a!) out), beyond the dispatch dtype that
 * NpubKernelDesc.dtypes constrains. Fixed numbers. \since 1.4
 */
typedef enum NpubArgDtypeRule {
  /** The argument has the call's dispatch dtype (the dtype of the first
   * tensor argument). The rule for every argument a kernel does not name,
   * and for every argument of a kernel built before ABI 1.4. */
  NPUB_ARG_DTYPE_DISPATCH = 0,
  /** Any dtype: the kernel checks it itself. */
  NPUB_ARG_DTYPE_ANY = 1,
  /** One of NpubArgDtypes.dtypes. */
  NPUB_ARG_DTYPE_LISTED = 2
} NpubArgDtypeRule;

/**
 * The dtype rule of one tensor argument of a kernel, by the argument's name
 * in the op's schema ("*": every argument not named otherwise). Every
 * tensor of a Tensor[] argument follows the rule; a None Tensor? is not
 * checked. A call whose arguments break a kernel's rules is not served by
 * that kernel (another kernel, the dtype conversion or the fallback
 * serves it), so no argument reaches a kernel in a dtype it did not
 * declare. (A return the caller preallocated is the kernel's to check; the
 * SDK's Call::output does.) A "*" rule covers the dispatch argument too.
 * A host before ABI 1.4 reads no rules (the SDK then refuses to register a
 * kernel with a rule other than NPUB_ARG_DTYPE_ANY).
 * Layout frozen at 1.4 (a later version adds a new array, never a field).
 * \since 1.4
 */
typedef struct NpubArgDtypes {
  const char* arg;          /**< a tensor argument's schema name, or "*" */
  int32_t rule;             /**< an NpubArgDtypeRule */
  int32_t num_dtypes;       /**< NPUB_ARG_DTYPE_LISTED: entries of `dtypes` (>= 1) */
  const DLDataType* dtypes; /**< NPUB_ARG_DTYPE_LISTED: the accepted dtypes */
} NpubArgDtypes;

/**
 * Describes one kernel; passed to NpubHostApi.register_kernel.
 * The host copies everything it needs during the call: the struct, its
 * strings and its arrays may be freed when register_kernel returns.
 * Zero the whole struct before filling it (`NpubKernelDesc d = {0};` or
 * memset) and set `struct_size = NPUB_KERNEL_DESC_STRUCT_SIZE`: a field
 * this header appends since you last built then reads as absent, not as
 * stack garbage.
 * \since 1.0
 */
typedef struct NpubKernelDesc {
  size_t struct_size;  /**< NPUB_KERNEL_DESC_STRUCT_SIZE as the plugin saw it */
  const char* op_name; /**< qualified op, "ns::name.overload"; must be defined */
  int32_t device_type; /**< NPUB_DEVICE_NPU or NPUB_DEVICE_CPU */
  int32_t priority;    /**< higher wins among capable kernels */
  /** dtypes this kernel accepts for the call's dispatch dtype (the dtype of
   * the first tensor argument); borrowed for the call. 0 entries = any.
   * Every other tensor argument must have the dispatch dtype too, unless
   * `arg_dtypes` or NPUB_KERNEL_MIXED_DTYPES say otherwise (\since 1.4; a
   * 1.3 host checked the first tensor argument only). */
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

  /* --- \since 1.4 (a host reads these only when struct_size covers them) --- */

  /** Per-argument dtype rules (see NpubArgDtypes); borrowed for the call.
   * NULL with 0 entries: every tensor argument has the dispatch dtype.
   * Checked at registration: each name must be a tensor argument of the
   * op's schema (or "*"), named once, with a known rule. \since 1.4 */
  const NpubArgDtypes* arg_dtypes;
  int32_t num_arg_dtypes;
} NpubKernelDesc;

/* ------------------------------------------------------------------------ */
/* Host services                                                             */
/* ------------------------------------------------------------------------ */

/** Body of a parallel_for: processes indices [begin, end). Must not fail.
 * Runs on several threads at once (the caller's and the device's compute
 * threads), each on a disjoint range; it must not call parallel_for. */
typedef void (*NpubParallelBody)(void* user, int64_t begin, int64_t end);

/**
 * Host services, passed to `initialize`. Host-owned; valid until the plugin
 * is unloaded. A kernel or meta function reaches the table through its
 * context's head (NPUB_CONTEXT_HEAD(ctx)->host, \since 1.4), or through a
 * copy the plugin kept in `initialize` (the only way on hosts before 1.4).
 * All functions are thread-safe unless noted.
 * \since 1.0
 */
typedef struct NpubHostApi {
  size_t struct_size; /**< NPUB_HOST_API_STRUCT_SIZE as the host built it */
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
  /** Allocates scratch device memory freed when the call returns. Like
   * alloc_output, call it from the kernel's own thread, not from
   * parallel_for bodies (the call's context is not locked). */
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

  /* --- \since 1.4 (check struct_size before use) --- */

  /** As register_meta, with `user_data` that the meta function reads from
   * NPUB_CONTEXT_HEAD(ctx)->user_data. The plugin owns it; it must stay
   * valid until the plugin's `shutdown`. \since 1.4 */
  NpubError* (*register_meta_with_data)(NpubRegistrar* registrar, const char* op_name, NpubMetaFn fn,
                                        void* user_data);

  /* --- \since 1.5 (check struct_size before use) --- */

  /**
   * Contributes fusion patterns: subgraphs a graph compiler (npubridge's
   * torch.compile backend) rewrites to one of the plugin's fused ops. `text`
   * holds one or more blocks (copied; the format is in docs/graph-mode.md,
   * "Fusion patterns"):
   *
   *     pattern swiglu priority 10
   *       %s = aten::silu(%a)
   *       %y = aten::mul.Tensor(%s, %b)
   *       => ns::fused_swiglu(%a, %b)
   *     end
   *
   * Checked at once: the syntax, and every op of the replacement, which must
   * be defined (by this plugin before the call, or already) and given an
   * argument count its schema takes. Staged with the plugin's other
   * registrations: a bad pattern rejects the plugin, with a message naming
   * the pattern and its line. A graph compiler applies a pattern only where
   * the replacement op has a kernel for the call and its meta function agrees
   * with the matched output. Only from inside `initialize`. \since 1.5
   */
  NpubError* (*register_fusion_pattern)(NpubRegistrar* registrar, const char* text);
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
  size_t struct_size;  /**< NPUB_PLUGIN_API_STRUCT_SIZE as the plugin saw it */
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

/** NpubKernelDesc as ABI 1.0 defined it (unchanged through 1.3), and 1.4. */
#define NPUB_KERNEL_DESC_STRUCT_SIZE_1_0 NPUB_STRUCT_SIZE(NpubKernelDesc, min_opt_level)
#define NPUB_KERNEL_DESC_STRUCT_SIZE_1_4 NPUB_STRUCT_SIZE(NpubKernelDesc, num_arg_dtypes)
/** NpubHostApi as each minor version left it. */
#define NPUB_HOST_API_STRUCT_SIZE_1_0 NPUB_STRUCT_SIZE(NpubHostApi, num_threads)
#define NPUB_HOST_API_STRUCT_SIZE_1_1 NPUB_STRUCT_SIZE(NpubHostApi, philox_reserve)
#define NPUB_HOST_API_STRUCT_SIZE_1_2 NPUB_STRUCT_SIZE(NpubHostApi, define_derivative)
#define NPUB_HOST_API_STRUCT_SIZE_1_4 NPUB_STRUCT_SIZE(NpubHostApi, register_meta_with_data)
#define NPUB_HOST_API_STRUCT_SIZE_1_5 NPUB_STRUCT_SIZE(NpubHostApi, register_fusion_pattern)
/** NpubContextHead as ABI 1.4 defined it. */
#define NPUB_CONTEXT_HEAD_STRUCT_SIZE_1_4 NPUB_STRUCT_SIZE(NpubContextHead, op_name)
/** NpubPluginApi as ABI 1.0 defined it (unchanged through 1.3). */
#define NPUB_PLUGIN_API_STRUCT_SIZE_1_0 NPUB_STRUCT_SIZE(NpubPluginApi, shutdown)

/** What a writer built against this header puts in `struct_size`: the
 * current version's size, without tail padding (a reader must never take
 * padding for a field a later version appended there). */
#define NPUB_KERNEL_DESC_STRUCT_SIZE NPUB_KERNEL_DESC_STRUCT_SIZE_1_4
#define NPUB_HOST_API_STRUCT_SIZE NPUB_HOST_API_STRUCT_SIZE_1_5
#define NPUB_CONTEXT_HEAD_STRUCT_SIZE NPUB_CONTEXT_HEAD_STRUCT_SIZE_1_4
#define NPUB_PLUGIN_API_STRUCT_SIZE NPUB_PLUGIN_API_STRUCT_SIZE_1_0

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NPUBRIDGE_PLUGIN_API_H_ */
