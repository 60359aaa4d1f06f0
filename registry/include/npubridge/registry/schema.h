// ATen-style op schemas: parsing, printing and the value kinds they accept.
//
// Grammar (a subset of PyTorch's FunctionSchema that covers every ATen op):
//   schema   := ns '::' name ('.' overload)? '(' args ')' '->' returns
//   args     := (arg (',' arg)*)?    arg := '*' | type name ('=' default)?
//   type     := base ('(' alias ')')? '?'? ('[' N? ']' '?'?)?   e.g. Tensor(a!), int[2]?, Tensor?[]
//   alias    := set '!'? ('->' set ('|' set)*)?                  set := ident | '*'
//   returns  := '(' (ret (',' ret)*)? ')' | ret                  ret := type name?
//   default  := None | True | False | number | string | '[' ... ']' | ident
// Base types: Tensor, int, SymInt, float, bool, str, Scalar, ScalarType,
// Layout, MemoryFormat, Device, Generator, Dimname, Storage, Stream, Any.
#pragma once

#include <npubridge/plugin_api.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace npub::reg {

enum class BaseType : uint8_t {
  kTensor,
  kInt,
  kSymInt,
  kFloat,
  kBool,
  kStr,
  kScalar,
  kScalarType,
  kLayout,
  kMemoryFormat,
  kDevice,
  kGenerator,
  kDimname,
  kStorage,
  kStream,
  kAny,
};

struct Type {
  BaseType base = BaseType::kTensor;
  bool optional = false;          // T?  (for lists: the list itself is optional)
  bool list = false;              // T[]
  bool element_optional = false;  // T?[]
  int fixed_size = -1;            // T[N]
};

struct AliasInfo {
  std::string set;                 // "a", or "*"
  bool is_write = false;           // '!'
  std::vector<std::string> after;  // "a -> *" or "a -> a|b"
};

// A default value, kept both as text (for printing and comparison) and as a
// boxed value the dispatcher fills in for an omitted trailing argument.
struct DefaultValue {
  std::string text;
  NpubValue value{};
  std::vector<int64_t> ints;    // backing store of INT_LIST defaults
  std::vector<double> doubles;  // backing store of DOUBLE_LIST defaults
  std::string str;              // backing store of STRING defaults
  bool boxable = true;          // false for identifiers the host cannot box (kept as text)

  DefaultValue() = default;
  DefaultValue(const DefaultValue& o) { *this = o; }
  DefaultValue& operator=(const DefaultValue& o);
};

struct Argument {
  std::string name;
  Type type;
  std::optional<AliasInfo> alias;
  std::optional<DefaultValue> default_value;
  bool kwarg_only = false;
  bool is_write() const { return alias && alias->is_write; }
};

struct Schema {
  std::string ns;
  std::string name;
  std::string overload;
  std::vector<Argument> arguments;
  std::vector<Argument> returns;

  // "ns::name" or "ns::name.overload"
  std::string qualified_name() const;
  // Canonical text; two schemas are the same op signature iff equal.
  std::string to_string() const;
};

class SchemaError : public std::exception {
 public:
  explicit SchemaError(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

// Parses a schema; throws SchemaError naming the position and what was
// expected. Never reads outside `text`.
Schema parse_schema(std::string_view text);

std::string type_to_string(const Type& t, const std::optional<AliasInfo>& alias = std::nullopt);
const char* base_type_name(BaseType b);
// Which NpubValue tags an argument of this type accepts (bit i = tag i).
uint32_t accepted_tags(const Type& t);
// "Tensor", "int[]", ... as the error messages name a value tag.
const char* value_tag_name(int32_t tag);

// Points a default's boxed value at its own storage.
void finalize_default(DefaultValue& d);

}  // namespace npub::reg
