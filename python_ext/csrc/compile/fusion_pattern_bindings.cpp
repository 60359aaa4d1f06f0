// npubridge._C._fusion_patterns() and _register_fusion_pattern(text): the
// fusion-pattern table (registry/include/npubridge/registry/fusion_pattern.h)
// in the parsed form the graph compiler's matcher reads
// (python_ext/npubridge/_compile/patterns.py; docs/graph-mode.md, "Fusion
// patterns").
#include "bindings/bindings.h"

#include <pybind11/pybind11.h>

#include <npubridge/dispatcher/runtime.h>
#include <npubridge/registry/fusion_pattern.h>
#include <npubridge/support/error.h>

#include <string>

#include "runtime/npu_runtime.h"

namespace py = pybind11;

namespace npub::torch_backend {

namespace {

py::object const_to_py(const reg::PatternConst& c) {
  switch (c.kind) {
    case reg::PatternConst::kNone:
      return py::none();
    case reg::PatternConst::kBool:
      return py::bool_(c.b);
    case reg::PatternConst::kInt:
      return py::int_(c.i);
    case reg::PatternConst::kFloat:
      return py::float_(c.d);
    case reg::PatternConst::kString:
      return py::str(c.s);
    case reg::PatternConst::kList: {
      py::list out;
      for (const auto& x : c.items) out.append(const_to_py(x));
      return out;
    }
  }
  return py::none();
}

py::dict arg_to_py(const reg::PatternArg& a) {
  py::dict d;
  auto items = [&] {
    py::list out;
    for (const auto& x : a.items) out.append(arg_to_py(x));
    return out;
  };
  switch (a.kind) {
    case reg::PatternArg::kValue:
      d["kind"] = "value";
      d["name"] = a.name;
      break;
    case reg::PatternArg::kCapture:
      d["kind"] = "capture";
      d["name"] = a.name;
      break;
    case reg::PatternArg::kAny:
      d["kind"] = "any";
      break;
    case reg::PatternArg::kConst:
      d["kind"] = "const";
      d["value"] = const_to_py(a.value);
      break;
    case reg::PatternArg::kList:
      d["kind"] = "list";
      d["items"] = items();
      break;
    case reg::PatternArg::kSize:
      d["kind"] = "size";
      d["name"] = a.name;
      d["dim"] = a.dim;
      break;
    case reg::PatternArg::kCall:
      d["kind"] = "call";
      d["op"] = a.op;
      d["args"] = items();
      d["ret"] = a.ret;
      break;
  }
  return d;
}

py::dict term_to_py(const reg::PatternTerm& t) {
  py::dict d;
  switch (t.kind) {
    case reg::PatternTerm::kDim:
      d["kind"] = "dim";
      d["name"] = t.name;
      break;
    case reg::PatternTerm::kSize:
      d["kind"] = "size";
      d["name"] = t.name;
      d["dim"] = t.dim;
      break;
    case reg::PatternTerm::kDtype:
      d["kind"] = "dtype";
      d["name"] = t.name;
      break;
    case reg::PatternTerm::kCapture:
      d["kind"] = "capture";
      d["name"] = t.name;
      break;
    case reg::PatternTerm::kDtypeName:
      d["kind"] = "dtype_name";
      d["name"] = t.name;
      break;
    case reg::PatternTerm::kConst:
      d["kind"] = "const";
      d["value"] = const_to_py(t.value);
      break;
  }
  return d;
}

py::dict pattern_to_py(const reg::FusionPattern& p) {
  py::dict d;
  d["name"] = p.name;
  d["plugin"] = p.plugin;
  d["priority"] = p.priority;
  d["text"] = p.text;
  py::list nodes;
  for (const auto& n : p.nodes) {
    py::dict nd;
    nd["out"] = n.out;
    nd["op"] = n.op;
    py::list args;
    for (const auto& a : n.args) args.append(arg_to_py(a));
    nd["args"] = args;
    nd["ret"] = n.ret;  // the return of a multi-return op the line's value is (FX getitem)
    nodes.append(nd);
  }
  d["nodes"] = nodes;
  d["replacement"] = arg_to_py(p.replacement);
  py::list extra;
  for (const auto& e : p.extra_outputs) {
    py::dict ed;
    ed["name"] = e.name;
    ed["ret"] = e.ret;
    extra.append(ed);
  }
  d["extra_outputs"] = extra;  // `=> %name <- [k]` lines
  py::list where;
  for (const auto& w : p.constraints) {
    py::dict wd;
    wd["lhs"] = term_to_py(w.lhs);
    wd["op"] = w.equal ? "==" : "!=";
    wd["rhs"] = term_to_py(w.rhs);
    wd["line"] = w.line;
    wd["text"] = w.to_string();
    where.append(wd);
  }
  d["where"] = where;  // `where` lines: conditions the matcher checks on the matched values
  return d;
}

}  // namespace

void bind_fusion_patterns(py::module& m) {
  m.def("_fusion_patterns", [] {
    py::list out;
    for (const auto& p : rt().registry().fusion_patterns()) out.append(pattern_to_py(p));
    return out;
  });
  // A host pattern (plugin ""): checked as a plugin's are; ValueError on a
  // malformed or conflicting one. Returns the parsed patterns.
  m.def("_register_fusion_pattern", [](const std::string& text) {
    const std::string origin = "fusion pattern text";
    reg::Registry& registry = rt().registry();
    std::vector<reg::FusionPattern> parsed;
    try {
      parsed = reg::parse_fusion_patterns(text, origin);
      for (const auto& p : parsed)
        reg::check_fusion_pattern(p, origin, [&](const std::string& op) -> const reg::Schema* {
          const reg::OpEntry* e = registry.find(op);
          return e != nullptr ? &e->schema() : nullptr;
        });
    } catch (const reg::FusionPatternError& e) {
      throw py::value_error(e.what());
    }
    py::list out;
    for (const auto& p : parsed) out.append(pattern_to_py(p));
    try {
      registry.add_fusion_patterns(std::move(parsed));
    } catch (const Error& e) {
      throw py::value_error(e.what());
    }
    return out;
  });
}

}  // namespace npub::torch_backend
