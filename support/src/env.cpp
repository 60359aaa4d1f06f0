#include <npubridge/support/env.h>
#include <npubridge/support/error.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace npub::env {

// Note [Messages quote values safely]
// A value from the environment may hold any bytes
// (NPUB_SIM_DEVICES=$'\xff\xfe'). Quoted as they are, they make the message
// invalid UTF-8, and pybind11 then fails to decode it (UnicodeDecodeError
// instead of the message naming the variable). So every byte outside
// printable ASCII is written as an escape.
std::string quote(const std::string& value) {
  static const char* const hex = "0123456789abcdef";
  std::string out = "'";
  for (const char ch : value) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\'') {
      out += "\\'";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c >= 0x7f) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 0xf];
    } else {
      out += ch;
    }
  }
  return out + "'";
}

// The value with surrounding white space removed (NPUB_SIM_MEMORY="64M "
// means 64M: nothing else can be meant); unset or blank: nullopt.
std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  std::string s(v);
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return std::nullopt;
  s = s.substr(first, s.find_last_not_of(" \t\r\n") - first + 1);
  return s;
}

int64_t parse_int_in(const std::string& text, const char* name, int64_t lo, int64_t hi, const char* what) {
  auto refuse = [&] {
    return Error(ErrorCode::kInvalidArgument, std::string(name) + ": expected " + what + " from " +
                                                  std::to_string(lo) + " to " + std::to_string(hi) +
                                                  " but found " + quote(text));
  };
  // strtoll alone would take "+5", " 5" and "0x5"; only [-]digits are a number here.
  const size_t digits = text.find_first_not_of("0123456789", text[0] == '-' ? 1 : 0);
  if (text.empty() || text == "-" || digits != std::string::npos) throw refuse();
  errno = 0;
  const long long x = std::strtoll(text.c_str(), nullptr, 10);
  if (errno != 0 || x < lo || x > hi) throw refuse();
  return x;
}

int64_t get_int_in(const char* name, int64_t fallback, int64_t lo, int64_t hi, const char* what) {
  auto v = get(name);
  return v ? parse_int_in(*v, name, lo, hi, what) : fallback;
}

namespace {

// For a size with a fraction ("1.5G"): the same size as a whole number of
// a smaller unit when there is one ("1536M"), else a plain example.
std::string whole_example(const std::string& text) {
  const char* units = "BKMGT";
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  std::string unit(end);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const size_t shift = unit.empty() ? 0 : std::string(units).find(unit[0]);
  if (shift != std::string::npos && shift > 0 && x > 0 && x < 1e12) {
    for (size_t smaller = shift; smaller-- > 0;) {
      const double v = std::ldexp(x, static_cast<int>(10 * (shift - smaller)));
      if (v == std::floor(v) && v < 9e15) {
        char buf[48];
        std::snprintf(buf, sizeof buf, "%.0f%s", v,
                      smaller == 0 ? "" : std::string(1, units[smaller]).c_str());
        return buf;
      }
    }
  }
  return "1536M";
}

}  // namespace

uint64_t parse_bytes(const std::string& text, const char* what) {
  char* end = nullptr;
  errno = 0;
  unsigned long long x = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || text.empty() || !std::isdigit(static_cast<unsigned char>(text[0])))
    throw Error(
        ErrorCode::kInvalidArgument,
        std::string(what) + ": expected a size such as 16G, 512M or 1048576 but found " + quote(text));
  std::string unit(end);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (!unit.empty() && unit.back() == 'B' && unit.size() > 1) unit.pop_back();  // "GB", "MiB"
  if (unit.size() == 2 && unit[1] == 'I') unit.pop_back();
  int shift = 0;
  if (unit.empty() || unit == "B")
    shift = 0;
  else if (unit == "K")
    shift = 10;
  else if (unit == "M")
    shift = 20;
  else if (unit == "G")
    shift = 30;
  else if (unit == "T")
    shift = 40;
  else if (unit.size() >= 2 && unit[0] == '.' && std::isdigit(static_cast<unsigned char>(unit[1])))
    throw Error(ErrorCode::kInvalidArgument, std::string(what) + ": " + quote(text) +
                                                 ": expected a whole number of bytes, K, M, G or T such as " +
                                                 whole_example(text));
  else
    throw Error(ErrorCode::kInvalidArgument,
                std::string(what) + ": unknown unit in " + quote(text) + " (expected K, M, G or T)");
  if (shift > 0 && x > (~0ull >> shift))
    throw Error(ErrorCode::kInvalidArgument,
                std::string(what) + ": expected a size below 2^64 bytes but found " + quote(text));
  return static_cast<uint64_t>(x) << shift;
}

uint64_t get_bytes(const char* name, uint64_t fallback) {
  auto v = get(name);
  return v ? parse_bytes(*v, name) : fallback;
}

uint64_t get_positive_bytes(const char* name, uint64_t fallback) {
  auto v = get(name);
  if (!v) return fallback;
  const uint64_t n = parse_bytes(*v, name);
  if (n == 0)
    throw Error(ErrorCode::kInvalidArgument,
                std::string(name) + ": expected a positive size but found " + quote(*v));
  if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    throw Error(ErrorCode::kInvalidArgument,
                std::string(name) + ": expected a size below 2^63 bytes but found " + quote(*v));
  return n;
}

bool get_flag(const char* name, bool fallback) {
  auto v = get(name);
  if (!v) return fallback;
  const std::string& s = *v;
  if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
  if (s == "0" || s == "false" || s == "off" || s == "no") return false;
  throw Error(ErrorCode::kInvalidArgument,
              std::string(name) + ": expected 0 or 1 (or false/true, off/on, no/yes) but found " + quote(s));
}

std::optional<std::string> get_choice(const char* name, std::initializer_list<const char*> choices) {
  auto v = get(name);
  if (!v) return v;
  std::string listed;
  for (const char* c : choices) {
    if (*v == c) return v;
    listed += (listed.empty() ? "" : ", ") + std::string(c);
  }
  throw Error(ErrorCode::kInvalidArgument,
              std::string(name) + ": expected one of " + listed + " but found " + quote(*v));
}

}  // namespace npub::env
