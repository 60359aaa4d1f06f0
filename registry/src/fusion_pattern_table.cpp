// The parsed fusion patterns (fusion_pattern.h) after parsing: printing
// them back as text, the check of a replacement against the ops that exist,
// and the table of registered patterns. The parser is fusion_pattern.cpp.
#include <npubridge/registry/fusion_pattern.h>

#include <sstream>

namespace npub::reg {

std::string PatternConst::to_string() const {
  switch (kind) {
    case kNone:
      return "None";
    case kBool:
      return b ? "True" : "False";
    case kInt:
      return std::to_string(i);
    case kFloat: {
      std::ostringstream o;
      o.precision(17);
      o << d;
      return o.str();
    }
    case kString:
      return "\"" + s + "\"";
    case kList: {
      std::string out = "[";
      for (size_t k = 0; k < items.size(); ++k) out += (k ? ", " : "") + items[k].to_string();
      return out + "]";
    }
  }
  return "?";
}

std::string PatternTerm::to_string() const {
  switch (kind) {
    case kDim:
      return "%" + name + ".dim()";
    case kSize:
      return "%" + name + ".size(" + std::to_string(dim) + ")";
    case kDtype:
      return "%" + name + ".dtype";
    case kCapture:
      return "$" + name;
    case kDtypeName:
      return name;
    case kConst:
      return value.to_string();
  }
  return "?";
}

std::string PatternConstraint::to_string() const {
  return lhs.to_string() + (equal ? " == " : " != ") + rhs.to_string();
}

std::string PatternArg::to_string() const {
  switch (kind) {
    case kValue:
      return "%" + name;
    case kCapture:
      return "$" + name;
    case kAny:
      return "_";
    case kConst:
      return value.to_string();
    case kSize:
      return "%" + name + ".size(" + std::to_string(dim) + ")";
    case kList:
    case kCall: {
      std::string out = kind == kCall ? op + "(" : "[";
      for (size_t k = 0; k < items.size(); ++k) out += (k ? ", " : "") + items[k].to_string();
      out += kind == kCall ? ")" : "]";
      if (kind == kCall && ret != 0) {
        // Appended piece by piece: GCC 12 at -O3 warns falsely on
        // "[" + std::string&& (-Wrestrict, GCC bug 105651).
        out += '[';
        out += std::to_string(ret);
        out += ']';
      }
      return out;
    }
  }
  return "?";
}

void check_fusion_pattern(const FusionPattern& p, const std::string& origin,
                          const std::function<const Schema*(const std::string&)>& schema_of) {
  std::function<void(const PatternArg&)> check_call = [&](const PatternArg& c) {
    for (const auto& a : c.items)
      if (a.kind == PatternArg::kCall) check_call(a);
    if (c.kind != PatternArg::kCall) return;
    const Schema* s = schema_of(c.op);
    auto fail = [&](const std::string& what) {
      throw FusionPatternError(origin + ", line " + std::to_string(p.replacement_line) + ", pattern '" +
                               p.name + "': " + what);
    };
    if (s == nullptr) {
      if (c.op.rfind("aten::", 0) == 0) return;  // PyTorch's own: the matcher checks it
      fail("the replacement op '" + c.op + "' is not defined (define it before its pattern)");
    }
    size_t required = s->arguments.size();
    while (required > 0 && s->arguments[required - 1].default_value) --required;
    const size_t n = c.items.size();
    if (n < required || n > s->arguments.size())
      fail("the replacement op '" + c.op + "' takes " +
           (required == s->arguments.size()
                ? std::to_string(required)
                : std::to_string(required) + " to " + std::to_string(s->arguments.size())) +
           " arguments but the pattern passes " + std::to_string(n));
    const int32_t nret = static_cast<int32_t>(s->returns.size());
    if (c.ret >= nret)
      fail("'" + c.to_string() + "' takes return " + std::to_string(c.ret) + " of an op with " +
           std::to_string(nret) + " returns");
    if (&c == &p.replacement)
      for (const auto& e : p.extra_outputs)
        if (e.ret >= nret)
          fail("'=> %" + e.name + " <- [" + std::to_string(e.ret) + "]' but '" + c.op + "' has " +
               std::to_string(nret) + " returns");
  };
  check_call(p.replacement);
}

std::string FusionPatternTable::conflict(const std::vector<FusionPattern>& patterns) const {
  std::lock_guard<std::mutex> lock(mu_);
  return conflict_locked(patterns);
}

std::string FusionPatternTable::conflict_locked(const std::vector<FusionPattern>& patterns) const {
  for (size_t i = 0; i < patterns.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (patterns[i].name == patterns[j].name)
        return "fusion pattern '" + patterns[i].name + "' is registered twice";
  for (const auto& p : patterns)
    for (const auto& q : patterns_)
      if (q.name == p.name)
        return "fusion pattern '" + p.name + "' is already registered (by " +
               (q.plugin.empty() ? std::string("the host") : "plugin '" + q.plugin + "'") + ")";
  return {};
}

void FusionPatternTable::add(std::vector<FusionPattern> patterns) {
  std::lock_guard<std::mutex> lock(mu_);
  if (const std::string c = conflict_locked(patterns); !c.empty()) throw FusionPatternError(c);
  for (auto& p : patterns) patterns_.push_back(std::move(p));
}

std::vector<FusionPattern> FusionPatternTable::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return patterns_;
}

}  // namespace npub::reg
