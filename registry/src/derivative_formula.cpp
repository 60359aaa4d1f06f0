// Derivative formulas (derivative_formula.h): the text split at ": " and the
// backward op's parentheses, each name resolved against the forward op's
// schema, the counts checked against the backward op's.
#include <npubridge/registry/derivative_formula.h>

#include <algorithm>

namespace npub::reg {

namespace {

std::string trim(const std::string& x) {
  const size_t b = x.find_first_not_of(" \t"), e = x.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : x.substr(b, e - b + 1);
}

std::vector<std::string> split_commas(const std::string& x) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= x.size(); ++i)
    if (i == x.size() || x[i] == ',') {
      parts.push_back(trim(x.substr(start, i - start)));
      start = i + 1;
    }
  return parts;
}

bool is_tensor(const Argument& a) { return a.type.base == BaseType::kTensor && !a.type.list; }

int32_t argument_index(const Schema& s, const std::string& name) {
  for (size_t i = 0; i < s.arguments.size(); ++i)
    if (s.arguments[i].name == name) return static_cast<int32_t>(i);
  return -1;
}

// `grads[3]` with prefix "grads": true and `index` 3. At most three digits.
bool indexed(const std::string& a, const std::string& prefix, int32_t& index) {
  if (a.rfind(prefix + "[", 0) != 0 || a.back() != ']') return false;
  const std::string num = a.substr(prefix.size() + 1, a.size() - prefix.size() - 2);
  if (num.empty() || num.find_first_not_of("0123456789") != std::string::npos || num.size() > 3) return false;
  index = std::stoi(num);
  return true;
}

}  // namespace

Derivative parse_derivative_formula(const std::string& op, const Schema& forward, const std::string& formula,
                                    const std::function<const Schema*(const std::string&)>& schema_of) {
  for (const auto& a : forward.arguments)
    if (a.is_write())
      throw DerivativeFormulaError("the op writes argument '" + a.name +
                                   "'; only functional ops can be differentiated");
  const std::string& text = formula;
  const size_t colon = text.find(": ");
  const size_t open = text.find('(', colon == std::string::npos ? 0 : colon);
  if (colon == std::string::npos || open == std::string::npos || text.back() != ')')
    throw DerivativeFormulaError("expected \"<inputs>: <backward op>(<arguments>)\"");
  Derivative d;
  d.formula = text;
  d.backward = trim(text.substr(colon + 2, open - colon - 2));
  const Schema* backward = schema_of(d.backward);
  if (backward == nullptr)
    throw DerivativeFormulaError("backward op '" + d.backward + "' is not defined; define its schema first");
  for (const std::string& name : split_commas(text.substr(0, colon))) {
    const int32_t i = argument_index(forward, name);
    if (i < 0) throw DerivativeFormulaError("'" + name + "' is not an argument of " + op);
    if (!is_tensor(forward.arguments[static_cast<size_t>(i)]))
      throw DerivativeFormulaError("argument '" + name + "' is not a Tensor and cannot receive a gradient");
    if (std::find(d.inputs.begin(), d.inputs.end(), i) != d.inputs.end())
      throw DerivativeFormulaError("'" + name + "' is listed twice");
    d.inputs.push_back(i);
  }
  const std::string inner = text.substr(open + 1, text.size() - open - 2);
  const std::vector<std::string> args =
      trim(inner).empty() ? std::vector<std::string>() : split_commas(inner);
  const int32_t nret = static_cast<int32_t>(forward.returns.size());
  for (const std::string& a : args) {
    Derivative::Arg arg{Derivative::Arg::kInput, -1};
    if (a == "grad")
      arg = {Derivative::Arg::kGrad, 0};
    else if (a == "result")
      arg = {Derivative::Arg::kResult, 0};
    else if (indexed(a, "grads", arg.index))
      arg.kind = Derivative::Arg::kGrad;
    else if (indexed(a, "results", arg.index))
      arg.kind = Derivative::Arg::kResult;
    else if ((arg.index = argument_index(forward, a)) < 0)
      throw DerivativeFormulaError("'" + a + "' is neither grads[i], results[i] nor an argument of " + op);
    if (arg.kind != Derivative::Arg::kInput) {
      if (arg.index >= nret)
        throw DerivativeFormulaError("'" + a + "' but the op has " + std::to_string(nret) + " returns");
      if (!is_tensor(forward.returns[static_cast<size_t>(arg.index)]))
        throw DerivativeFormulaError("'" + a + "' refers to a return that is not a Tensor");
    }
    d.args.push_back(arg);
  }
  size_t required = backward->arguments.size();
  while (required > 0 && backward->arguments[required - 1].default_value) --required;
  if (d.args.size() < required || d.args.size() > backward->arguments.size())
    throw DerivativeFormulaError(
        "backward op '" + d.backward + "' takes " +
        (required == backward->arguments.size()
             ? std::to_string(required)
             : std::to_string(required) + " to " + std::to_string(backward->arguments.size())) +
        " arguments but the formula passes " + std::to_string(d.args.size()));
  if (backward->returns.size() != d.inputs.size())
    throw DerivativeFormulaError("backward op '" + d.backward + "' returns " +
                                 std::to_string(backward->returns.size()) + " values but the formula lists " +
                                 std::to_string(d.inputs.size()) + " inputs");
  for (const auto& ret : backward->returns)
    if (!is_tensor(ret)) throw DerivativeFormulaError("backward op '" + d.backward + "' must return Tensors");
  return d;
}

}  // namespace npub::reg
