// Fusion patterns: subgraphs a graph compiler rewrites to a fused op, as
// data (like the op-mapping table). A plugin contributes them through the C
// ABI (NpubHostApi.register_fusion_pattern, ABI 1.5), the host from Python
// (npubridge._C._register_fusion_pattern). This file parses and checks the
// text; the matcher that applies them lives with the graph compiler
// (python_ext/npubridge/_compile/patterns.py). The format is described in
// docs/graph-mode.md, "Fusion patterns":
//
//   # comment
//   pattern rms_norm priority 20
//     %sq = aten::pow.Tensor_Scalar(%x, 2)
//     ...
//     %y = aten::mul.Tensor(%gamma, %n)
//     => mindspeed_like::npu_rms_norm(%x, %gamma, $eps)[0]
//   end
#pragma once

#include <npubridge/registry/schema.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace npub::reg {

// A literal of a pattern: matches an equal constant (ints and floats compare
// numerically), or is passed as it is by a replacement.
struct PatternConst {
  enum Kind { kNone, kBool, kInt, kFloat, kString, kList } kind = kNone;
  bool b = false;
  int64_t i = 0;
  double d = 0.0;
  std::string s;
  std::vector<PatternConst> items;  // kList
  std::string to_string() const;
};

// One argument of a subgraph line or of the replacement.
struct PatternArg {
  enum Kind {
    kValue,    // %name: an earlier line's output, else a pattern input
    kCapture,  // $name: any non-tensor constant, bound by name
    kAny,      // _: anything (subgraph lines only)
    kConst,    // a literal
    kList,     // [ ... ] holding a value or a capture (items)
    kSize,     // %name.size(dim): replacement only
    kCall      // op(args)[ret]: replacement only
  } kind = kAny;
  std::string name;               // kValue, kCapture, kSize
  int64_t dim = 0;                // kSize
  PatternConst value;             // kConst
  std::vector<PatternArg> items;  // kList items, kCall arguments
  std::string op;                 // kCall
  int32_t ret = 0;                // kCall: the return taken
  std::string to_string() const;
};

// One subgraph line: `%out = op(args)[ret]`. `ret` selects the return of an
// op with several (the FX getitem); 0 for an op with one.
struct PatternNode {
  std::string out;
  std::string op;
  std::vector<PatternArg> args;
  int32_t ret = 0;
  int32_t line = 0;  // in the text
};

// `=> %name <- [k]`: the replacement's return k also replaces the value of
// the subgraph line %name, which may then have users outside the match.
struct PatternExtraOutput {
  std::string name;
  int32_t ret = 0;
};

// One side of a `where` line: `%v.dim()`, `%v.size(d)`, `%v.dtype`,
// `$capture`, or a literal (a number, True/False/None, a string, or a dtype
// name such as float32: kDtypeName).
struct PatternTerm {
  enum Kind { kDim, kSize, kDtype, kCapture, kConst, kDtypeName } kind = kConst;
  std::string name;    // kDim, kSize, kDtype: the value; kCapture; kDtypeName: "float32"
  int64_t dim = 0;     // kSize (negative counts from the end)
  PatternConst value;  // kConst
  std::string to_string() const;
};

// `where <term> == <term>` (or `!=`): a condition on the matched values'
// shapes and dtypes and on the captures; a match that fails it is skipped
// with the line as the reason (docs/graph-mode.md, "Fusion patterns").
struct PatternConstraint {
  PatternTerm lhs, rhs;
  bool equal = true;  // `==`; false for `!=`
  int32_t line = 0;
  std::string to_string() const;
};

struct FusionPattern {
  std::string name;
  std::string plugin;  // "" when registered by the host
  int32_t priority = 0;
  std::string text;                // the pattern's own lines, `pattern` to `end`
  std::vector<PatternNode> nodes;  // topological order; the last is the output
  PatternArg replacement;          // kCall
  std::vector<PatternExtraOutput> extra_outputs;
  std::vector<PatternConstraint> constraints;  // `where` lines, in text order
  int32_t line = 0;                            // of the `pattern` line
  int32_t replacement_line = 0;                // of the `=> op(...)` line
};

// A malformed pattern: the message names the origin, the line and the
// pattern, "<origin>, line 4, pattern 'rms_norm': ...".
class FusionPatternError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Parses every `pattern ... end` block of `text` (at least one). Syntax
// only; `origin` names the text in messages. Throws FusionPatternError.
std::vector<FusionPattern> parse_fusion_patterns(const std::string& text, const std::string& origin);

// Checks a parsed pattern against the ops that exist: every op of the
// replacement must be defined (`schema_of` returns its schema, or null)
// with an argument count its schema takes; an `aten::` op the registry does
// not know is PyTorch's own and is checked by the matcher. Throws
// FusionPatternError with the same form of message.
void check_fusion_pattern(const FusionPattern& p, const std::string& origin,
                          const std::function<const Schema*(const std::string&)>& schema_of);

// The patterns registered so far, in registration order. Thread-safe; names
// are unique.
class FusionPatternTable {
 public:
  // Throws FusionPatternError when a name is taken (nothing is added then).
  void add(std::vector<FusionPattern> patterns);
  // The error add() would throw, or "".
  std::string conflict(const std::vector<FusionPattern>& patterns) const;
  std::vector<FusionPattern> entries() const;

 private:
  std::string conflict_locked(const std::vector<FusionPattern>& patterns) const;
  mutable std::mutex mu_;
  std::vector<FusionPattern> patterns_;
};

}  // namespace npub::reg
