#include "control_api.h"

#include "aot_call.h"

#include <npubridge/dispatcher/error_bound.h>
#include <npubridge/dispatcher/runtime.h>
#include <npubridge/support/dtype.h>
#include <npubridge/support/error.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>

namespace {

thread_local std::string t_last_error;
// The last failed AOT call's message, process-wide: MindSpore runs AOT
// kernels on threads of its own, not the one that asks.
std::mutex g_call_error_mu;
std::string g_call_error;

// Runs `f`, turning any exception into -1 and this thread's last error.
template <typename F>
int guarded(F&& f) {
  try {
    t_last_error.clear();
    return f();
  } catch (const std::exception& e) {
    t_last_error = e.what();
  } catch (...) {
    t_last_error = "npubridge.mindspore: unknown error";
  }
  return -1;
}

void write(const std::string& s, char* out, int out_len) {
  if (out == nullptr || out_len <= 0) return;
  const size_t n = std::min(s.size(), static_cast<size_t>(out_len - 1));
  std::memcpy(out, s.data(), n);
  out[n] = '\0';
}

int write_all(const std::string& s, char* out, int out_len) {
  write(s, out, out_len);
  return static_cast<int>(s.size()) + 1;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

npub::Dispatcher& dispatcher() { return npub::Runtime::global().dispatcher(); }

}  // namespace

extern "C" {

int npub_ms_aot_call(int slot, int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) {
  const int rc = guarded([&] {
    npub::ms::run_slot(
        slot, {.nparam = nparam, .data = params, .ndims = ndims, .shapes = shapes, .dtypes = dtypes});
    return 0;
  });
  if (rc == 0) return 0;
  std::fprintf(stderr, "%s\n", t_last_error.c_str());
  std::lock_guard<std::mutex> lock(g_call_error_mu);
  g_call_error = t_last_error;
  return 1;
}

const char* npub_ms_last_error(void) { return t_last_error.c_str(); }

int npub_ms_last_call_error(char* out, int out_len) {
  std::lock_guard<std::mutex> lock(g_call_error_mu);
  return write_all(g_call_error, out, out_len);
}

int npub_ms_check_layout(const char* op, const char* layout, const char* outputs) {
  return guarded([&] {
    npub::ms::check_binding(dispatcher(), op, layout, outputs);
    return 0;
  });
}

int npub_ms_start(void) {
  return guarded([] {
    npub::Runtime::global();
    return 0;
  });
}

int npub_ms_bind(const char* op, const char* layout, const char* outputs) {
  return guarded([&] { return npub::ms::bind_slot(dispatcher(), op, layout, outputs); });
}

int npub_ms_plan(int slot, int nparam, const int* ndims, int64_t* const* shapes, const char* const* dtypes,
                 const double* scalars, char* plugin, int plugin_len, char* conversion, int conversion_len,
                 char* reason, int reason_len) {
  return guarded([&] {
    const npub::ms::AotParams p{
        .nparam = nparam, .ndims = ndims, .shapes = shapes, .dtypes = dtypes, .scalars = scalars};
    std::string who, how, why;
    const bool served = npub::ms::plan_slot(slot, p, who, how, why);
    write(who, plugin, plugin_len);
    write(how, conversion, conversion_len);
    write(why, reason, reason_len);
    return served ? 1 : 0;
  });
}

int npub_ms_judge(const char* dtype, int64_t numel, const double* got, const double* reference,
                  const double* host, double* worst) {
  return guarded([&] {
    const npub::DType d = npub::dtype_from_name(dtype);
    if (npub::numerics::precision_bits(d) == 0)
      throw npub::Error(
          npub::ErrorCode::kInvalidArgument,
          std::string("npubridge.mindspore: judge: expected a floating dtype, found '") + dtype + "'");
    npub::numerics::Comparison c;
    c.got = got;
    c.reference = reference;
    c.host = host;
    c.numel = numel;
    c.dtype = d;
    const npub::numerics::Verdict v = npub::numerics::compare(npub::numerics::error_model(""), c);
    const double fields[] = {static_cast<double>(v.worst_index), v.got, v.reference, v.error, v.bound,
                             static_cast<double>(v.mismatched)};
    std::copy(std::begin(fields), std::end(fields), worst);
    return v.ok() ? 1 : 0;
  });
}

int npub_ms_schema(const char* op, char* out, int out_len) {
  return guarded([&] {
    const npub::OpHandle h = dispatcher().op(op);
    write(h.op->schema().to_string(), out, out_len);
    return 0;
  });
}

int npub_ms_set_opt_level(int level) {
  return guarded([&] {
    dispatcher().set_opt_level(level);
    return 0;
  });
}

int npub_ms_opt_level(void) {
  return guarded([] { return dispatcher().opt_level(); });
}

int npub_ms_set_dtype_conversion(int on) {
  return guarded([&] {
    dispatcher().set_dtype_conversion(on != 0);
    return 0;
  });
}

int npub_ms_dtype_conversion(void) {
  return guarded([] { return dispatcher().dtype_conversion() ? 1 : 0; });
}

int npub_ms_stats_json(char* out, int out_len) {
  return guarded([&] {
    std::string s = "[";
    for (const npub::OpStatsSnapshot& op : dispatcher().stats()) {
      if (s.size() > 1) s += ",";
      s += "{\"op\":" + json_string(op.op) + ",\"calls\":" + std::to_string(op.calls) +
           ",\"fallbacks\":" + std::to_string(op.fallbacks) +
           ",\"conversions\":" + std::to_string(op.conversions) + ",\"errors\":" + std::to_string(op.errors) +
           ",\"kernels\":[";
      bool first = true;
      for (const npub::KernelStats& k : op.kernels) {
        if (k.calls == 0) continue;
        s += std::string(first ? "" : ",") + "{\"plugin\":" + json_string(k.plugin) +
             ",\"calls\":" + std::to_string(k.calls) + "}";
        first = false;
      }
      s += "]}";
    }
    return write_all(s + "]", out, out_len);
  });
}

int npub_ms_reset_stats(void) {
  return guarded([] {
    dispatcher().reset_stats();
    return 0;
  });
}

int npub_ms_plugins_json(char* out, int out_len) {
  return guarded([&] {
    npub::PluginLoader& loader = npub::Runtime::global().loader();
    std::string s = "{\"loaded\":[";
    bool first = true;
    for (const auto& p : loader.plugins()) {
      s += std::string(first ? "" : ",") + "{\"name\":" + json_string(p->name) +
           ",\"version\":" + json_string(p->version) + ",\"path\":" + json_string(p->path) + "}";
      first = false;
    }
    s += "],\"rejected\":[";
    first = true;
    for (const auto& f : loader.failures()) {
      s += std::string(first ? "" : ",") + json_string(f.error);
      first = false;
    }
    return write_all(s + "]}", out, out_len);
  });
}

}  // extern "C"
