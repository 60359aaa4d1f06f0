// Matrix products: mm, bmm, addmm, baddbmm and the grouped product of MoE
// layers (_grouped_mm).
#include "sample_kit.h"

#include <stdexcept>

namespace npub::conformance {
namespace {

SampleFn mm_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto add = [&](const std::string& n, at::Tensor a, at::Tensor b) {
      out.push_back({n, {a, b, empty_out(dt)}});
    };
    add("[5,7] x [7,3]", make({5, 7}, dt), make({7, 3}, dt));
    add("empty m", make({0, 3}, dt), make({3, 4}, dt));
    add("empty k", make({3, 0}, dt), make({0, 4}, dt));
    add("transposed operands", make_t(9, 6, dt), make_t(6, 4, dt));
    add("large", make({130, 257}, dt), make({257, 65}, dt));
    add("shape mismatch (error)", make({3, 4}, dt), make({5, 6}, dt));
    return out;
  };
}
SampleFn bmm_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    out.push_back({"[3,5,7] x [3,7,2]", {make({3, 5, 7}, dt), make({3, 7, 2}, dt), empty_out(dt)}});
    out.push_back({"empty batch", {make({0, 5, 7}, dt), make({0, 7, 2}, dt), empty_out(dt)}});
    out.push_back({"batch mismatch (error)", {make({2, 5, 7}, dt), make({3, 7, 2}, dt), empty_out(dt)}});
    out.push_back({"large", {make({4, 64, 96}, dt), make({4, 96, 33}, dt), empty_out(dt)}});
    out.push_back({"transposed batch2 (k^T)",
                   {make({3, 5, 7}, dt), make({3, 2, 7}, dt).transpose(1, 2), empty_out(dt)}});
    out.push_back(
        {"transposed batch1", {make({3, 7, 5}, dt).transpose(1, 2), make({3, 7, 2}, dt), empty_out(dt)}});
    return out;
  };
}
SampleFn addmm_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    const bool fl = is_float(dt);
    auto sc = [&](double v) {
      return fl ? IValue(c10::Scalar(v)) : IValue(c10::Scalar(static_cast<int64_t>(v)));
    };
    out.push_back({"self [3] broadcast",
                   {make({3}, dt), make({4, 5}, dt), make({5, 3}, dt), sc(1), sc(1), empty_out(dt)}});
    out.push_back(
        {"beta 0.5 alpha 2",
         {make({4, 3}, dt), make({4, 5}, dt), make({5, 3}, dt), sc(fl ? 0.5 : 3), sc(2), empty_out(dt)}});
    out.push_back(
        {"beta 0", {make({4, 3}, dt), make({4, 5}, dt), make({5, 3}, dt), sc(0), sc(1), empty_out(dt)}});
    out.push_back(
        {"large", {make({96}, dt), make({64, 128}, dt), make({128, 96}, dt), sc(1), sc(1), empty_out(dt)}});
    out.push_back({"linear: mat2 transposed",
                   {make({6}, dt), make({4, 5}, dt), make({6, 5}, dt).t(), sc(1), sc(1), empty_out(dt)}});
    out.push_back({"both transposed",
                   {make({4, 6}, dt), make({5, 4}, dt).t(), make({6, 5}, dt).t(), sc(fl ? 0.5 : 2), sc(2),
                    empty_out(dt)}});
    return out;
  };
}
SampleFn baddbmm_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    const bool fl = is_float(dt);
    auto sc = [&](double v) {
      return fl ? IValue(c10::Scalar(v)) : IValue(c10::Scalar(static_cast<int64_t>(v)));
    };
    out.push_back(
        {"self broadcast",
         {make({1, 3}, dt), make({2, 4, 5}, dt), make({2, 5, 3}, dt), sc(1), sc(1), empty_out(dt)}});
    out.push_back({"beta 0.5 alpha 2",
                   {make({2, 4, 3}, dt), make({2, 4, 5}, dt), make({2, 5, 3}, dt), sc(fl ? 0.5 : 2), sc(2),
                    empty_out(dt)}});
    return out;
  };
}

// _grouped_mm: (self, mat2, Tensor? offs, Tensor? bias, ScalarType? out_dtype), the result allocated by
// the kernel. Offsets leave an empty group and rows (or columns) past the last one.
SampleFn grouped_mm_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    if (dt != at::kFloat && dt != at::kBFloat16 && dt != at::kHalf) return out;
    auto offs = [](std::vector<int64_t> v) {
      return at::tensor(v, at::TensorOptions().dtype(at::kLong)).to(at::kInt);
    };
    auto add = [&](const std::string& n, at::Tensor a, at::Tensor b, IValue o) {
      out.push_back({n, {a, b, o, IValue(), IValue()}});
    };
    add("2d x 3d", make({37, 24}, dt), make({4, 24, 40}, dt), offs({5, 5, 20, 33}));
    add("2d x 3d, transposed mat2", make({37, 24}, dt), make({4, 40, 24}, dt).transpose(1, 2),
        offs({5, 5, 20, 37}));
    add("3d x 2d", make({4, 12, 24}, dt), make({24, 40}, dt), offs({10, 10, 25, 38}));
    add("2d x 2d (weight gradient)", make({12, 30}, dt), make({30, 16}, dt), offs({6, 6, 17, 30}));
    add("2d x 2d, transposed self", make({30, 12}, dt).t(), make({30, 16}, dt), offs({6, 6, 17, 24}));
    add("3d x 3d", make({3, 9, 24}, dt), make({3, 24, 5}, dt), IValue());
    add("large", make({512, 256}, dt), make({8, 256, 128}, dt),
        offs({64, 100, 200, 256, 300, 400, 450, 512}));
    add("offset past the rows (error)", make({10, 8}, dt), make({3, 8, 5}, dt), offs({4, 12, 12}));
    add("decreasing offsets (error)", make({10, 8}, dt), make({3, 8, 5}, dt), offs({4, 7, 3}));
    add("contraction mismatch (error)", make({10, 8}, dt), make({3, 9, 5}, dt), offs({1, 2, 3}));
    return out;
  };
}

}  // namespace

void add_matmul_samples(SampleTable& t) {
  t.samples("aten::_grouped_mm", grouped_mm_spec());
  t.samples("aten::mm.out", mm_spec());
  t.samples("aten::bmm.out", bmm_spec());
  t.samples("aten::addmm.out", addmm_spec());
  t.samples("aten::baddbmm.out", baddbmm_spec());
  // ATen's CPU _grouped_mm takes no float64 (the reference's dtype): one
  // mm per group on the CPU, offsets checked as the kernel checks them;
  // rows or columns past the last offset are zeros.
  t.reference("aten::_grouped_mm", [](const std::vector<IValue>& a) {
    const at::Tensor x = a[0].toTensor(), w = a[1].toTensor();
    if (x.size(-1) != w.size(-2))
      throw std::invalid_argument("contraction dimension of mat_a and mat_b must match");
    std::vector<int64_t> b{0};
    if (!a[2].isNone()) {
      const at::Tensor o = a[2].toTensor().to(at::kLong).contiguous();
      for (int64_t i = 0; i < o.numel(); ++i) b.push_back(o.data_ptr<int64_t>()[i]);
    }
    const int64_t groups = static_cast<int64_t>(b.size()) - 1;
    const int64_t limit = x.dim() == 2 && w.dim() == 3   ? x.size(0)
                          : x.dim() == 3 && w.dim() == 2 ? w.size(1)
                                                         : x.size(1);
    for (size_t g = 1; g < b.size(); ++g)
      if (b[g] < b[g - 1] || b[g] > limit) throw std::invalid_argument("offs out of order or out of range");
    at::Tensor out;
    if (x.dim() == 2 && w.dim() == 3) {
      out = at::zeros({x.size(0), w.size(2)}, x.options());
      for (int64_t g = 0; g < groups; ++g)
        out.narrow(0, b[g], b[g + 1] - b[g]).copy_(at::mm(x.narrow(0, b[g], b[g + 1] - b[g]), w[g]));
    } else if (x.dim() == 3 && w.dim() == 2) {
      out = at::zeros({x.size(1), w.size(1)}, x.options());
      for (int64_t g = 0; g < groups; ++g)
        out.narrow(1, b[g], b[g + 1] - b[g]).copy_(at::mm(x[g], w.narrow(1, b[g], b[g + 1] - b[g])));
    } else if (x.dim() == 2) {
      out = at::zeros({groups, x.size(0), w.size(1)}, x.options());
      for (int64_t g = 0; g < groups; ++g)
        out[g].copy_(at::mm(x.narrow(1, b[g], b[g + 1] - b[g]), w.narrow(0, b[g], b[g + 1] - b[g])));
    } else {
      out = at::bmm(x, w);
    }
    return std::vector<at::Tensor>{out};
  });
}

}  // namespace npub::conformance
