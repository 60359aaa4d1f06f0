// The fusion-pattern text format (registry/src/fusion_pattern.cpp): good
// texts parse to the agreed form, bad ones fail with a message naming the
// origin, the line and the pattern.
#include <gtest/gtest.h>

#include <npubridge/registry/fusion_pattern.h>
#include <npubridge/registry/op_registry.h>
#include <npubridge/registry/schema.h>

#include <clocale>
#include <map>
#include <string>

using namespace npub::reg;

namespace {

std::string parse_error(const std::string& text) {
  try {
    parse_fusion_patterns(text, "t.pat");
  } catch (const FusionPatternError& e) {
    return e.what();
  }
  return "(parsed)";
}

constexpr const char* kRmsNorm = R"(# the RMSNorm composite
pattern rms_norm priority 20
  %sq = aten::pow.Tensor_Scalar(%x, 2)
  %var = aten::mean.dim(%sq, [-1], True)
  %ve = aten::add.Tensor(%var, $eps)     # eps is a float constant
  %r = aten::rsqrt(%ve)
  %n = aten::mul.Tensor(%x, %r)
  %y = aten::mul.Tensor(%gamma, %n)
  => mindspeed_like::npu_rms_norm(%x, %gamma, $eps)[0]
end
)";

}  // namespace

TEST(FusionPattern, ParsesTheRmsNormComposite) {
  const auto ps = parse_fusion_patterns(kRmsNorm, "t.pat");
  ASSERT_EQ(ps.size(), 1u);
  const FusionPattern& p = ps[0];
  EXPECT_EQ(p.name, "rms_norm");
  EXPECT_EQ(p.priority, 20);
  EXPECT_EQ(p.line, 2);
  ASSERT_EQ(p.nodes.size(), 6u);
  EXPECT_EQ(p.nodes[0].out, "sq");
  EXPECT_EQ(p.nodes[0].op, "aten::pow.Tensor_Scalar");
  ASSERT_EQ(p.nodes[0].args.size(), 2u);
  EXPECT_EQ(p.nodes[0].args[0].kind, PatternArg::kValue);
  EXPECT_EQ(p.nodes[0].args[0].name, "x");
  EXPECT_EQ(p.nodes[0].args[1].kind, PatternArg::kConst);
  EXPECT_EQ(p.nodes[0].args[1].value.kind, PatternConst::kInt);
  EXPECT_EQ(p.nodes[0].args[1].value.i, 2);
  const PatternArg& dims = p.nodes[1].args[1];
  ASSERT_EQ(dims.kind, PatternArg::kConst);
  ASSERT_EQ(dims.value.kind, PatternConst::kList);
  ASSERT_EQ(dims.value.items.size(), 1u);
  EXPECT_EQ(dims.value.items[0].i, -1);
  EXPECT_EQ(p.nodes[1].args[2].value.kind, PatternConst::kBool);
  EXPECT_TRUE(p.nodes[1].args[2].value.b);
  EXPECT_EQ(p.nodes[2].args[1].kind, PatternArg::kCapture);
  EXPECT_EQ(p.nodes[2].args[1].name, "eps");
  EXPECT_EQ(p.nodes[3].op, "aten::rsqrt");
  EXPECT_EQ(p.replacement.kind, PatternArg::kCall);
  EXPECT_EQ(p.replacement.op, "mindspeed_like::npu_rms_norm");
  EXPECT_EQ(p.replacement.ret, 0);
  EXPECT_EQ(p.replacement.to_string(), "mindspeed_like::npu_rms_norm(%x, %gamma, $eps)");
  EXPECT_EQ(p.replacement_line, 9);
  // The text is the block without comments, as it is listed.
  EXPECT_EQ(p.text.substr(0, 27), "pattern rms_norm priority 2");
  EXPECT_EQ(p.text.find('#'), std::string::npos);
  EXPECT_EQ(p.text.substr(p.text.size() - 4), "end\n");
}

TEST(FusionPattern, ParsesLiteralsSizesNestedCallsAndExtraOutputs) {
  const auto ps = parse_fusion_patterns(R"(
pattern a
  %s = aten::silu(%a)
  %y = aten::mul.Tensor(%s, %b)
  => ns::swiglu(aten::cat([%a, %b], -1), -1)
end
pattern b priority -3
  %o = aten::scaled_dot_product_attention(%q, %k, %v, None, 0.0, _, $scale, False)
  => ns::fa(%q, %k, %v, %q.size(1), "BNSD", 1e-6, -2.5, [1, 1], [], None)[0]
end
pattern c
  %s = aten::add.Tensor(%r, %h)
  %n = ns::norm(%s, %g, $eps)[0]
  => ns::add_norm(%r, %h, %g, $eps)[0]
  => %s <- [2]
end
)",
                                        "t.pat");
  ASSERT_EQ(ps.size(), 3u);
  const PatternArg& cat = ps[0].replacement.items[0];
  ASSERT_EQ(cat.kind, PatternArg::kCall);
  EXPECT_EQ(cat.op, "aten::cat");
  ASSERT_EQ(cat.items[0].kind, PatternArg::kList);
  EXPECT_EQ(cat.items[0].items[1].name, "b");
  EXPECT_EQ(ps[1].priority, -3);
  const auto& sdpa = ps[1].nodes[0].args;
  EXPECT_EQ(sdpa[3].value.kind, PatternConst::kNone);
  EXPECT_EQ(sdpa[4].value.kind, PatternConst::kFloat);
  EXPECT_EQ(sdpa[5].kind, PatternArg::kAny);
  const auto& fa = ps[1].replacement.items;
  EXPECT_EQ(fa[3].kind, PatternArg::kSize);
  EXPECT_EQ(fa[3].name, "q");
  EXPECT_EQ(fa[3].dim, 1);
  EXPECT_EQ(fa[4].value.s, "BNSD");
  EXPECT_DOUBLE_EQ(fa[5].value.d, 1e-6);
  EXPECT_DOUBLE_EQ(fa[6].value.d, -2.5);
  EXPECT_EQ(fa[7].value.to_string(), "[1, 1]");
  EXPECT_EQ(fa[8].value.kind, PatternConst::kList);
  EXPECT_TRUE(fa[8].value.items.empty());
  EXPECT_EQ(ps[2].nodes[1].ret, 0);
  ASSERT_EQ(ps[2].extra_outputs.size(), 1u);
  EXPECT_EQ(ps[2].extra_outputs[0].name, "s");
  EXPECT_EQ(ps[2].extra_outputs[0].ret, 2);
}

TEST(FusionPattern, BadTextsNameTheLineAndThePattern) {
  EXPECT_EQ(parse_error(""), "t.pat: no 'pattern <name> ... end' block in the text");
  EXPECT_EQ(parse_error("  %a = aten::relu(%x)\n"),
            "t.pat, line 1: expected 'pattern <name> [priority <int>]' but found '%a = aten::relu(%x)'");
  EXPECT_EQ(parse_error("pattern p priority high\n"),
            "t.pat, line 1, pattern 'p': expected 'pattern p [priority <int>]' but found 'pattern p priority "
            "high'");
  EXPECT_EQ(parse_error("pattern p\n  %a = aten::relu(%x)\n  => ns::f(%a)\n"),
            "t.pat, line 3, pattern 'p': missing 'end' of the pattern that starts at line 1");
  EXPECT_EQ(parse_error("pattern p\n  %a = aten::relu(%x)\nend\n"),
            "t.pat, line 3, pattern 'p': the pattern has no replacement line ('=> op(...)')");
  EXPECT_EQ(parse_error("pattern p\n  => ns::f(%a)\nend\n"),
            "t.pat, line 2, pattern 'p': the replacement uses '%a', which the subgraph does not bind");
  EXPECT_EQ(parse_error("pattern p\n  %a = relu(%x)\n  => ns::f(%a)\nend\n"),
            "t.pat, line 2, pattern 'p': expected an operator 'ns::name[.overload]' at '(%x)'");
  EXPECT_EQ(
      parse_error("pattern p\n  %a = aten::relu(%x, foo)\n  => ns::f(%a)\nend\n"),
      "t.pat, line 2, pattern 'p': unknown argument 'foo' (expected %value, $capture, _, a literal or a "
      "list) at 'foo)'");
  EXPECT_EQ(parse_error("pattern p\n  %a = aten::relu(%x\n  => ns::f(%a)\nend\n"),
            "t.pat, line 2, pattern 'p': expected ',' or ')' in the argument list at the end of the line");
  EXPECT_EQ(parse_error("pattern p\n  %a = aten::relu(%x)\n  %a = aten::relu(%a)\n  => ns::f(%a)\nend\n"),
            "t.pat, line 3, pattern 'p': '%a' is assigned twice");
  EXPECT_EQ(
      parse_error("pattern p\n  %a = aten::add.Tensor(%x, %b)\n  %b = aten::relu(%a)\n  => ns::f(%b)\nend\n"),
      "t.pat, line 2, pattern 'p': '%b' is used before the line that assigns it (lines are in "
      "topological order)");
  EXPECT_EQ(parse_error("pattern p\n  %a = aten::relu(%x)\n  => ns::f(%a, $c)\nend\n"),
            "t.pat, line 3, pattern 'p': the replacement uses '$c', which the subgraph does not capture");
  EXPECT_EQ(parse_error("pattern p\n  %a = aten::relu(%x.size(0))\n  => ns::f(%a)\nend\n"),
            "t.pat, line 2, pattern 'p': %x.size(d) is allowed in the replacement only at '.size(0))'");
  EXPECT_EQ(parse_error("pattern p\n  %a = aten::relu(%x)\n  => ns::f(_)\nend\n"),
            "t.pat, line 3, pattern 'p': '_' matches anything and cannot be passed by a replacement at ')'");
  EXPECT_EQ(parse_error("pattern p\n  %a = aten::relu(%x)\n  => ns::f(%a)\n  => ns::g(%a)\nend\n"),
            "t.pat, line 4, pattern 'p': the pattern has two replacement lines");
  EXPECT_EQ(parse_error("pattern p\n  %a = aten::relu(%x)\n  => ns::f(%a)\n  => %q <- [1]\nend\n"),
            "t.pat, line 4, pattern 'p': '%q' in '=> %q <- [k]' is not a subgraph line's output");
  EXPECT_EQ(parse_error("pattern p\n  %a = aten::relu(%x)\n  => ns::f(%a) extra\nend\n"),
            "t.pat, line 3, pattern 'p': unexpected text after the replacement at 'extra'");
  EXPECT_EQ(parse_error("pattern p\n  %a = aten::relu(%x, \"abc)\n  => ns::f(%a)\nend\n"),
            "t.pat, line 2, pattern 'p': unterminated string at '\"abc)'");
  EXPECT_EQ(parse_error("pattern p\n  %a = aten::relu(%x)\n  => ns::f(%a)\nend\npattern p\n  %a = "
                        "aten::relu(%x)\n  => ns::f(%a)\nend\n"),
            "t.pat, line 5, pattern 'p': pattern name 'p' is used twice in this text");
}

TEST(FusionPattern, ChecksTheReplacementAgainstItsSchema) {
  std::map<std::string, Schema> ops;
  for (const char* s : {"ns::f(Tensor x, Tensor y, float eps=1e-06) -> (Tensor, Tensor)"}) {
    Schema sc = parse_schema(s);
    ops.emplace(sc.qualified_name(), sc);
  }
  auto schema_of = [&](const std::string& op) -> const Schema* {
    auto it = ops.find(op);
    return it == ops.end() ? nullptr : &it->second;
  };
  auto check = [&](const std::string& text) -> std::string {
    try {
      for (const auto& p : parse_fusion_patterns(text, "t.pat")) check_fusion_pattern(p, "t.pat", schema_of);
    } catch (const FusionPatternError& e) {
      return e.what();
    }
    return "ok";
  };
  EXPECT_EQ(check("pattern p\n %a = aten::relu(%x)\n => ns::f(%x, %a)\nend"), "ok");
  EXPECT_EQ(check("pattern p\n %a = aten::relu(%x)\n => ns::f(%x, %a, 1e-5)[1]\nend"), "ok");
  // PyTorch's own ops in nested calls are the matcher's to check.
  EXPECT_EQ(check("pattern p\n %a = aten::relu(%x)\n => ns::f(aten::cat([%x, %a], -1), %a)\nend"), "ok");
  EXPECT_EQ(check("pattern p\n %a = aten::relu(%x)\n => ns::g(%x)\nend"),
            "t.pat, line 3, pattern 'p': the replacement op 'ns::g' is not defined (define it before its "
            "pattern)");
  EXPECT_EQ(check("pattern p\n %a = aten::relu(%x)\n => ns::f(%x)\nend"),
            "t.pat, line 3, pattern 'p': the replacement op 'ns::f' takes 2 to 3 arguments but the pattern "
            "passes 1");
  EXPECT_EQ(check("pattern p\n %a = aten::relu(%x)\n => ns::f(%x, %a)[2]\nend"),
            "t.pat, line 3, pattern 'p': 'ns::f(%x, %a)[2]' takes return 2 of an op with 2 returns");
  EXPECT_EQ(
      check("pattern p\n %s = aten::relu(%x)\n %a = aten::relu(%s)\n => ns::f(%x, %a)\n => %s <- [3]\nend"),
      "t.pat, line 4, pattern 'p': '=> %s <- [3]' but 'ns::f' has 2 returns");
}

TEST(FusionPattern, TableRefusesATakenName) {
  FusionPatternTable t;
  auto ps = parse_fusion_patterns("pattern p\n %a = aten::relu(%x)\n => ns::f(%a)\nend", "t.pat");
  ps[0].plugin = "one";
  t.add(ps);
  EXPECT_EQ(t.conflict(ps), "fusion pattern 'p' is already registered (by plugin 'one')");
  EXPECT_THROW(t.add(ps), FusionPatternError);
  EXPECT_EQ(t.entries().size(), 1u);
}

// Patterns commit with the rest of a plugin's batch (Registry::commit): a
// taken name fails the whole batch, and its ops stay undefined.
TEST(FusionPattern, ACommitWithATakenNameLeavesNothingBehind) {
  Registry registry;
  auto batch = [](const std::string& op) {
    Registrations b;
    b.defined_by = "plugin 'x'";
    b.schemas.push_back(parse_schema(op + "(Tensor x) -> Tensor"));
    b.fusion_patterns =
        parse_fusion_patterns("pattern p\n %a = aten::relu(%x)\n => " + op + "(%a)\nend", "t");
    b.fusion_patterns[0].plugin = "x";
    return b;
  };
  registry.commit(batch("one::f"));
  ASSERT_EQ(registry.fusion_patterns().size(), 1u);
  try {
    registry.commit(batch("two::f"));
    FAIL() << "the second commit should fail";
  } catch (const std::exception& e) {
    EXPECT_EQ(std::string(e.what()), "fusion pattern 'p' is already registered (by plugin 'x')");
  }
  EXPECT_EQ(registry.find("two::f"), nullptr);
  EXPECT_EQ(registry.fusion_patterns().size(), 1u);
  // A replacement op neither defined nor in the batch fails it too.
  Registrations b;
  b.fusion_patterns = parse_fusion_patterns("pattern q\n %a = aten::relu(%x)\n => three::f(%a)\nend", "t");
  EXPECT_THROW(registry.commit(std::move(b)), std::exception);
  EXPECT_EQ(registry.fusion_patterns().size(), 1u);
}

// `where` lines: conditions on the matched values' shapes and dtypes and on
// the captures, in the parsed pattern in text order.
TEST(FusionPattern, ParsesWhereConditions) {
  const auto ps = parse_fusion_patterns(R"(
pattern p
  %n = aten::mul.Tensor(%x, %r)
  %nc = aten::to.dtype(%n, $dtype)
  %y = aten::mul.Tensor(%gamma, %nc)
  where %gamma.dim() == 1
  where %gamma.size(0) == %x.size(-1)   # a comment
  where $dtype == %x.dtype
  where %x.dtype != bfloat16
  where $dtype != None
  => ns::f(%x, %gamma)
end
)",
                                        "t.pat");
  ASSERT_EQ(ps.size(), 1u);
  const auto& w = ps[0].constraints;
  ASSERT_EQ(w.size(), 5u);
  EXPECT_EQ(w[0].lhs.kind, PatternTerm::kDim);
  EXPECT_EQ(w[0].lhs.name, "gamma");
  EXPECT_TRUE(w[0].equal);
  EXPECT_EQ(w[0].rhs.kind, PatternTerm::kConst);
  EXPECT_EQ(w[0].rhs.value.i, 1);
  EXPECT_EQ(w[0].line, 6);
  EXPECT_EQ(w[1].lhs.kind, PatternTerm::kSize);
  EXPECT_EQ(w[1].lhs.dim, 0);
  EXPECT_EQ(w[1].rhs.kind, PatternTerm::kSize);
  EXPECT_EQ(w[1].rhs.name, "x");
  EXPECT_EQ(w[1].rhs.dim, -1);
  EXPECT_EQ(w[2].lhs.kind, PatternTerm::kCapture);
  EXPECT_EQ(w[2].rhs.kind, PatternTerm::kDtype);
  EXPECT_FALSE(w[3].equal);
  EXPECT_EQ(w[3].rhs.kind, PatternTerm::kDtypeName);
  EXPECT_EQ(w[3].rhs.name, "bfloat16");
  EXPECT_EQ(w[4].rhs.value.kind, PatternConst::kNone);
  EXPECT_EQ(w[1].to_string(), "%gamma.size(0) == %x.size(-1)");
  EXPECT_EQ(w[3].to_string(), "%x.dtype != bfloat16");
  // The listed text keeps the where lines (without the comment).
  EXPECT_NE(ps[0].text.find("  where %gamma.size(0) == %x.size(-1)\n"), std::string::npos);
}

TEST(FusionPattern, BadWhereLinesNameTheLineAndThePattern) {
  auto with = [](const std::string& where) {
    return parse_error("pattern p\n  %a = aten::relu(%x)\n  " + where + "\n  => ns::f(%a)\nend\n");
  };
  EXPECT_EQ(with("where %x.dim() = 1"), "t.pat, line 3, pattern 'p': expected '==' or '!=' at '= 1'");
  EXPECT_EQ(with("where %x.dim() < 1"), "t.pat, line 3, pattern 'p': expected '==' or '!=' at '< 1'");
  EXPECT_EQ(with("where %x.shape == 1"),
            "t.pat, line 3, pattern 'p': expected .dim(), .size(d) or .dtype after '%x' at '.shape == 1'");
  EXPECT_EQ(with("where %x.size(a) == 1"), "t.pat, line 3, pattern 'p': expected a number at 'a) == 1'");
  EXPECT_EQ(with("where %x.dtype == float99"),
            "t.pat, line 3, pattern 'p': unknown term 'float99' (expected %v.dim(), %v.size(d), %v.dtype, "
            "$capture, a literal or a dtype such as float32) at 'float99'");
  EXPECT_EQ(with("where %x.dim() == 1 extra"),
            "t.pat, line 3, pattern 'p': unexpected text after the condition at 'extra'");
  EXPECT_EQ(
      with("where"),
      "t.pat, line 3, pattern 'p': expected a term (%v.dim(), %v.size(d), %v.dtype, $capture or a literal) "
      "at the end of the line");
  EXPECT_EQ(with("where %q.dim() == 1"),
            "t.pat, line 3, pattern 'p': the condition uses '%q', which the subgraph does not bind");
  EXPECT_EQ(with("where $d == float32"),
            "t.pat, line 3, pattern 'p': the condition uses '$d', which the subgraph does not capture");
}

// Numbers parse the same whatever the C locale (std::from_chars): a
// decimal-comma LC_NUMERIC does not make "2.5" malformed.
TEST(FusionPattern, NumbersIgnoreTheLocale) {
  const char* old = std::setlocale(LC_NUMERIC, nullptr);
  const std::string saved = old != nullptr ? old : "C";
  const bool comma = std::setlocale(LC_NUMERIC, "de_DE.UTF-8") != nullptr ||
                     std::setlocale(LC_NUMERIC, "fr_FR.UTF-8") != nullptr;
  const auto ps = parse_fusion_patterns(
      "pattern p\n %a = aten::add.Tensor(%x, 2.5)\n => ns::f(%a, +1e-6, -3)\nend", "t.pat");
  std::setlocale(LC_NUMERIC, saved.c_str());
  EXPECT_DOUBLE_EQ(ps[0].nodes[0].args[1].value.d, 2.5);
  EXPECT_DOUBLE_EQ(ps[0].replacement.items[1].value.d, 1e-6);
  EXPECT_EQ(ps[0].replacement.items[2].value.i, -3);
  if (!comma) GTEST_LOG_(INFO) << "no decimal-comma locale installed: checked in the C locale only";
}
