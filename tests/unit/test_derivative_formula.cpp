// Derivative formulas (registry/src/derivative_formula.cpp): a good formula
// gives the backward op, the inputs and each backward argument's source; a
// bad one fails with the reason alone (the host API adds the op and the
// formula: the loader's bad-plugin cases, test_loader.cpp).
#include <gtest/gtest.h>

#include <npubridge/registry/derivative_formula.h>
#include <npubridge/registry/schema.h>

#include <map>
#include <string>

using namespace npub::reg;

namespace {

// The forward op f, a backward op for it, and a few that do not fit.
class DerivativeFormula : public ::testing::Test {
 protected:
  DerivativeFormula() {
    for (const char* text : {
             "t::f(Tensor self, Tensor w, Tensor[] xs, float alpha=1.) -> (Tensor out, Tensor stats, int n)",
             "t::f_backward(Tensor grad, Tensor self, Tensor w, float alpha, Tensor? stats=None) "
             "-> (Tensor, Tensor)",
             "t::one_backward(Tensor grad) -> Tensor",
             "t::int_backward(Tensor grad) -> int",
             "t::f_(Tensor(a!) self, Tensor w) -> Tensor(a!)",
         }) {
      Schema s = parse_schema(text);
      schemas_.emplace(s.qualified_name(), s);
    }
  }

  Derivative parse(const std::string& op, const std::string& formula) {
    return parse_derivative_formula(op, schemas_.at(op), formula,
                                    [&](const std::string& name) -> const Schema* {
                                      const auto it = schemas_.find(name);
                                      return it != schemas_.end() ? &it->second : nullptr;
                                    });
  }

  std::string error(const std::string& formula, const std::string& op = "t::f") {
    try {
      parse(op, formula);
    } catch (const DerivativeFormulaError& e) {
      return e.what();
    }
    return "(parsed)";
  }

  std::map<std::string, Schema> schemas_;
};

using Arg = Derivative::Arg;

}  // namespace

TEST_F(DerivativeFormula, ParsesInputsAndEachArgumentsSource) {
  const Derivative d = parse("t::f", "w, self: t::f_backward(grads[0], self, w, alpha, results[1])");
  EXPECT_EQ(d.backward, "t::f_backward");
  EXPECT_EQ(d.inputs, (std::vector<int32_t>{1, 0}));
  ASSERT_EQ(d.args.size(), 5u);
  const std::vector<std::pair<Arg::Kind, int32_t>> expected = {
      {Arg::kGrad, 0}, {Arg::kInput, 0}, {Arg::kInput, 1}, {Arg::kInput, 3}, {Arg::kResult, 1}};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(d.args[i].kind, expected[i].first) << i;
    EXPECT_EQ(d.args[i].index, expected[i].second) << i;
  }
  EXPECT_EQ(d.formula, "w, self: t::f_backward(grads[0], self, w, alpha, results[1])");
  EXPECT_EQ(d.plugin, "");  // the caller's to set
}

TEST_F(DerivativeFormula, GradAndResultAreTheFirstReturnsAndTrailingDefaultsMayBeLeftOut) {
  const Derivative d = parse("t::f", " self ,w: t::f_backward( grad ,result, w , alpha )");
  EXPECT_EQ(d.backward, "t::f_backward");
  EXPECT_EQ(d.inputs, (std::vector<int32_t>{0, 1}));
  ASSERT_EQ(d.args.size(), 4u);
  EXPECT_EQ(d.args[0].kind, Arg::kGrad);
  EXPECT_EQ(d.args[0].index, 0);
  EXPECT_EQ(d.args[1].kind, Arg::kResult);
  EXPECT_EQ(d.args[1].index, 0);
}

TEST_F(DerivativeFormula, BadFormulasSayWhy) {
  EXPECT_EQ(error("self t::one_backward(grad)"), "expected \"<inputs>: <backward op>(<arguments>)\"");
  EXPECT_EQ(error("self:t::one_backward(grad)"), "expected \"<inputs>: <backward op>(<arguments>)\"");
  EXPECT_EQ(error("self: t::one_backward(grad"), "expected \"<inputs>: <backward op>(<arguments>)\"");
  EXPECT_EQ(error(""), "expected \"<inputs>: <backward op>(<arguments>)\"");
  EXPECT_EQ(error("self: t::nowhere(grad)"),
            "backward op 't::nowhere' is not defined; define its schema first");
  EXPECT_EQ(error("self, bias: t::f_backward(grad, self, w, alpha)"), "'bias' is not an argument of t::f");
  EXPECT_EQ(error("alpha: t::one_backward(grad)"),
            "argument 'alpha' is not a Tensor and cannot receive a gradient");
  EXPECT_EQ(error("xs: t::one_backward(grad)"),
            "argument 'xs' is not a Tensor and cannot receive a gradient");
  EXPECT_EQ(error("self, self: t::f_backward(grad, self, w, alpha)"), "'self' is listed twice");
  EXPECT_EQ(error("self: t::one_backward(grads[x])"),
            "'grads[x]' is neither grads[i], results[i] nor an argument of t::f");
  EXPECT_EQ(error("self: t::one_backward(grads[1000])"),
            "'grads[1000]' is neither grads[i], results[i] nor an argument of t::f");
  EXPECT_EQ(error("self: t::one_backward(grads[3])"), "'grads[3]' but the op has 3 returns");
  EXPECT_EQ(error("self: t::one_backward(results[2])"),
            "'results[2]' refers to a return that is not a Tensor");
  EXPECT_EQ(error("self, w: t::f_backward(grad, self)"),
            "backward op 't::f_backward' takes 4 to 5 arguments but the formula passes 2");
  EXPECT_EQ(error("self: t::one_backward()"),
            "backward op 't::one_backward' takes 1 arguments but the formula passes 0");
  EXPECT_EQ(error("self: t::f_backward(grad, self, w, alpha)"),
            "backward op 't::f_backward' returns 2 values but the formula lists 1 inputs");
  EXPECT_EQ(error("self: t::int_backward(grad)"), "backward op 't::int_backward' must return Tensors");
}

TEST_F(DerivativeFormula, OnlyFunctionalOpsCanBeDifferentiated) {
  EXPECT_EQ(error("w: t::one_backward(grad)", "t::f_"),
            "the op writes argument 'self'; only functional ops can be differentiated");
}
