#include <npubridge/registry/schema.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace npub::reg {

namespace {

struct BaseName {
  const char* name;
  BaseType type;
};
constexpr BaseName kBaseNames[] = {
    {"Tensor", BaseType::kTensor},   {"int", BaseType::kInt},
    {"SymInt", BaseType::kSymInt},   {"float", BaseType::kFloat},
    {"bool", BaseType::kBool},       {"str", BaseType::kStr},
    {"Scalar", BaseType::kScalar},   {"ScalarType", BaseType::kScalarType},
    {"Layout", BaseType::kLayout},   {"MemoryFormat", BaseType::kMemoryFormat},
    {"Device", BaseType::kDevice},   {"Generator", BaseType::kGenerator},
    {"Dimname", BaseType::kDimname}, {"Storage", BaseType::kStorage},
    {"Stream", BaseType::kStream},   {"Any", BaseType::kAny},
};

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  Schema parse() {
    Schema schema;
    skip_ws();
    schema.ns = ident("a namespace");
    expect("::");
    schema.name = ident("an op name");
    if (peek() == '.') {
      ++pos_;
      schema.overload = ident("an overload name");
    }
    skip_ws();
    expect("(");
    parse_arguments(schema);
    expect(")");
    skip_ws();
    expect("->");
    skip_ws();
    parse_returns(schema);
    skip_ws();
    if (pos_ != s_.size()) fail("end of schema");
    return schema;
  }

 private:
  [[noreturn]] void fail(const std::string& expected) const {
    std::string found = pos_ < s_.size() ? "'" + std::string(1, s_[pos_]) + "'" : "end of text";
    throw SchemaError("invalid schema at character " + std::to_string(pos_ + 1) + ": expected " + expected +
                      " but found " + found + " in \"" +
                      std::string(s_.substr(0, std::min<size_t>(s_.size(), 200))) + "\"");
  }
  // A default (or argument) at `at` that parses but is not one PyTorch
  // takes: the message names the whole text found, not one character.
  [[noreturn]] void fail_at(size_t at, const std::string& expected, const std::string& found) const {
    throw SchemaError("invalid schema at character " + std::to_string(at + 1) + ": expected " + expected +
                      " but found '" + found + "' in \"" +
                      std::string(s_.substr(0, std::min<size_t>(s_.size(), 200))) + "\"");
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_ws() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool accept(std::string_view tok) {
    skip_ws();
    if (s_.substr(pos_, tok.size()) == tok) {
      pos_ += tok.size();
      return true;
    }
    return false;
  }
  void expect(std::string_view tok) {
    if (!accept(tok)) fail("'" + std::string(tok) + "'");
  }
  static bool ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
  static bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
  std::string ident(const char* what) {
    skip_ws();
    if (!ident_start(peek())) fail(what);
    size_t b = pos_;
    while (pos_ < s_.size() && ident_char(s_[pos_])) ++pos_;
    return std::string(s_.substr(b, pos_ - b));
  }

  void parse_arguments(Schema& schema) {
    skip_ws();
    if (peek() == ')') return;
    bool kwarg_only = false;
    bool seen_default = false;
    for (;;) {
      skip_ws();
      if (accept("*")) {
        if (kwarg_only) fail("one '*' at most");
        kwarg_only = true;
      } else {
        const size_t begin = pos_;
        Argument a = parse_argument(/*is_return=*/false);
        // Note [Defaults PyTorch takes]: as in Python, a positional argument
        // after a defaulted one needs a default; keyword-only ones need not.
        if (!kwarg_only && seen_default && !a.default_value)
          fail_at(begin,
                  "a default for '" + a.name +
                      "' (it follows a defaulted positional argument) or a '*' before it",
                  std::string(s_.substr(begin, pos_ - begin)));
        if (!kwarg_only && a.default_value) seen_default = true;
        a.kwarg_only = kwarg_only;
        for (const Argument& prev : schema.arguments)
          if (prev.name == a.name)
            throw SchemaError("invalid schema: argument name '" + a.name + "' appears twice");
        schema.arguments.push_back(std::move(a));
      }
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      break;
    }
  }

  void parse_returns(Schema& schema) {
    skip_ws();
    if (peek() == '(') {
      ++pos_;
      skip_ws();
      if (peek() != ')') {
        for (;;) {
          schema.returns.push_back(parse_argument(/*is_return=*/true));
          skip_ws();
          if (peek() == ',') {
            ++pos_;
            continue;
          }
          break;
        }
      }
      expect(")");
    } else {
      schema.returns.push_back(parse_argument(/*is_return=*/true));
    }
  }

  Argument parse_argument(bool is_return) {
    Argument a;
    a.type = parse_type(a.alias);
    skip_ws();
    if (ident_start(peek())) {
      a.name = ident("a name");
    } else if (!is_return) {
      fail("an argument name");
    }
    skip_ws();
    if (!is_return && peek() == '=') {
      ++pos_;
      a.default_value = parse_default(a.type);
    }
    return a;
  }

  Type parse_type(std::optional<AliasInfo>& alias) {
    Type t;
    skip_ws();
    std::string base = ident("a type");
    bool found = false;
    for (const auto& b : kBaseNames)
      if (base == b.name) {
        t.base = b.type;
        found = true;
      }
    if (!found) {
      pos_ -= base.size();
      fail("a type (Tensor, int, SymInt, float, bool, str, Scalar, ScalarType, ...)");
    }
    // Suffixes in any order ATen uses: (alias) ? [N] ?
    bool seen_alias = false;
    for (;;) {
      if (peek() == '(') {
        if (seen_alias) fail("one alias annotation");
        ++pos_;
        alias = parse_alias();
        seen_alias = true;
        expect(")");
      } else if (peek() == '?') {
        ++pos_;
        if (t.list) {
          if (t.optional) fail("one '?'");
          t.optional = true;
        } else {
          if (t.element_optional) fail("one '?'");
          t.element_optional = true;  // may become the list's element flag
        }
      } else if (peek() == '[') {
        if (t.list) fail("one list suffix");
        ++pos_;
        skip_ws();
        if (std::isdigit(static_cast<unsigned char>(peek()))) {
          size_t b = pos_;
          while (std::isdigit(static_cast<unsigned char>(peek())) && pos_ - b < 6) ++pos_;
          if (std::isdigit(static_cast<unsigned char>(peek()))) fail("a list size below 1000000");
          t.fixed_size = std::atoi(std::string(s_.substr(b, pos_ - b)).c_str());
        }
        expect("]");
        t.list = true;
      } else {
        break;
      }
    }
    if (!t.list) {
      t.optional = t.element_optional;
      t.element_optional = false;
    }
    return t;
  }

  AliasInfo parse_alias() {
    AliasInfo info;
    skip_ws();
    if (accept("*")) {
      info.set = "*";
    } else {
      info.set = ident("an alias set name");
    }
    if (accept("!")) info.is_write = true;
    if (accept("->")) {
      for (;;) {
        if (accept("*"))
          info.after.push_back("*");
        else
          info.after.push_back(ident("an alias set name"));
        if (!accept("|")) break;
      }
    }
    return info;
  }

  DefaultValue parse_default(const Type& type) {
    skip_ws();
    size_t b = pos_;
    DefaultValue d;
    d = parse_default_text(type, b);
    check_default_fits(type, d, b);
    return d;
  }

  // Note [Defaults PyTorch takes]
  // A plugin's schema is also defined with PyTorch (python_ext), whose parser
  // (torch/csrc/jit/frontend/function_schema_parser.cpp, checked against
  // 2.13) refuses some defaults this parser would read; such a schema is
  // refused here, at plugin load, with its position, rather than leaving the
  // op missing under PyTorch. Only what PyTorch refuses is refused (no schema
  // PyTorch takes is turned away for it; tests/python/test_schema_parity.py
  // feeds every case to both): a Tensor's default is None; a Tensor list
  // has none; a Device's is a string; a [...] list default belongs to an
  // int, SymInt, float or bool list that is not optional, and its items to
  // that type; a single value for a list only to a sized one (int[2] x=1)
  // or an optional one; numbers are finite, without '+', within a double
  // (integers: within int64, unless the type is float); a name is one of
  // PyTorch's few (long, float, complex, strided, contiguous_format, Mean).
  // PyTorch takes `int x=1.5`, `bool b=2` and `int x="a"`; they are kept as
  // they were (the first is refused here, the others are read as written).
  void check_default_fits(const Type& type, const DefaultValue& d, size_t b) const {
    const std::string& t = d.text;
    const bool is_list_text = !t.empty() && t[0] == '[';
    const bool is_string = !t.empty() && (t[0] == '"' || t[0] == '\'');
    if (type.base == BaseType::kTensor) {
      if (type.list) fail_at(b, "no default (a Tensor list takes none)", t);
      if (!type.optional && t != "None") fail_at(b, "None (the only default of a Tensor)", t);
      if (type.optional && is_list_text) fail_at(b, "None for an optional Tensor", t);
      return;
    }
    if (type.base == BaseType::kDevice && !type.optional && !is_string)
      fail_at(b, "a device string such as \"cpu\" (the only default of a Device)", t);
    if (is_list_text) {
      if (!type.list) fail_at(b, "a single value (the argument is not a list)", t);
      if (type.optional)
        fail_at(b, "None or a single value (PyTorch takes no [...] for an optional list)", t);
      if (type.base != BaseType::kInt && type.base != BaseType::kSymInt && type.base != BaseType::kFloat &&
          type.base != BaseType::kBool)
        fail_at(b, "no list default (only int, SymInt, float and bool lists take one)", t);
      const std::string inner = t.substr(1, t.size() - 2);
      size_t p = 0;
      while (inner.find_first_not_of(" \t") != std::string::npos && p <= inner.size()) {
        size_t c = inner.find(',', p);
        std::string item = inner.substr(p, c == std::string::npos ? std::string::npos : c - p);
        const size_t a = item.find_first_not_of(" \t"), z = item.find_last_not_of(" \t");
        item = a == std::string::npos ? "" : item.substr(a, z - a + 1);
        check_list_item(type, item, b, t);
        if (c == std::string::npos) break;
        p = c + 1;
      }
      return;
    }
    if (type.list && t != "None") {
      if (type.fixed_size < 0 && !type.optional)
        fail_at(b, "a list in [ ] (only a sized list such as int[2] takes a single value)", t);
      if (!type.optional) check_list_item(type, t, b, t);
    }
    if (is_string || t == "None" || t == "True" || t == "False") return;
    check_number_or_name(type, t, b);
  }

  // One item of a list default (or the single value of a sized list).
  void check_list_item(const Type& type, const std::string& item, size_t b, const std::string& text) const {
    const bool is_bool = item == "True" || item == "False";
    bool is_int = false;
    int64_t i = 0;
    double f = 0;
    const bool is_number = !is_bool && parse_number(item, is_int, i, f);
    if (type.base == BaseType::kBool) {
      if (!is_bool) fail_at(b, "True or False for each item of a bool list", text);
    } else if (type.base == BaseType::kFloat) {
      if (!is_number) fail_at(b, "a number for each item of a float list", text);
    } else if (!is_number || !is_int) {
      fail_at(b, "an integer for each item of an int list", text);
    }
    if (is_number) check_number_or_name(type, item, b);
  }

  void check_number_or_name(const Type& type, const std::string& t, size_t b) const {
    static const char* const kNames[] = {"long", "float", "complex", "strided", "contiguous_format", "Mean"};
    if (t == "inf" || t == "nan") fail_at(b, "a finite number (PyTorch takes no inf or nan)", t);
    if (ident_start(t[0])) {
      for (const char* n : kNames)
        if (t == n) return;
      fail_at(
          b,
          "a finite number, True, False, None, a string, a list or one of the names long, float, complex, "
          "strided, contiguous_format, Mean",
          t);
    }
    if (t[0] == '+') fail_at(b, "a number without '+'", t);
    const size_t digits = t[0] == '-' ? 1 : 0;
    if (digits < t.size() && ident_start(t[digits]))
      fail_at(b, "a finite number (PyTorch takes no inf or nan)", t);
    const bool integer_text = t.find_first_of(".eE") == std::string::npos;
    char* end = nullptr;
    errno = 0;
    if (integer_text && type.base != BaseType::kFloat) {
      std::strtoll(t.c_str(), &end, 10);
      if (errno == ERANGE) fail_at(b, "an integer within int64 (-2^63 to 2^63-1)", t);
    } else {
      std::strtod(t.c_str(), &end);
      if (errno == ERANGE) fail_at(b, "a number a double holds (no overflow or underflow)", t);
    }
  }

  DefaultValue parse_default_text(const Type& type, size_t b) {
    DefaultValue d;
    if (peek() == '[') {
      // A list of numbers or bools.
      ++pos_;
      int depth = 1;
      while (pos_ < s_.size() && depth > 0) {
        if (s_[pos_] == '[') ++depth;
        if (s_[pos_] == ']') --depth;
        if (s_[pos_] == ')' && depth > 0) fail("']'");
        ++pos_;
      }
      if (depth != 0) fail("']'");
      d.text = std::string(s_.substr(b, pos_ - b));
      box_list(d, type);
    } else if (peek() == '"' || peek() == '\'') {
      const char q = peek();
      ++pos_;
      while (pos_ < s_.size() && s_[pos_] != q) {
        if (s_[pos_] == '\\' && pos_ + 1 < s_.size()) ++pos_;
        ++pos_;
      }
      if (pos_ >= s_.size()) fail(std::string("closing ") + q);
      ++pos_;
      d.text = std::string(s_.substr(b, pos_ - b));
      d.str = d.text.substr(1, d.text.size() - 2);
      d.value.tag = NPUB_VALUE_STRING;
    } else {
      while (pos_ < s_.size() && s_[pos_] != ',' && s_[pos_] != ')' &&
             !std::isspace(static_cast<unsigned char>(s_[pos_])))
        ++pos_;
      d.text = std::string(s_.substr(b, pos_ - b));
      if (d.text.empty()) fail("a default value");
      box_scalar(d, type);
    }
    finalize_default(d);
    return d;
  }

  static bool parse_number(const std::string& text, bool& is_int, int64_t& i, double& f) {
    if (text == "inf" || text == "-inf" || text == "nan") {
      is_int = false;
      f = text == "nan" ? std::numeric_limits<double>::quiet_NaN()
                        : (text[0] == '-' ? -1.0 : 1.0) * std::numeric_limits<double>::infinity();
      return true;
    }
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(text.c_str(), &end, 10);
    if (errno == 0 && end != text.c_str() && *end == '\0') {
      is_int = true;
      i = v;
      return true;
    }
    errno = 0;
    double dv = std::strtod(text.c_str(), &end);
    if (errno == 0 && end != text.c_str() && *end == '\0') {
      is_int = false;
      f = dv;
      return true;
    }
    return false;
  }

  void box_scalar(DefaultValue& d, const Type& type) {
    const std::string& t = d.text;
    if (t == "None") {
      d.value.tag = NPUB_VALUE_NONE;
      return;
    }
    if (t == "True" || t == "False") {
      d.value.tag = NPUB_VALUE_BOOL;
      d.value.u.i = t == "True";
      return;
    }
    check_number_or_name(type, t, pos_ - t.size());  // Note [Defaults PyTorch takes]
    bool is_int = false;
    int64_t i = 0;
    double f = 0;
    if (parse_number(t, is_int, i, f)) {
      if (type.list) {  // int[2] stride=1 means [1, 1]
        const int n = type.fixed_size > 0 ? type.fixed_size : 1;
        if (type.base == BaseType::kFloat)
          d.doubles.assign(static_cast<size_t>(n), is_int ? double(i) : f);
        else if (is_int)
          d.ints.assign(static_cast<size_t>(n), i);
        else
          fail("an integer list default");
        d.value.tag = type.base == BaseType::kFloat ? NPUB_VALUE_DOUBLE_LIST : NPUB_VALUE_INT_LIST;
        return;
      }
      if (type.base == BaseType::kFloat || (!is_int && type.base == BaseType::kScalar)) {
        d.value.tag = NPUB_VALUE_DOUBLE;
        d.value.u.d = is_int ? static_cast<double>(i) : f;
      } else if (is_int) {
        d.value.tag = NPUB_VALUE_INT;
        d.value.u.i = i;
      } else {
        pos_ -= t.size();
        fail("an integer default for an integer argument");
      }
      return;
    }
    // Identifiers such as contiguous_format, Mean, long: valid, not boxable.
    for (char c : t)
      if (!ident_char(c)) {
        pos_ -= t.size();
        fail("a default value (None, True, False, a number, a string, a list or a name)");
      }
    d.boxable = false;
  }

  void box_list(DefaultValue& d, const Type& type) {
    std::string inner = d.text.substr(1, d.text.size() - 2);
    size_t p = 0;
    bool any_double = type.base == BaseType::kFloat;
    std::vector<std::string> items;
    while (p < inner.size()) {
      size_t c = inner.find(',', p);
      std::string item = inner.substr(p, c == std::string::npos ? std::string::npos : c - p);
      size_t a = item.find_first_not_of(" \t");
      size_t z = item.find_last_not_of(" \t");
      item = a == std::string::npos ? "" : item.substr(a, z - a + 1);
      if (!item.empty()) items.push_back(item);
      if (c == std::string::npos) break;
      p = c + 1;
    }
    for (const auto& item : items) {
      if (item == "True" || item == "False") {
        d.ints.push_back(item == "True");
        continue;
      }
      bool is_int = false;
      int64_t i = 0;
      double f = 0;
      if (!parse_number(item, is_int, i, f)) {
        d.boxable = false;
        return;
      }
      if (!is_int) any_double = true;
      d.ints.push_back(is_int ? i : 0);
      d.doubles.push_back(is_int ? static_cast<double>(i) : f);
    }
    if (any_double) {
      d.value.tag = NPUB_VALUE_DOUBLE_LIST;
      d.ints.clear();
    } else {
      d.value.tag = NPUB_VALUE_INT_LIST;
      d.doubles.clear();
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
};

void append_alias(std::string& out, const AliasInfo& a) {
  out += "(" + a.set;
  if (a.is_write) out += "!";
  if (!a.after.empty()) {
    out += " -> ";
    for (size_t i = 0; i < a.after.size(); ++i) out += (i ? "|" : "") + a.after[i];
  }
  out += ")";
}

}  // namespace

DefaultValue& DefaultValue::operator=(const DefaultValue& o) {
  if (this == &o) return *this;
  text = o.text;
  value = o.value;
  ints = o.ints;
  doubles = o.doubles;
  str = o.str;
  boxable = o.boxable;
  finalize_default(*this);
  return *this;
}

void finalize_default(DefaultValue& d) {
  switch (d.value.tag) {
    case NPUB_VALUE_INT_LIST:
      d.value.u.ints = d.ints.data();
      d.value.count = static_cast<int32_t>(d.ints.size());
      break;
    case NPUB_VALUE_DOUBLE_LIST:
      d.value.u.doubles = d.doubles.data();
      d.value.count = static_cast<int32_t>(d.doubles.size());
      break;
    case NPUB_VALUE_STRING:
      d.value.u.s = d.str.c_str();
      d.value.count = static_cast<int32_t>(d.str.size());
      break;
    default:
      break;
  }
}

Schema parse_schema(std::string_view text) {
  if (text.size() > 4096)
    throw SchemaError("invalid schema: longer than 4096 characters (" + std::to_string(text.size()) + ")");
  return Parser(text).parse();
}

const char* base_type_name(BaseType b) {
  for (const auto& n : kBaseNames)
    if (n.type == b) return n.name;
  return "?";
}

std::string type_to_string(const Type& t, const std::optional<AliasInfo>& alias) {
  std::string out = base_type_name(t.base);
  if (alias) append_alias(out, *alias);
  if (t.list) {
    if (t.element_optional) out += "?";
    out += "[";
    if (t.fixed_size >= 0) out += std::to_string(t.fixed_size);
    out += "]";
  }
  if (t.optional) out += "?";
  return out;
}

std::string Schema::qualified_name() const {
  return overload.empty() ? ns + "::" + name : ns + "::" + name + "." + overload;
}

std::string Schema::to_string() const {
  std::string out = qualified_name() + "(";
  bool kw = false;
  for (size_t i = 0; i < arguments.size(); ++i) {
    const Argument& a = arguments[i];
    if (i) out += ", ";
    if (a.kwarg_only && !kw) {
      out += "*, ";
      kw = true;
    }
    out += type_to_string(a.type, a.alias) + " " + a.name;
    if (a.default_value) out += "=" + a.default_value->text;
  }
  out += ") -> ";
  const bool paren = returns.size() != 1;
  if (paren) out += "(";
  for (size_t i = 0; i < returns.size(); ++i) {
    if (i) out += ", ";
    out += type_to_string(returns[i].type, returns[i].alias);
    if (!returns[i].name.empty()) out += " " + returns[i].name;
  }
  if (paren) out += ")";
  return out;
}

uint32_t accepted_tags(const Type& t) {
  auto bit = [](int tag) { return 1u << tag; };
  uint32_t m = 0;
  if (t.list) {
    switch (t.base) {
      case BaseType::kTensor:
        m = bit(NPUB_VALUE_TENSOR_LIST);
        break;
      case BaseType::kFloat:
        m = bit(NPUB_VALUE_DOUBLE_LIST);
        break;
      case BaseType::kInt:
      case BaseType::kSymInt:
      case BaseType::kBool:
        m = bit(NPUB_VALUE_INT_LIST);
        break;
      case BaseType::kScalar:
        m = bit(NPUB_VALUE_DOUBLE_LIST) | bit(NPUB_VALUE_INT_LIST);
        break;
      default:
        m = 0;
        break;
    }
  } else {
    switch (t.base) {
      case BaseType::kTensor:
        m = bit(NPUB_VALUE_TENSOR);
        break;
      case BaseType::kInt:
      case BaseType::kSymInt:
      case BaseType::kScalarType:
      case BaseType::kLayout:
      case BaseType::kMemoryFormat:
      case BaseType::kDevice:
        m = bit(NPUB_VALUE_INT);
        break;
      case BaseType::kFloat:
        m = bit(NPUB_VALUE_DOUBLE) | bit(NPUB_VALUE_INT);
        break;
      case BaseType::kBool:
        m = bit(NPUB_VALUE_BOOL);
        break;
      case BaseType::kStr:
        m = bit(NPUB_VALUE_STRING);
        break;
      case BaseType::kScalar:
        m = bit(NPUB_VALUE_INT) | bit(NPUB_VALUE_DOUBLE) | bit(NPUB_VALUE_BOOL);
        break;
      default:
        m = 0;
        break;  // Generator, Storage, ...: only None crosses
    }
  }
  const bool optional_only = m == 0;
  if (t.optional || optional_only) m |= bit(NPUB_VALUE_NONE);
  return m;
}

const char* value_tag_name(int32_t tag) {
  switch (tag) {
    case NPUB_VALUE_NONE:
      return "None";
    case NPUB_VALUE_TENSOR:
      return "Tensor";
    case NPUB_VALUE_INT:
      return "int";
    case NPUB_VALUE_DOUBLE:
      return "float";
    case NPUB_VALUE_BOOL:
      return "bool";
    case NPUB_VALUE_STRING:
      return "str";
    case NPUB_VALUE_INT_LIST:
      return "int[]";
    case NPUB_VALUE_TENSOR_LIST:
      return "Tensor[]";
    case NPUB_VALUE_DOUBLE_LIST:
      return "float[]";
    default:
      return "unknown value tag";
  }
}

}  // namespace npub::reg
