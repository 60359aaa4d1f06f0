#include "host_api.h"

#include <npubridge/dispatcher/tensor.h>
#include <npubridge/registry/derivative_formula.h>
#include <npubridge/support/dtype.h>
#include <npubridge/support/error.h>
#include "logging.h"

#include <cstring>

namespace npub {

namespace {

NpubError* make_error(int32_t code, std::string message) { return new NpubError{code, std::move(message)}; }

NpubError* error_create(int32_t code, const char* message) {
  return make_error(code, message != nullptr ? message : "(no message)");
}
void error_destroy(NpubError* e) { delete e; }
int32_t error_code(const NpubError* e) { return e != nullptr ? e->code : 0; }
const char* error_message(const NpubError* e) { return e != nullptr ? e->message.c_str() : ""; }

void log_message(int32_t level, const char* message) {
  const char* m = message != nullptr ? message : "";
  switch (level) {
    case NPUB_LOG_TRACE:
      log().trace("{}", m);
      break;
    case NPUB_LOG_DEBUG:
      log().debug("{}", m);
      break;
    case NPUB_LOG_INFO:
      log().info("{}", m);
      break;
    case NPUB_LOG_WARN:
      log().warn("{}", m);
      break;
    default:
      log().error("{}", m);
      break;
  }
}

// Fails the registration: the error goes back to the plugin and is also
// kept, so that a plugin ignoring it is rejected all the same.
NpubError* registration_error(NpubRegistrar* r, std::string message) {
  if (r->first_error.empty()) r->first_error = message;
  return make_error(NPUB_ERR_INVALID_ARGUMENT, std::move(message));
}

const reg::Schema* staged_or_registered_schema(NpubRegistrar* r, const std::string& op) {
  if (const reg::OpEntry* e = r->registry->find(op)) return &e->schema();
  for (const auto& s : r->schemas)
    if (s.qualified_name() == op) return &s;
  return nullptr;
}

bool staged_or_registered(NpubRegistrar* r, const std::string& op) {
  return staged_or_registered_schema(r, op) != nullptr;
}

NpubError* define_op(NpubRegistrar* r, const char* schema_text) {
  if (r == nullptr) return make_error(NPUB_ERR_INVALID_ARGUMENT, "define_op: registrar is NULL");
  if (!r->open)
    return registration_error(r,
                              "define_op called after initialize returned; ops can only be "
                              "defined during initialize");
  if (schema_text == nullptr) return registration_error(r, "define_op: schema string is NULL");
  reg::Schema schema;
  try {
    schema = reg::parse_schema(schema_text);
  } catch (const reg::SchemaError& e) {
    return registration_error(r, std::string("define_op: ") + e.what());
  }
  const std::string name = schema.qualified_name();
  const std::string text = schema.to_string();
  const reg::OpEntry* existing = r->registry->find(name);
  if (existing != nullptr && existing->schema().to_string() != text)
    return registration_error(r, "define_op: op '" + name + "' is already defined (by " +
                                     existing->defined_by() + ") with a different schema: existing \"" +
                                     existing->schema().to_string() + "\", new \"" + text + "\"");
  for (const auto& s : r->schemas)
    if (s.qualified_name() == name) {
      if (s.to_string() != text)
        return registration_error(r, "define_op: op '" + name + "' defined twice with different schemas: \"" +
                                         s.to_string() + "\" and \"" + text + "\"");
      return nullptr;
    }
  if (existing == nullptr) r->schemas.push_back(std::move(schema));
  return nullptr;
}

// Note [Per-argument dtypes]: resolves a kernel's NpubKernelDesc.arg_dtypes
// (ABI 1.4) and NPUB_KERNEL_MIXED_DTYPES to one rule per schema argument.
NpubError* read_arg_dtypes(NpubRegistrar* r, const NpubKernelDesc& desc, const std::string& op,
                           reg::Kernel& k) {
  const reg::Schema& schema = *staged_or_registered_schema(r, op);
  const auto& sargs = schema.arguments;
  const std::string where = "register_kernel for op '" + op + "'";
  const bool has_rules = desc.struct_size >= NPUB_KERNEL_DESC_STRUCT_SIZE_1_4 && desc.num_arg_dtypes != 0;
  if ((desc.flags & NPUB_KERNEL_MIXED_DTYPES) != 0) {
    if (has_rules)
      return registration_error(r, where +
                                       ": NPUB_KERNEL_MIXED_DTYPES already lets every argument have "
                                       "any dtype; give arg_dtypes or the flag, not both");
    k.arg_rules.assign(sargs.size(), reg::ArgDtypeRule{reg::ArgDtypeRule::kAny, 0});
    k.any_arg_dtypes = true;
    return nullptr;
  }
  if (!has_rules) return nullptr;
  if (desc.num_arg_dtypes < 0 || desc.arg_dtypes == nullptr)
    return registration_error(
        r, where + ": arg_dtypes is NULL with num_arg_dtypes " + std::to_string(desc.num_arg_dtypes));
  std::vector<reg::ArgDtypeRule> rules(sargs.size());
  std::vector<bool> named(sargs.size(), false);
  const reg::ArgDtypeRule* star = nullptr;
  reg::ArgDtypeRule star_rule;
  for (int32_t i = 0; i < desc.num_arg_dtypes; ++i) {
    const NpubArgDtypes& a = desc.arg_dtypes[i];
    const std::string name = a.arg != nullptr ? a.arg : "";
    const std::string what = where + ", arg_dtypes[" + std::to_string(i) + "] ('" + name + "')";
    reg::ArgDtypeRule rule;
    switch (a.rule) {
      case NPUB_ARG_DTYPE_DISPATCH:
      case NPUB_ARG_DTYPE_ANY:
        rule.kind = a.rule == NPUB_ARG_DTYPE_ANY ? reg::ArgDtypeRule::kAny : reg::ArgDtypeRule::kDispatch;
        if (a.num_dtypes != 0)
          return registration_error(r, what + ": dtypes are given for rule " + std::to_string(a.rule) +
                                           ", which takes none (NPUB_ARG_DTYPE_LISTED does)");
        break;
      case NPUB_ARG_DTYPE_LISTED:
        rule.kind = reg::ArgDtypeRule::kListed;
        if (a.num_dtypes <= 0 || a.dtypes == nullptr)
          return registration_error(r, what + ": NPUB_ARG_DTYPE_LISTED needs at least one dtype but found " +
                                           std::to_string(a.num_dtypes));
        for (int32_t d = 0; d < a.num_dtypes; ++d) {
          const DType t = dtype_of(a.dtypes[d]);
          if (t == DType::kUnknown)
            return registration_error(r, what + ": unsupported dtype " + dtype_name(a.dtypes[d]));
          rule.mask |= 1u << static_cast<int>(t);
        }
        break;
      default:
        return registration_error(r, what + ": unknown rule " + std::to_string(a.rule) +
                                         " (expected NPUB_ARG_DTYPE_DISPATCH, _ANY or _LISTED)");
    }
    if (name == "*") {
      if (star != nullptr) return registration_error(r, what + ": '*' is given twice");
      star_rule = rule;
      star = &star_rule;
      continue;
    }
    size_t index = 0;
    while (index < sargs.size() && sargs[index].name != name) ++index;
    if (index == sargs.size()) {
      std::string names;
      for (const auto& sa : sargs)
        if (sa.type.base == reg::BaseType::kTensor) names += (names.empty() ? "" : ", ") + sa.name;
      return registration_error(r, what + ": no argument of that name (the op's tensor arguments: " +
                                       (names.empty() ? "none" : names) + ")");
    }
    if (sargs[index].type.base != reg::BaseType::kTensor)
      return registration_error(
          r, what + ": the argument is " + reg::type_to_string(sargs[index].type) + ", not a tensor");
    if (named[index]) return registration_error(r, what + ": the argument is named twice");
    named[index] = true;
    rules[index] = rule;
  }
  bool all_any = true, listed = false;
  for (size_t i = 0; i < rules.size(); ++i) {
    if (!named[i] && star != nullptr) rules[i] = *star;
    if (sargs[i].type.base != reg::BaseType::kTensor) continue;
    all_any = all_any && rules[i].kind == reg::ArgDtypeRule::kAny;
    listed = listed || rules[i].kind == reg::ArgDtypeRule::kListed;
  }
  k.arg_rules = std::move(rules);
  k.any_arg_dtypes = all_any;
  k.has_listed_arg_dtypes = listed;
  return nullptr;
}

NpubError* register_kernel(NpubRegistrar* r, const NpubKernelDesc* desc) {
  if (r == nullptr) return make_error(NPUB_ERR_INVALID_ARGUMENT, "register_kernel: registrar is NULL");
  if (!r->open)
    return registration_error(r,
                              "register_kernel called after initialize returned; kernels can "
                              "only be registered during initialize");
  if (desc == nullptr) return registration_error(r, "register_kernel: kernel description is NULL");
  // Compared with the frozen 1.0 size, not today's sizeof: a plugin built
  // before a minor version appended a field stays valid.
  constexpr size_t kV1Size = NPUB_KERNEL_DESC_STRUCT_SIZE_1_0;
  if (desc->struct_size < kV1Size)
    return registration_error(r, "register_kernel: NpubKernelDesc.struct_size is " +
                                     std::to_string(desc->struct_size) + " but ABI 1.0 requires at least " +
                                     std::to_string(kV1Size) +
                                     " (struct too small: built against a broken or foreign header?)");
  if (desc->op_name == nullptr) return registration_error(r, "register_kernel: op_name is NULL");
  const std::string op = desc->op_name;
  if (desc->fn == nullptr)
    return registration_error(
        r, "register_kernel for op '" + op + "': required function NpubKernelDesc.fn is NULL");
  if (!staged_or_registered(r, op))
    return registration_error(
        r, "register_kernel: op '" + op + "' is not defined; define its schema with define_op first");
  if (desc->device_type != NPUB_DEVICE_NPU && desc->device_type != NPUB_DEVICE_CPU)
    return registration_error(r, "register_kernel for op '" + op + "': expected device_type " +
                                     std::to_string(NPUB_DEVICE_NPU) + " (npu) or " +
                                     std::to_string(NPUB_DEVICE_CPU) + " (cpu) but found " +
                                     std::to_string(desc->device_type));
  if (desc->num_dtypes < 0 || (desc->num_dtypes > 0 && desc->dtypes == nullptr))
    return registration_error(r, "register_kernel for op '" + op + "': dtypes is NULL with num_dtypes " +
                                     std::to_string(desc->num_dtypes));
  if (desc->min_opt_level < 0 || desc->min_opt_level > 3)
    return registration_error(r, "register_kernel for op '" + op +
                                     "': expected min_opt_level 0..3 but found " +
                                     std::to_string(desc->min_opt_level));
  uint32_t mask = 0;
  for (int32_t i = 0; i < desc->num_dtypes; ++i) {
    DType t = dtype_of(desc->dtypes[i]);
    if (t == DType::kUnknown)
      return registration_error(
          r, "register_kernel for op '" + op + "': unsupported dtype " + dtype_name(desc->dtypes[i]));
    mask |= 1u << static_cast<int>(t);
  }
  auto k = std::make_unique<reg::Kernel>();
  if (NpubError* e = read_arg_dtypes(r, *desc, op, *k)) return e;
  k->plugin = r->plugin;
  k->device_type = desc->device_type;
  k->priority = desc->priority;
  k->dtype_mask = mask;
  k->flags = desc->flags;
  k->min_opt_level = desc->min_opt_level == 0 ? 1 : desc->min_opt_level;
  k->fn = desc->fn;
  k->supports = desc->supports;
  k->workspace_size = desc->workspace_size;
  if (desc->struct_size >= NPUB_KERNEL_DESC_STRUCT_SIZE_1_6) k->meta = desc->meta;
  // Ambiguity against registered and staged kernels (same rule as Registry::add_kernel).
  auto clash = [&](const reg::Kernel& other) {
    const bool overlap = other.dtype_mask == 0 || mask == 0 || (other.dtype_mask & mask) != 0;
    return other.device_type == k->device_type && other.priority == k->priority && overlap;
  };
  if (const reg::OpEntry* e = r->registry->find(op)) {
    for (const reg::Kernel* other : e->kernels(k->device_type))
      if (clash(*other))
        return registration_error(r, "register_kernel: duplicate kernel for op '" + op + "' at priority " +
                                         std::to_string(k->priority) + ": plugin '" + other->plugin_name() +
                                         "' already registered one for dtypes {" + other->dtypes_string() +
                                         "}");
  }
  for (size_t i = 0; i < r->kernels.size(); ++i)
    if (r->kernel_ops[i] == op && clash(*r->kernels[i]))
      return registration_error(r, "register_kernel: duplicate kernel for op '" + op + "' at priority " +
                                       std::to_string(k->priority) + " registered twice by this plugin");
  // Ownership of user_data moves to the host only now, on success.
  k->user_data = desc->user_data;
  k->user_data_deleter = desc->user_data_deleter;
  r->kernels.push_back(std::move(k));
  r->kernel_ops.push_back(op);
  return nullptr;
}

NpubError* register_meta_with_data(NpubRegistrar* r, const char* op_name, NpubMetaFn fn, void* user_data) {
  if (r == nullptr) return make_error(NPUB_ERR_INVALID_ARGUMENT, "register_meta: registrar is NULL");
  if (!r->open) return registration_error(r, "register_meta called after initialize returned");
  if (op_name == nullptr) return registration_error(r, "register_meta: op_name is NULL");
  const std::string op = op_name;
  if (fn == nullptr)
    return registration_error(r, "register_meta for op '" + op + "': the meta function is NULL");
  if (!staged_or_registered(r, op))
    return registration_error(
        r, "register_meta: op '" + op + "' is not defined; define its schema with define_op first");
  if (const reg::OpEntry* e = r->registry->find(op); e != nullptr && e->meta() != nullptr)
    return registration_error(r, "register_meta: op '" + op + "' already has a meta function (from plugin '" +
                                     e->meta()->plugin->name + "')");
  for (const auto& m : r->metas)
    if (m.first == op)
      return registration_error(r, "register_meta: op '" + op + "' given two meta functions by this plugin");
  reg::MetaFunction meta;
  meta.fn = fn;
  meta.user_data = user_data;
  r->metas.emplace_back(op, std::move(meta));
  return nullptr;
}

NpubError* register_meta(NpubRegistrar* r, const char* op_name, NpubMetaFn fn) {
  return register_meta_with_data(r, op_name, fn, nullptr);
}

NpubError* set_output_meta(NpubMetaContext* ctx, int32_t ret_index, int32_t ndim, const int64_t* shape,
                           DLDataType dtype) {
  if (ctx == nullptr) return make_error(NPUB_ERR_INVALID_ARGUMENT, "set_output_meta: context is NULL");
  const auto& returns = ctx->op->schema().returns;
  const std::string where = "set_output_meta for op '" + ctx->op->name() + "'";
  if (ret_index < 0 || ret_index >= static_cast<int32_t>(returns.size()))
    return make_error(NPUB_ERR_INVALID_ARGUMENT, where + ": return index " + std::to_string(ret_index) +
                                                     " out of range (the op has " +
                                                     std::to_string(returns.size()) + " returns)");
  const reg::Argument& ret = returns[static_cast<size_t>(ret_index)];
  if (ret.type.base != reg::BaseType::kTensor || ret.type.list)
    return make_error(NPUB_ERR_INVALID_ARGUMENT, where + ": return " + std::to_string(ret_index) + " is " +
                                                     reg::type_to_string(ret.type) + ", not a Tensor");
  if (ctx->op->return_alias()[static_cast<size_t>(ret_index)] >= 0)
    return make_error(NPUB_ERR_INVALID_ARGUMENT, where + ": return " + std::to_string(ret_index) +
                                                     " aliases an argument; its metadata is the argument's");
  if (ndim < 0 || ndim > 64 || (ndim > 0 && shape == nullptr))
    return make_error(NPUB_ERR_INVALID_ARGUMENT,
                      where + ": expected ndim 0..64 with a shape but found ndim " + std::to_string(ndim));
  for (int32_t d = 0; d < ndim; ++d)
    if (shape[d] < 0)
      return make_error(NPUB_ERR_INVALID_ARGUMENT, where + ": negative size " + std::to_string(shape[d]) +
                                                       " at dim " + std::to_string(d));
  const DType t = dtype_of(dtype);
  if (t == DType::kUnknown)
    return make_error(NPUB_ERR_INVALID_ARGUMENT, where + ": unsupported dtype " + dtype_name(dtype));
  OutputMeta& out = (*ctx->outputs)[static_cast<size_t>(ret_index)];
  out.set = true;
  out.dtype = t;
  out.shape.assign(shape, shape + ndim);
  return nullptr;
}

// Checks and stages a derivative formula (NpubHostApi.define_derivative);
// registry/src/derivative_formula.cpp parses it.
NpubError* define_derivative(NpubRegistrar* r, const char* op_name, const char* formula) {
  if (r == nullptr) return make_error(NPUB_ERR_INVALID_ARGUMENT, "define_derivative: registrar is NULL");
  if (!r->open) return registration_error(r, "define_derivative called after initialize returned");
  if (op_name == nullptr || formula == nullptr)
    return registration_error(r, "define_derivative: op_name or formula is NULL");
  const std::string op = op_name, text = formula;
  const std::string where = "define_derivative for op '" + op + "' (\"" + text + "\")";
  const reg::Schema* fwd = staged_or_registered_schema(r, op);
  if (fwd == nullptr)
    return registration_error(r, where + ": op '" + op + "' is not defined; define its schema first");
  for (const auto& d : r->derivatives)
    if (d.first == op)
      return registration_error(r, where + ": the op already has a derivative from this plugin");
  if (const reg::OpEntry* e = r->registry->find(op); e != nullptr && e->derivative() != nullptr)
    return registration_error(
        r, where + ": the op already has a derivative (from plugin '" + e->derivative()->plugin + "')");
  try {
    reg::Derivative d = reg::parse_derivative_formula(
        op, *fwd, text, [&](const std::string& name) { return staged_or_registered_schema(r, name); });
    d.plugin = r->plugin ? r->plugin->name : "host";
    r->derivatives.emplace_back(op, std::move(d));
  } catch (const reg::DerivativeFormulaError& e) {
    return registration_error(r, where + ": " + e.what());
  }
  return nullptr;
}

// Parses and checks fusion patterns (NpubHostApi.register_fusion_pattern,
// ABI 1.5); they are staged and committed with the rest of the plugin.
NpubError* register_fusion_pattern(NpubRegistrar* r, const char* text) {
  if (r == nullptr)
    return make_error(NPUB_ERR_INVALID_ARGUMENT, "register_fusion_pattern: registrar is NULL");
  if (!r->open) return registration_error(r, "register_fusion_pattern called after initialize returned");
  if (text == nullptr) return registration_error(r, "register_fusion_pattern: text is NULL");
  const std::string origin =
      "register_fusion_pattern (plugin '" + (r->plugin ? r->plugin->name : std::string("host")) + "')";
  try {
    std::vector<reg::FusionPattern> parsed = reg::parse_fusion_patterns(text, origin);
    for (auto& p : parsed) {
      reg::check_fusion_pattern(p, origin,
                                [&](const std::string& op) { return staged_or_registered_schema(r, op); });
      for (const auto& q : r->fusion_patterns)
        if (q.name == p.name)
          throw reg::FusionPatternError(origin + ", line " + std::to_string(p.line) + ", pattern '" + p.name +
                                        "': the plugin registers a pattern of this name twice");
      p.plugin = r->plugin ? r->plugin->name : "";
    }
    for (auto& p : parsed) r->fusion_patterns.push_back(std::move(p));
  } catch (const reg::FusionPatternError& e) {
    return registration_error(r, e.what());
  }
  return nullptr;
}

void* kernel_user_data(NpubCallContext* ctx) { return ctx->kernel->user_data; }
int32_t device_index(NpubCallContext* ctx) { return ctx->dl_device.device_id; }
NpubStream* current_stream(NpubCallContext* ctx) { return reinterpret_cast<NpubStream*>(ctx->stream); }
void* workspace(NpubCallContext* ctx, uint64_t* bytes) {
  if (bytes != nullptr) *bytes = ctx->workspace_bytes;
  return ctx->workspace;
}

NpubError* alloc_output(NpubCallContext* ctx, int32_t ret_index, int32_t ndim, const int64_t* shape,
                        DLDataType dtype, DLTensor** out) {
  if (out == nullptr) return make_error(NPUB_ERR_INVALID_ARGUMENT, "alloc_output: out is NULL");
  *out = nullptr;
  if (ret_index < 0 || ret_index >= ctx->num_rets)
    return make_error(NPUB_ERR_INVALID_ARGUMENT, "alloc_output: return index " + std::to_string(ret_index) +
                                                     " out of range (the op has " +
                                                     std::to_string(ctx->num_rets) + " returns)");
  if (ctx->rets[ret_index].tag != NPUB_VALUE_NONE)
    return make_error(NPUB_ERR_INVALID_ARGUMENT, "alloc_output: return " + std::to_string(ret_index) +
                                                     " is already set (preallocated by the caller)");
  if (ndim < 0 || ndim > 64 || (ndim > 0 && shape == nullptr))
    return make_error(
        NPUB_ERR_INVALID_ARGUMENT,
        "alloc_output: expected ndim 0..64 with a shape but found ndim " + std::to_string(ndim));
  const DType t = dtype_of(dtype);
  if (t == DType::kUnknown)
    return make_error(NPUB_ERR_INVALID_ARGUMENT, "alloc_output: unsupported dtype " + dtype_name(dtype));
  if (ctx->outputs == nullptr)
    return make_error(
        NPUB_ERR_UNSUPPORTED,
        "alloc_output: the caller passed no output allocator for return " + std::to_string(ret_index));
  try {
    checked_numel(shape, ndim, element_size(t), "alloc_output: return " + std::to_string(ret_index));
    DLTensor* d = ctx->outputs->allocate(ret_index, ctx->dl_device, ndim, shape, dtype);
    ctx->rets[ret_index].tag = NPUB_VALUE_TENSOR;
    ctx->rets[ret_index].count = 0;
    ctx->rets[ret_index].u.tensor = d;
    *out = d;
    return nullptr;
  } catch (const Error& e) {
    return make_error(static_cast<int32_t>(e.code()), e.what());
  } catch (const std::exception& e) {
    return make_error(NPUB_ERR_INTERNAL, std::string("alloc_output: ") + e.what());
  }
}

NpubError* alloc_scratch(NpubCallContext* ctx, uint64_t bytes, void** out) {
  if (out == nullptr) return make_error(NPUB_ERR_INVALID_ARGUMENT, "alloc_scratch: out is NULL");
  try {
    *out = ctx->device->allocate(bytes);
    if (*out != nullptr) ctx->scratch.push_back(*out);
    return nullptr;
  } catch (const Error& e) {
    return make_error(static_cast<int32_t>(e.code()), e.what());
  }
}

void parallel_for(NpubCallContext* ctx, int64_t begin, int64_t end, int64_t grain, NpubParallelBody body,
                  void* user) {
  ctx->device->compute().parallel_for(begin, end, grain, body, user);
}

int32_t num_threads(NpubCallContext* ctx) { return ctx->device->compute().num_threads(); }

void philox_reserve(NpubCallContext* ctx, uint64_t count, uint64_t* seed, uint64_t* offset) {
  sim::Generator& g = ctx->generator != nullptr ? *ctx->generator : ctx->device->generator();
  const sim::Generator::State s = g.reserve(count);
  if (seed != nullptr) *seed = s.seed;
  if (offset != nullptr) *offset = s.offset;
}

const NpubHostApi kHostApi = {
    NPUB_HOST_API_STRUCT_SIZE,
    NPUB_ABI_MAJOR,
    NPUB_ABI_MINOR,
    &error_create,
    &error_destroy,
    &error_code,
    &error_message,
    &log_message,
    &define_op,
    &register_kernel,
    &kernel_user_data,
    &device_index,
    &current_stream,
    &workspace,
    &alloc_output,
    &alloc_scratch,
    &parallel_for,
    &num_threads,
    &philox_reserve,  // \since 1.1
    &register_meta,
    &set_output_meta,
    &define_derivative,        // \since 1.2
    &register_meta_with_data,  // \since 1.4
    &register_fusion_pattern,  // \since 1.5
};

}  // namespace

const NpubHostApi* host_api() { return &kHostApi; }

std::string consume_error(NpubError* e, int32_t* code) {
  if (e == nullptr) return {};
  std::unique_ptr<NpubError> owned(e);
  if (code != nullptr) *code = owned->code;
  return owned->message;
}

}  // namespace npub
