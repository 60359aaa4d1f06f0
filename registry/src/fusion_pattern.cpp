// The fusion-pattern text format (fusion_pattern.h; docs/graph-mode.md,
// "Fusion patterns"): a line-oriented parser with one recursive-descent
// reader for arguments, shared by subgraph lines and the replacement.
#include <npubridge/registry/fusion_pattern.h>
#include <npubridge/support/dtype.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace npub::reg {

namespace {

std::string trim(const std::string& x) {
  const size_t b = x.find_first_not_of(" \t\r"), e = x.find_last_not_of(" \t\r");
  return b == std::string::npos ? std::string() : x.substr(b, e - b + 1);
}

// Strips a `#` comment that is not inside a string literal.
std::string strip_comment(const std::string& line) {
  bool in_string = false;
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '"') in_string = !in_string;
    if (line[i] == '#' && !in_string) return line.substr(0, i);
  }
  return line;
}

bool is_ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_ident(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The dtypes a `where` line may name: npubridge's, as torch spells them
// (torch.float32 is "float32"; support/dtype.h has the one table), and the
// two complex ones torch has beside them, which ABI 1.5 patterns could name
// (a matched value of such a dtype is a host op's).
bool is_dtype_name(const std::string& w) {
  return dtype_from_name(w) != DType::kUnknown || w == "complex64" || w == "complex128";
}

// Reads one line's arguments and calls. Errors throw a plain message; the
// caller adds origin, line and pattern.
class LineReader {
 public:
  LineReader(const std::string& s, bool replacement) : s_(s), replacement_(replacement) {}

  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t')) ++pos_;
  }
  bool at_end() {
    skip_ws();
    return pos_ >= s_.size();
  }
  bool eat(char c) {
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c, const char* what) {
    if (!eat(c)) fail(std::string("expected ") + what);
  }
  [[noreturn]] void fail(const std::string& what) const {
    const std::string rest = pos_ < s_.size() ? "'" + s_.substr(pos_) + "'" : "the end of the line";
    throw std::invalid_argument(what + " at " + rest);
  }

  std::string ident() {
    skip_ws();
    const size_t b = pos_;
    if (pos_ >= s_.size() || !is_ident_start(s_[pos_])) fail("expected a name");
    while (pos_ < s_.size() && is_ident(s_[pos_])) ++pos_;
    return s_.substr(b, pos_ - b);
  }

  // ns::name or ns::name.overload
  std::string op_name() {
    skip_ws();
    const size_t b = pos_;
    ident();
    if (s_.compare(pos_, 2, "::") != 0) fail("expected an operator 'ns::name[.overload]'");
    pos_ += 2;
    ident();
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      ident();
    }
    return s_.substr(b, pos_ - b);
  }

  int32_t ret_index() {
    if (!eat('[')) return 0;
    skip_ws();
    const size_t b = pos_;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    if (b == pos_ || pos_ - b > 3) fail("expected a return index [k]");
    const int32_t k = std::atoi(s_.substr(b, pos_ - b).c_str());
    expect(']', "']' after the return index");
    return k;
  }

  // op(args)[k], the op already read.
  PatternArg call_rest(std::string op) {
    PatternArg c;
    c.kind = PatternArg::kCall;
    c.op = std::move(op);
    expect('(', "'(' after the operator");
    if (!eat(')')) {
      do c.items.push_back(arg());
      while (eat(','));
      expect(')', "',' or ')' in the argument list");
    }
    c.ret = ret_index();
    return c;
  }

  PatternArg arg() {
    skip_ws();
    if (pos_ >= s_.size()) fail("expected an argument");
    const char c = s_[pos_];
    PatternArg a;
    if (c == '%') {
      ++pos_;
      a.kind = PatternArg::kValue;
      a.name = ident();
      if (s_.compare(pos_, 6, ".size(") == 0) {
        if (!replacement_) fail("%x.size(d) is allowed in the replacement only");
        pos_ += 6;
        a.kind = PatternArg::kSize;
        PatternConst d = number();
        if (d.kind != PatternConst::kInt) fail("expected an integer dimension in .size()");
        a.dim = d.i;
        expect(')', "')' after the dimension");
      }
      return a;
    }
    if (c == '$') {
      ++pos_;
      a.kind = PatternArg::kCapture;
      a.name = ident();
      return a;
    }
    if (c == '[') {
      ++pos_;
      std::vector<PatternArg> items;
      if (!eat(']')) {
        do items.push_back(arg());
        while (eat(','));
        expect(']', "',' or ']' in the list");
      }
      // A list of literals is one literal; one holding a value or a
      // capture stays a list of arguments.
      const bool all_const = std::all_of(items.begin(), items.end(),
                                         [](const PatternArg& x) { return x.kind == PatternArg::kConst; });
      if (all_const) {
        a.kind = PatternArg::kConst;
        a.value.kind = PatternConst::kList;
        for (auto& x : items) a.value.items.push_back(std::move(x.value));
      } else {
        for (const auto& x : items)
          if (x.kind == PatternArg::kAny || x.kind == PatternArg::kCall)
            fail("a list holds values, captures and literals only");
        a.kind = PatternArg::kList;
        a.items = std::move(items);
      }
      return a;
    }
    if (c == '"') {
      const size_t end = s_.find('"', pos_ + 1);
      if (end == std::string::npos) fail("unterminated string");
      a.kind = PatternArg::kConst;
      a.value.kind = PatternConst::kString;
      a.value.s = s_.substr(pos_ + 1, end - pos_ - 1);
      pos_ = end + 1;
      return a;
    }
    if (c == '-' || c == '+' || c == '.' || std::isdigit(static_cast<unsigned char>(c))) {
      a.kind = PatternArg::kConst;
      a.value = number();
      return a;
    }
    if (is_ident_start(c)) {
      const size_t b = pos_;
      const std::string word = ident();
      if (s_.compare(pos_, 2, "::") == 0) {
        if (!replacement_) fail("a nested call is allowed in the replacement only");
        pos_ = b;
        return call_rest(op_name());
      }
      a.kind = PatternArg::kConst;
      if (word == "_") {
        if (replacement_) fail("'_' matches anything and cannot be passed by a replacement");
        a.kind = PatternArg::kAny;
      } else if (word == "True" || word == "False") {
        a.value.kind = PatternConst::kBool;
        a.value.b = word == "True";
      } else if (word == "None") {
        a.value.kind = PatternConst::kNone;
      } else {
        pos_ = b;
        fail("unknown argument '" + word + "' (expected %value, $capture, _, a literal or a list)");
      }
      return a;
    }
    fail("unexpected character '" + std::string(1, c) + "'");
  }

  // One side of a `where` line (PatternTerm).
  PatternTerm term() {
    skip_ws();
    if (pos_ >= s_.size()) fail("expected a term (%v.dim(), %v.size(d), %v.dtype, $capture or a literal)");
    PatternTerm t;
    const char c = s_[pos_];
    if (c == '%') {
      ++pos_;
      t.name = ident();
      if (s_.compare(pos_, 6, ".dim()") == 0) {
        pos_ += 6;
        t.kind = PatternTerm::kDim;
      } else if (s_.compare(pos_, 6, ".size(") == 0) {
        pos_ += 6;
        const PatternConst d = number();
        if (d.kind != PatternConst::kInt) fail("expected an integer dimension in .size()");
        t.kind = PatternTerm::kSize;
        t.dim = d.i;
        expect(')', "')' after the dimension");
      } else if (s_.compare(pos_, 6, ".dtype") == 0 && (pos_ + 6 == s_.size() || !is_ident(s_[pos_ + 6]))) {
        pos_ += 6;
        t.kind = PatternTerm::kDtype;
      } else {
        fail("expected .dim(), .size(d) or .dtype after '%" + t.name + "'");
      }
      return t;
    }
    if (c == '$') {
      ++pos_;
      t.kind = PatternTerm::kCapture;
      t.name = ident();
      return t;
    }
    if (is_ident_start(c)) {
      const size_t b = pos_;
      const std::string word = ident();
      if (is_dtype_name(word)) {
        t.kind = PatternTerm::kDtypeName;
        t.name = word;
        return t;
      }
      pos_ = b;
      if (word != "True" && word != "False" && word != "None")
        fail("unknown term '" + word +
             "' (expected %v.dim(), %v.size(d), %v.dtype, $capture, a literal or a dtype "
             "such as float32)");
    }
    const PatternArg a = arg();
    if (a.kind != PatternArg::kConst) fail("expected a literal");
    t.kind = PatternTerm::kConst;
    t.value = a.value;
    return t;
  }

  // `<term> ==|!= <term>`, the rest of a `where` line.
  PatternConstraint constraint() {
    PatternConstraint w;
    w.lhs = term();
    skip_ws();
    if (s_.compare(pos_, 2, "==") == 0) {
      w.equal = true;
    } else if (s_.compare(pos_, 2, "!=") == 0) {
      w.equal = false;
    } else {
      fail("expected '==' or '!='");
    }
    pos_ += 2;
    w.rhs = term();
    if (!at_end()) fail("unexpected text after the condition");
    return w;
  }

  PatternConst number() {
    skip_ws();
    const size_t b = pos_;
    if (pos_ < s_.size() && (s_[pos_] == '-' || s_[pos_] == '+')) ++pos_;
    bool is_float = false, digits = false;
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (std::isdigit(static_cast<unsigned char>(c))) {
        digits = true;
      } else if (c == '.') {
        is_float = true;
      } else if ((c == 'e' || c == 'E') && digits) {
        is_float = true;
        if (pos_ + 1 < s_.size() && (s_[pos_ + 1] == '-' || s_[pos_ + 1] == '+')) ++pos_;
      } else {
        break;
      }
      ++pos_;
    }
    const std::string text = s_.substr(b, pos_ - b);
    if (!digits) {
      pos_ = b;
      fail("expected a number");
    }
    PatternConst v;
    // std::from_chars: independent of the C locale (strtod under an
    // LC_NUMERIC with a decimal comma would read "2.0" as malformed and so
    // reject the plugin). It takes no leading '+'.
    const char* first = text.c_str() + (text[0] == '+' ? 1 : 0);
    const char* last = text.c_str() + text.size();
    std::from_chars_result r{};
    if (is_float) {
      v.kind = PatternConst::kFloat;
      r = std::from_chars(first, last, v.d);
    } else {
      v.kind = PatternConst::kInt;
      r = std::from_chars(first, last, v.i, 10);
      if (r.ec == std::errc::result_out_of_range) {
        pos_ = b;
        fail("integer out of range");
      }
    }
    if (r.ec != std::errc() || r.ptr != last) {
      pos_ = b;
      fail("malformed number '" + text + "'");
    }
    return v;
  }

 private:
  const std::string& s_;
  bool replacement_;
  size_t pos_ = 0;
};

// The names an argument uses (values and sizes), for the binding checks.
void used_values(const PatternArg& a, std::vector<std::string>* values, std::vector<std::string>* captures) {
  if (a.kind == PatternArg::kValue || a.kind == PatternArg::kSize) values->push_back(a.name);
  if (a.kind == PatternArg::kCapture) captures->push_back(a.name);
  for (const auto& x : a.items) used_values(x, values, captures);
}

// Every value and capture a `where` line names is bound by the subgraph.
template <class Fail>
void check_constraint_names(const FusionPattern& p, Fail fail) {
  std::vector<std::string> values, captures;
  for (const auto& n : p.nodes) {
    values.push_back(n.out);
    for (const auto& a : n.args) used_values(a, &values, &captures);
  }
  auto bound = [](const std::vector<std::string>& v, const std::string& x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  };
  for (const auto& w : p.constraints)
    for (const PatternTerm* t : {&w.lhs, &w.rhs}) {
      const bool is_value =
          t->kind == PatternTerm::kDim || t->kind == PatternTerm::kSize || t->kind == PatternTerm::kDtype;
      if (is_value && !bound(values, t->name))
        fail(w.line, "the condition uses '%" + t->name + "', which the subgraph does not bind");
      if (t->kind == PatternTerm::kCapture && !bound(captures, t->name))
        fail(w.line, "the condition uses '$" + t->name + "', which the subgraph does not capture");
    }
}

}  // namespace

std::vector<FusionPattern> parse_fusion_patterns(const std::string& text, const std::string& origin) {
  std::vector<FusionPattern> out;
  std::istringstream in(text);
  std::string raw;
  int32_t line_no = 0;
  FusionPattern* cur = nullptr;
  bool have_replacement = false;
  std::vector<std::string> text_lines;
  auto fail = [&](const std::string& what) {
    std::string where = origin + ", line " + std::to_string(line_no);
    if (cur != nullptr) where += ", pattern '" + cur->name + "'";
    throw FusionPatternError(where + ": " + what);
  };
  while (std::getline(in, raw)) {
    ++line_no;
    const std::string line = trim(strip_comment(raw));
    if (line.empty()) continue;
    if (cur == nullptr) {
      if (line.rfind("pattern ", 0) != 0 && line != "pattern")
        fail("expected 'pattern <name> [priority <int>]' but found '" + line + "'");
      std::istringstream words(line.substr(7));
      std::string name, kw, prio, extra;
      words >> name >> kw >> prio >> extra;
      if (name.empty()) fail("a pattern needs a name: 'pattern <name> [priority <int>]'");
      if (!is_ident_start(name[0]) || !std::all_of(name.begin(), name.end(), is_ident))
        fail("pattern name '" + name + "' must be [A-Za-z_][A-Za-z0-9_]*");
      out.emplace_back();
      cur = &out.back();
      cur->name = name;
      cur->line = line_no;
      have_replacement = false;
      text_lines.clear();
      if (!kw.empty()) {
        char* end = nullptr;
        const long v = prio.empty() ? 0 : std::strtol(prio.c_str(), &end, 10);
        if (kw != "priority" || prio.empty() || *end != '\0' || !extra.empty() || v < -1000000 || v > 1000000)
          fail("expected 'pattern " + name + " [priority <int>]' but found '" + line + "'");
        cur->priority = static_cast<int32_t>(v);
      }
      for (const auto& p : out)
        if (&p != cur && p.name == name) fail("pattern name '" + name + "' is used twice in this text");
      text_lines.push_back(line);
      continue;
    }
    text_lines.push_back(line == "end" ? line : "  " + line);
    if (line == "end") {
      if (cur->nodes.empty()) fail("the pattern has no subgraph lines");
      if (!have_replacement) fail("the pattern has no replacement line ('=> op(...)')");
      check_constraint_names(*cur, [&](int32_t line, const std::string& what) {
        line_no = line;
        fail(what);
      });
      for (size_t k = 0; k < text_lines.size(); ++k) cur->text += text_lines[k] + "\n";
      cur = nullptr;
      continue;
    }
    try {
      if (line.rfind("where ", 0) == 0 || line == "where") {
        const std::string cond = line.substr(5);  // LineReader keeps a reference
        LineReader r(cond, false);
        PatternConstraint w = r.constraint();
        w.line = line_no;
        cur->constraints.push_back(std::move(w));
        continue;
      }
      if (line.rfind("=>", 0) == 0) {
        const std::string body = trim(line.substr(2));
        if (!body.empty() && body[0] == '%') {  // => %name <- [k]
          if (!have_replacement) fail("'=> %name <- [k]' must follow the replacement line");
          LineReader r(body, true);
          r.eat('%');
          PatternExtraOutput e;
          e.name = r.ident();
          r.skip_ws();
          if (!r.eat('<') || !r.eat('-')) r.fail("expected '<-' after the value");
          r.skip_ws();
          e.ret = r.ret_index();
          if (!r.at_end()) r.fail("unexpected text after the return index");
          const bool known = std::any_of(cur->nodes.begin(), cur->nodes.end(),
                                         [&](const PatternNode& n) { return n.out == e.name; });
          if (!known)
            fail("'%" + e.name + "' in '=> %" + e.name + " <- [k]' is not a subgraph line's output");
          if (e.name == cur->nodes.back().out)
            fail("the last line's value is replaced by the replacement itself");
          for (const auto& x : cur->extra_outputs)
            if (x.name == e.name) fail("'%" + e.name + "' is replaced twice");
          cur->extra_outputs.push_back(e);
          continue;
        }
        if (have_replacement) fail("the pattern has two replacement lines");
        LineReader r(body, true);
        PatternArg c = r.call_rest(r.op_name());
        if (!r.at_end()) r.fail("unexpected text after the replacement");
        // Every value the replacement uses is bound by the subgraph.
        std::vector<std::string> values, captures;
        used_values(c, &values, &captures);
        std::vector<std::string> bound_values, bound_captures;
        for (const auto& n : cur->nodes) {
          bound_values.push_back(n.out);
          for (const auto& a : n.args) used_values(a, &bound_values, &bound_captures);
        }
        for (const auto& v : values)
          if (std::find(bound_values.begin(), bound_values.end(), v) == bound_values.end())
            fail("the replacement uses '%" + v + "', which the subgraph does not bind");
        for (const auto& v : captures)
          if (std::find(bound_captures.begin(), bound_captures.end(), v) == bound_captures.end())
            fail("the replacement uses '$" + v + "', which the subgraph does not capture");
        cur->replacement = std::move(c);
        cur->replacement_line = line_no;
        have_replacement = true;
        continue;
      }
      if (have_replacement) fail("a subgraph line after the replacement line");
      LineReader r(line, false);
      if (!r.eat('%')) r.fail("expected '%<name> = <op>(<args>)'");
      PatternNode n;
      n.line = line_no;
      n.out = r.ident();
      if (!r.eat('=')) r.fail("expected '=' after '%" + n.out + "'");
      const PatternArg c = r.call_rest(r.op_name());
      if (!r.at_end()) r.fail("unexpected text after the call");
      n.op = c.op;
      n.args = c.items;
      n.ret = c.ret;
      for (const auto& prev : cur->nodes)
        if (prev.out == n.out) fail("'%" + n.out + "' is assigned twice");
      // A line's own output is not yet defined.
      std::vector<std::string> values, captures;
      for (const auto& a : n.args) used_values(a, &values, &captures);
      if (std::find(values.begin(), values.end(), n.out) != values.end())
        fail("'%" + n.out + "' is used before it is assigned");
      // An input used before a later line assigns the same name.
      cur->nodes.push_back(std::move(n));
    } catch (const std::invalid_argument& e) {
      fail(e.what());
    }
  }
  if (cur != nullptr) fail("missing 'end' of the pattern that starts at line " + std::to_string(cur->line));
  if (out.empty()) {
    line_no = 0;
    throw FusionPatternError(origin + ": no 'pattern <name> ... end' block in the text");
  }
  // A name used by a line before a later line assigns it would mean two
  // values at once.
  for (const auto& p : out) {
    for (size_t k = 0; k < p.nodes.size(); ++k)
      for (const auto& a : p.nodes[k].args) {
        std::vector<std::string> values, captures;
        used_values(a, &values, &captures);
        for (size_t j = k + 1; j < p.nodes.size(); ++j)
          if (std::find(values.begin(), values.end(), p.nodes[j].out) != values.end())
            throw FusionPatternError(
                origin + ", line " + std::to_string(p.nodes[k].line) + ", pattern '" + p.name + "': '%" +
                p.nodes[j].out +
                "' is used before the line that assigns it (lines are in topological order)");
      }
  }
  return out;
}

}  // namespace npub::reg
