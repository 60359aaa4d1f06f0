// Derivative formulas: how to differentiate an op through another op, as the
// plugin that defines it declares (NpubHostApi.define_derivative, ABI 1.2);
// the host registers them with its autograd (PyTorch:
// python_ext/npubridge/_autograd.py). A formula reads
//
//   <inputs>: <backward op>(<arguments>)
//   "self, gamma: ns::rms_norm_backward(grads[0], self, gamma, results[1])"
//
// <inputs> names the forward op's Tensor arguments that receive a gradient,
// one per return of the backward op, in order. Each argument of the backward
// call is `grads[i]` (the gradient of return i; `grad` is grads[0]),
// `results[i]` (return i; `result` is results[0]) or the name of a forward
// argument.
#pragma once

#include <npubridge/registry/schema.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace npub::reg {

// A parsed formula.
struct Derivative {
  struct Arg {
    enum Kind { kGrad, kResult, kInput } kind;
    int32_t index;  // return index (kGrad, kResult) or argument index (kInput)
  };
  std::string backward;         // qualified name of the backward op
  std::vector<int32_t> inputs;  // forward argument receiving backward return i
  std::vector<Arg> args;        // the backward op's arguments, in order
  std::string formula;          // as declared
  std::string plugin;           // who declared it (set by the caller)
};

class DerivativeFormulaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Parses `formula` for the op `op`, whose schema is `forward`, and checks it
// against both schemas: the forward op writes no argument, each input is a
// Tensor argument listed once, each grads[i] and results[i] is a Tensor
// return, and the backward op (`schema_of` returns its schema, or null when
// it is not defined) takes that many arguments and returns one Tensor per
// input. Sets every field but `plugin`. Throws DerivativeFormulaError with
// the reason alone; the caller names the op and the formula.
Derivative parse_derivative_formula(const std::string& op, const Schema& forward, const std::string& formula,
                                    const std::function<const Schema*(const std::string&)>& schema_of);

}  // namespace npub::reg
