#include <npubridge/registry/schema.h>

#include <gtest/gtest.h>

#include <random>
#include <string>

using namespace npub::reg;

TEST(Schema, ParsesAtenAddOut) {
  Schema s = parse_schema(
      "aten::add.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)");
  EXPECT_EQ(s.ns, "aten");
  EXPECT_EQ(s.name, "add");
  EXPECT_EQ(s.overload, "out");
  ASSERT_EQ(s.arguments.size(), 4u);
  EXPECT_FALSE(s.arguments[1].kwarg_only);
  EXPECT_TRUE(s.arguments[2].kwarg_only);
  EXPECT_EQ(s.arguments[2].type.base, BaseType::kScalar);
  ASSERT_TRUE(s.arguments[2].default_value);
  EXPECT_EQ(s.arguments[2].default_value->value.tag, NPUB_VALUE_INT);
  EXPECT_EQ(s.arguments[2].default_value->value.u.i, 1);
  ASSERT_TRUE(s.arguments[3].alias);
  EXPECT_TRUE(s.arguments[3].alias->is_write);
  EXPECT_EQ(s.arguments[3].alias->set, "a");
  ASSERT_EQ(s.returns.size(), 1u);
  EXPECT_TRUE(s.returns[0].alias->is_write);
  EXPECT_EQ(s.qualified_name(), "aten::add.out");
}

TEST(Schema, ParsesEveryTypeForm) {
  Schema s = parse_schema(
      "ns::f(Tensor? a, Tensor[] b, Tensor?[] c, int[] d, *, int[2] e=1, SymInt f, SymInt[]? g=None, "
      "float h=1e-05, bool i=False, str j=\"mean\", ScalarType? k=None, Device? l=None, Layout? m=None, "
      "MemoryFormat n=contiguous_format, Generator? o=None, Tensor(a!)[] p, float[]? q=None, "
      "Scalar r=-2.5, int s=-3, bool[3] t=[True, False, True]) -> (Tensor out0, Tensor(b) out1, int)");
  ASSERT_EQ(s.arguments.size(), 20u);
  EXPECT_TRUE(s.arguments[0].type.optional);
  EXPECT_TRUE(s.arguments[1].type.list);
  EXPECT_TRUE(s.arguments[2].type.list);
  EXPECT_TRUE(s.arguments[2].type.element_optional);
  EXPECT_FALSE(s.arguments[2].type.optional);
  EXPECT_EQ(s.arguments[4].type.fixed_size, 2);
  EXPECT_EQ(s.arguments[4].default_value->value.tag, NPUB_VALUE_INT_LIST);
  EXPECT_EQ(s.arguments[4].default_value->value.count, 2);
  EXPECT_TRUE(s.arguments[6].type.optional && s.arguments[6].type.list);
  EXPECT_DOUBLE_EQ(s.arguments[7].default_value->value.u.d, 1e-05);
  EXPECT_EQ(s.arguments[8].default_value->value.tag, NPUB_VALUE_BOOL);
  EXPECT_EQ(std::string(s.arguments[9].default_value->value.u.s), "mean");
  EXPECT_FALSE(s.arguments[13].default_value->boxable);  // contiguous_format
  EXPECT_TRUE(s.arguments[15].alias && s.arguments[15].alias->is_write && s.arguments[15].type.list);
  EXPECT_DOUBLE_EQ(s.arguments[17].default_value->value.u.d, -2.5);
  EXPECT_EQ(s.arguments[18].default_value->value.u.i, -3);
  ASSERT_EQ(s.returns.size(), 3u);
  EXPECT_EQ(s.returns[0].name, "out0");
  EXPECT_EQ(s.returns[2].type.base, BaseType::kInt);
}

TEST(Schema, RoundTripsThroughCanonicalText) {
  const char* texts[] = {
      "aten::add.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)",
      "aten::native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float "
      "eps) -> (Tensor, Tensor, Tensor)",
      "aten::max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)",
      "aten::index.Tensor(Tensor self, Tensor?[] indices) -> Tensor",
      "aten::split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0) -> Tensor(a)[]",
      "aten::_foreach_add_.Scalar(Tensor(a!)[] self, Scalar scalar) -> ()",
      "aten::nonzero(Tensor self) -> Tensor",
  };
  for (const char* t : texts) {
    Schema a = parse_schema(t);
    EXPECT_EQ(a.to_string(), t);
    Schema b = parse_schema(a.to_string());
    EXPECT_EQ(a.to_string(), b.to_string());
  }
  // Whitespace does not matter.
  EXPECT_EQ(parse_schema("ns::f( Tensor  self ,int x = 3 )->Tensor").to_string(),
            parse_schema("ns::f(Tensor self, int x=3) -> Tensor").to_string());
}

TEST(Schema, ErrorsNamePositionAndExpectation) {
  auto error = [](const std::string& text) {
    try {
      parse_schema(text);
    } catch (const SchemaError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error("add(Tensor self) -> Tensor").find("expected '::'"), std::string::npos);
  EXPECT_NE(error("ns::f(Tensor self, -> Tensor").find("expected a type"), std::string::npos);
  EXPECT_NE(error("ns::f(Tensr self) -> Tensor").find("character 7"), std::string::npos);
  EXPECT_NE(error("ns::f(Tensor self) Tensor").find("expected '->'"), std::string::npos);
  EXPECT_NE(error("ns::f(Tensor self) -> Tensor junk junk").find("end of schema"), std::string::npos);
  EXPECT_NE(error("ns::f(Tensor a, Tensor a) -> Tensor").find("appears twice"), std::string::npos);
  EXPECT_NE(error("ns::f(int x=1.5) -> Tensor").find("integer default"), std::string::npos);
  EXPECT_NE(error("ns::f(str s=\"open) -> Tensor").find("closing"), std::string::npos);
  EXPECT_NE(error("").find("end of text"), std::string::npos);
  EXPECT_NE(error(std::string(5000, 'a')).find("longer than 4096"), std::string::npos);
}

// Note [Defaults PyTorch takes] (registry/src/schema.cpp): each schema here
// is one PyTorch 2.13 refuses (tests/python/test_schema_parity.py feeds the
// same list to torch), refused at plugin load with its position. One case
// per rule.
TEST(Schema, RefusesWhatPyTorchRefusesWithThePosition) {
  struct Case {
    const char* args;  // inside "ns::f(...) -> Tensor"
    int column;
    const char* expected;
    const char* found;
  };
  const Case cases[] = {
      // A Tensor's only default is None; a Tensor list takes none.
      {"Tensor x=5", 16, "None (the only default of a Tensor)", "5"},
      {"Tensor x=contiguous_format", 16, "None (the only default of a Tensor)", "contiguous_format"},
      {"Tensor[] x=[]", 18, "no default (a Tensor list takes none)", "[]"},
      {"Tensor? x=[]", 17, "None for an optional Tensor", "[]"},
      // A Device's is a string.
      {"Device d=None", 16, "a device string such as \"cpu\" (the only default of a Device)", "None"},
      // Numbers: finite, no '+', within a double, integers within int64.
      {"float x=1e999", 15, "a number a double holds (no overflow or underflow)", "1e999"},
      {"float x=1e-999", 15, "a number a double holds (no overflow or underflow)", "1e-999"},
      {"int x=9223372036854775808", 13, "an integer within int64 (-2^63 to 2^63-1)", "9223372036854775808"},
      {"Scalar x=9223372036854775808", 16, "an integer within int64 (-2^63 to 2^63-1)",
       "9223372036854775808"},
      {"float x=inf", 15, "a finite number (PyTorch takes no inf or nan)", "inf"},
      {"Scalar x=-inf", 16, "a finite number (PyTorch takes no inf or nan)", "-inf"},
      {"int x=+3", 13, "a number without '+'", "+3"},
      // Names: PyTorch's six.
      {"int x=Sum", 13,
       "a finite number, True, False, None, a string, a list or one of the names long, float, complex, "
       "strided, "
       "contiguous_format, Mean",
       "Sum"},
      // Lists: [...] only for int, SymInt, float and bool lists, not optional,
      // items of the list's type; a single value only for a sized list.
      {"Scalar[] x=[1]", 18, "no list default (only int, SymInt, float and bool lists take one)", "[1]"},
      {"int[]? x=[1]", 16, "None or a single value (PyTorch takes no [...] for an optional list)", "[1]"},
      {"int[] x=1", 15, "a list in [ ] (only a sized list such as int[2] takes a single value)", "1"},
      {"int[] x=[1, True]", 15, "an integer for each item of an int list", "[1, True]"},
      {"bool[2] x=[1, 0]", 17, "True or False for each item of a bool list", "[1, 0]"},
      {"bool[2] x=1", 17, "True or False for each item of a bool list", "1"},
      {"float[] x=[1, True]", 17, "a number for each item of a float list", "[1, True]"},
      // A positional argument after a defaulted one needs a default.
      {"Tensor a, int x=1, Tensor y", 26,
       "a default for 'y' (it follows a defaulted positional argument) or a '*' before it", "Tensor y"},
  };
  for (const Case& c : cases) {
    const std::string text = std::string("ns::f(") + c.args + ") -> Tensor";
    try {
      parse_schema(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const SchemaError& e) {
      EXPECT_EQ(std::string(e.what()), "invalid schema at character " + std::to_string(c.column) +
                                           ": expected " + c.expected + " but found '" + c.found + "' in \"" +
                                           text + "\"");
    }
  }
  // What PyTorch takes is taken: keyword-only arguments may follow defaults,
  // a sized list a single value, an optional Tensor anything but a list.
  for (const char* ok : {"Tensor a, int x=1, *, Tensor y, int z=2, Tensor w", "int[2] x=1", "bool[2] x=True",
                         "float[] x=[1, 2]", "int[]? x=1", "Tensor? x=5", "int x=Mean", "float x=-1.5E3",
                         "float x=9223372036854775808", "Device d='cpu'", "bool b=2", "str s=1"})
    EXPECT_NO_THROW(parse_schema(std::string("ns::f(") + ok + ") -> Tensor")) << ok;
}

// Garbage and mutated schemas: the parser must reject or accept, never crash
// or read out of bounds (this runs under ASan in CI).
TEST(Schema, FuzzNeverCrashes) {
  const std::string seeds[] = {
      "aten::add.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)",
      "ns::f(Tensor?[] a, int[2] b=[1, 2], str c='x', float d=-1e-05) -> (Tensor x, Tensor(b) y)",
      "aten::split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0) -> Tensor(a)[]",
  };
  const std::string alphabet = "abcnsTe:()[]?!*,-=>|.'\"0129 \t\\_";
  std::mt19937 rng(12345);
  int parsed = 0, rejected = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string s;
    if (iter % 2 == 0) {
      s = seeds[rng() % 3];
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits && !s.empty(); ++e) {
        const size_t pos = rng() % s.size();
        switch (rng() % 3) {
          case 0:
            s.erase(pos, 1 + rng() % 3);
            break;
          case 1:
            s.insert(pos, 1, alphabet[rng() % alphabet.size()]);
            break;
          default:
            s[pos] = alphabet[rng() % alphabet.size()];
            break;
        }
      }
      if (rng() % 5 == 0) s = s.substr(0, rng() % (s.size() + 1));
    } else {
      const size_t len = rng() % 80;
      for (size_t i = 0; i < len; ++i) s.push_back(static_cast<char>(rng() % 256));
    }
    try {
      Schema sc = parse_schema(s);
      // Whatever parses must print and re-parse to the same text.
      EXPECT_EQ(parse_schema(sc.to_string()).to_string(), sc.to_string()) << s;
      ++parsed;
    } catch (const SchemaError&) {
      ++rejected;
    }
  }
  EXPECT_GT(parsed, 0);
  EXPECT_GT(rejected, 0);
}

// vllm_like::rotary_embedding writes an optional tensor (key may be None).
TEST(Schema, ParsesAWrittenOptionalTensor) {
  const char* text =
      "vllm_like::rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!)? key, int head_size, "
      "Tensor cos_sin_cache, bool is_neox) -> ()";
  Schema s = parse_schema(text);
  ASSERT_EQ(s.arguments.size(), 6u);
  const Argument& key = s.arguments[2];
  EXPECT_TRUE(key.type.optional);
  EXPECT_EQ(key.type.base, BaseType::kTensor);
  ASSERT_TRUE(key.alias);
  EXPECT_TRUE(key.is_write());
  EXPECT_EQ(key.alias->set, "b");
  EXPECT_TRUE(s.returns.empty());
  EXPECT_EQ(s.to_string(), text);
}
