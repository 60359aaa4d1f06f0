#include "binding.h"

#include <npubridge/registry/schema.h>
#include <npubridge/support/error.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <sstream>

namespace npub::ms {

namespace {

// Note [One exported function per slot]: written once under the mutex,
// then only read; `g_count` publishes a slot after its binding is complete.
std::array<std::unique_ptr<Binding>, kNumSlots> g_slots;
std::atomic<int> g_count{0};
std::mutex g_bind_mu;

[[noreturn]] void bad(const Binding& b, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument,
              "npubridge.mindspore: cannot bind '" + b.op_name + "' with layout '" + b.layout + "': " + what);
}

int parse_index(const Binding& b, const std::string& token, const std::string& digits) {
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 4)
    bad(b, "token '" + token + "': expected an index after its letter, found '" + digits + "'");
  return std::atoi(digits.c_str());
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep))
    if (!cur.empty() || sep != ' ') out.push_back(cur);
  return out;
}

bool is_tensor_arg(const reg::Argument& a) { return a.type.base == reg::BaseType::kTensor; }

ArgSource parse_arg(const Binding& b, const std::string& token, const reg::Argument& arg) {
  ArgSource src;
  const std::string what = "token '" + token + "' for argument '" + arg.name + "'";
  auto expect_tensor = [&](bool list) {
    if (!is_tensor_arg(arg) || arg.type.list != list)
      bad(b, what + ": the schema's argument is not a " + std::string(list ? "Tensor[]" : "Tensor"));
  };
  if (token[0] == 't') {
    expect_tensor(false);
    src.kind = ArgSource::Kind::kTensor;
    src.transposed = token.back() == 'T';
    src.index = parse_index(b, token, token.substr(1, token.size() - 1 - (src.transposed ? 1 : 0)));
  } else if (token[0] == 'L') {
    expect_tensor(true);
    src.kind = ArgSource::Kind::kTensorList;
    for (const std::string& e : split(token.substr(1), '.')) src.inputs.push_back(parse_index(b, token, e));
  } else if (token[0] == 'o') {
    expect_tensor(false);
    src.kind = ArgSource::Kind::kOut;
    src.index = parse_index(b, token, token.substr(1));
  } else if (token[0] == 'g') {
    if (!arg.type.list || (arg.type.base != reg::BaseType::kInt && arg.type.base != reg::BaseType::kSymInt))
      bad(b, what + ": a shape is an int list, and the argument is not one");
    src.kind = ArgSource::Kind::kShapeOf;
    src.index = parse_index(b, token, token.substr(1));
  } else if (token[0] == 's' && token.rfind("str:", 0) != 0) {
    if (arg.type.list || (arg.type.base != reg::BaseType::kFloat && arg.type.base != reg::BaseType::kInt &&
                          arg.type.base != reg::BaseType::kBool && arg.type.base != reg::BaseType::kScalar &&
                          arg.type.base != reg::BaseType::kScalarType))
      bad(b, what +
                 ": a 0-d input holds an int, float, bool, Scalar or ScalarType, and the argument is none of "
                 "them");
    src.kind = ArgSource::Kind::kScalar;
    src.index = parse_index(b, token, token.substr(1));
  } else if (token == "n") {
    if (!arg.type.optional) bad(b, what + ": the argument is not optional");
    src.kind = ArgSource::Kind::kConstant;
    src.constant.tag = NPUB_VALUE_NONE;
  } else if (token.rfind("str:", 0) == 0) {
    if (arg.type.list || arg.type.base != reg::BaseType::kStr) bad(b, what + ": the argument is not a str");
    src.kind = ArgSource::Kind::kConstant;
    src.text = token.substr(4);
    src.constant.tag = NPUB_VALUE_STRING;
  } else if (token.size() >= 2 && token[1] == ':' &&
             std::string("ifbl").find(token[0]) != std::string::npos) {
    src.kind = ArgSource::Kind::kConstant;
    const std::string v = token.substr(2);
    const reg::BaseType t = arg.type.base;
    const bool integral = t == reg::BaseType::kInt || t == reg::BaseType::kSymInt;
    auto expect = [&](bool fits, const char* type) {
      if (!fits) bad(b, what + ": " + token.substr(0, 2) + " is " + type + " and the argument is not");
    };
    // Each value parsed whole: "1.x" or "" is malformed, not 1 or 0.
    auto whole_int = [&](const std::string& text) {
      char* end = nullptr;
      const long long x = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0') bad(b, what + ": malformed integer '" + text + "'");
      return static_cast<int64_t>(x);
    };
    switch (token[0]) {
      case 'i':
        expect(!arg.type.list && (integral || t == reg::BaseType::kScalar), "an int");
        src.constant.tag = NPUB_VALUE_INT;
        src.constant.u.i = whole_int(v);
        break;
      case 'f': {
        expect(!arg.type.list && (t == reg::BaseType::kFloat || t == reg::BaseType::kScalar), "a float");
        char* end = nullptr;
        src.constant.tag = NPUB_VALUE_DOUBLE;
        src.constant.u.d = std::strtod(v.c_str(), &end);
        if (v.empty() || *end != '\0') bad(b, what + ": malformed float '" + v + "'");
        break;
      }
      case 'b':
        expect(!arg.type.list && t == reg::BaseType::kBool, "a bool");
        if (v != "0" && v != "1") bad(b, what + ": malformed bool '" + v + "' (0 or 1)");
        src.constant.tag = NPUB_VALUE_BOOL;
        src.constant.u.i = v == "1" ? 1 : 0;
        break;
      default:  // 'l': an int list (a bool list crosses the ABI as one too)
        expect(arg.type.list && (integral || t == reg::BaseType::kBool), "an int list");
        for (const std::string& e : split(v, '.')) src.ints.push_back(whole_int(e));
        src.constant.tag = NPUB_VALUE_INT_LIST;
        break;
    }
  } else {
    bad(b, what + ": expected t<i>, t<i>T, L<i>.<j>, s<i>, g<i>, o<j>, n, i:, f:, b:, l: or str:");
  }
  return src;
}

OutSource parse_out(const Binding& b, const std::string& token) {
  OutSource o;
  if (token.size() < 2 || (token[0] != 'r' && token[0] != 'a'))
    bad(b,
        "output token '" + token + "': expected r<k> (return k) or a<k>[.<e>] (argument k after the call)");
  o.from_return = token[0] == 'r';
  const std::vector<std::string> parts = split(token.substr(1), '.');
  o.index = parse_index(b, token, parts.empty() ? "" : parts[0]);
  if (parts.size() == 2) o.element = parse_index(b, token, parts[1]);
  const auto& schema = b.op.op->schema();
  const size_t limit = o.from_return ? schema.returns.size() : schema.arguments.size();
  if (static_cast<size_t>(o.index) >= limit)
    bad(b, "output token '" + token + "': the op has " + std::to_string(limit) +
               (o.from_return ? " return(s)" : " argument(s)"));
  const reg::Argument& a = o.from_return ? schema.returns[o.index] : schema.arguments[o.index];
  if (a.type.base != reg::BaseType::kTensor || a.type.list != (o.element >= 0))
    bad(b, "output token '" + token + "': " + (o.from_return ? "return " : "argument '" + a.name + "' ") +
               (o.element >= 0 ? "is not a Tensor[] to take an element of" : "is not a Tensor"));
  return o;
}

}  // namespace

namespace {

std::unique_ptr<Binding> make_binding(Dispatcher& dispatcher, const std::string& op_name,
                                      const std::string& layout, const std::string& outputs) {
  auto b = std::make_unique<Binding>();
  b->op_name = op_name;
  b->layout = layout;
  b->op = dispatcher.find(op_name);
  if (!b->op) bad(*b, "unknown op: no loaded plugin defines it");
  const reg::Schema& schema = b->op.op->schema();
  const std::vector<std::string> tokens = split(layout, ' ');
  if (tokens.size() > schema.arguments.size())
    bad(*b, std::to_string(tokens.size()) + " arguments given, the schema takes " +
                std::to_string(schema.arguments.size()) + " (" + schema.to_string() + ")");
  for (size_t i = tokens.size(); i < schema.arguments.size(); ++i)
    if (!schema.arguments[i].default_value)
      bad(*b, "argument '" + schema.arguments[i].name + "' has no default and the layout leaves it out (" +
                  schema.to_string() + ")");
  int max_input = -1;
  for (size_t i = 0; i < tokens.size(); ++i) {
    b->args.push_back(parse_arg(*b, tokens[i], schema.arguments[i]));
    ArgSource& a = b->args.back();
    if (a.kind == ArgSource::Kind::kTensorList)
      for (int k : a.inputs) max_input = std::max(max_input, k);
    else if (a.kind != ArgSource::Kind::kConstant && a.kind != ArgSource::Kind::kOut)
      max_input = std::max(max_input, a.index);
  }
  b->num_inputs = max_input + 1;
  // The constants' backing stores have their final addresses now.
  for (ArgSource& a : b->args) {
    if (a.constant.tag == NPUB_VALUE_INT_LIST) {
      a.constant.count = static_cast<int32_t>(a.ints.size());
      a.constant.u.ints = a.ints.data();
    } else if (a.constant.tag == NPUB_VALUE_STRING) {
      a.constant.count = static_cast<int32_t>(a.text.size());
      a.constant.u.s = a.text.c_str();
    }
  }
  for (const std::string& t : split(outputs, ' ')) b->outs.push_back(parse_out(*b, t));
  if (b->outs.empty()) bad(*b, "no outputs: a MindSpore custom op returns at least one tensor");
  return b;
}

}  // namespace

void check_binding(Dispatcher& dispatcher, const std::string& op_name, const std::string& layout,
                   const std::string& outputs) {
  make_binding(dispatcher, op_name, layout, outputs);
}

int bind_slot(Dispatcher& dispatcher, const std::string& op_name, const std::string& layout,
              const std::string& outputs) {
  std::unique_ptr<Binding> b = make_binding(dispatcher, op_name, layout, outputs);
  std::lock_guard<std::mutex> lock(g_bind_mu);
  const int slot = g_count.load(std::memory_order_relaxed);
  if (slot >= kNumSlots)
    bad(*b, "all " + std::to_string(kNumSlots) + " slots are bound (Note [One exported function per slot])");
  g_slots[static_cast<size_t>(slot)] = std::move(b);
  g_count.store(slot + 1, std::memory_order_release);
  return slot;
}

const Binding& binding(int slot) {
  if (slot < 0 || slot >= g_count.load(std::memory_order_acquire))
    throw Error(ErrorCode::kInvalidArgument, "npubridge.mindspore: slot " + std::to_string(slot) +
                                                 " is not bound (" + std::to_string(g_count.load()) +
                                                 " slots are)");
  return *g_slots[static_cast<size_t>(slot)];
}

}  // namespace npub::ms
