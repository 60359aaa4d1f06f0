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
      "ns::f(Tensor? a, Tensor[] b, Tensor?[] c, int[] d, int[2] e=1, SymInt f, SymInt[]? g=None, "
      "float h=1e-05, bool i=False, str j=\"mean\", ScalarType? k=None, Device? l=None, Layout? m=None, "
      "MemoryFormat n=contiguous_format, Generator? o=None, Tensor(a!)[] p, float[]? q=None, "
      "Scalar r=-inf, int s=-3, bool[3] t=[True, False, True]) -> (Tensor out0, Tensor(b) out1, int)");
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
  EXPECT_TRUE(std::isinf(s.arguments[17].default_value->value.u.d));
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

// Garbage and mutated schemas: the parser must reject or accept, never crash
// or read out of bounds (this runs under ASan in CI).
TEST(Schema, FuzzNeverCrashes) {
  const std::string seeds[] = {
      "aten::add.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)",
      "ns::f(Tensor?[] a, int[2] b=[1, 2], str c='x', float d=-inf) -> (Tensor x, Tensor(b) y)",
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
