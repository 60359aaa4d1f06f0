// Indexing, gathering and selection: embedding, index_select/index_copy,
// gather/scatter, cat, nonzero, index/index_put_, topk and sort.
#include "sample_kit.h"

#include <optional>

namespace npub::conformance {
namespace {

SampleFn embedding_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto add = [&](const std::string& n, at::Tensor w, at::Tensor idx) {
      out.push_back({n, {w, idx, int64_t{-1}, false, false}});
    };
    add("[10,4] x [3,5]", make({10, 4}, dt), rand_index({3, 5}, 10));
    add("int32 indices", make({10, 4}, dt), rand_index({7}, 10, at::kInt));
    add("0-d index", make({10, 4}, dt), rand_index({}, 10));
    add("empty indices", make({10, 4}, dt), rand_index({0}, 10));
    add("large", make({1000, 64}, dt), rand_index({64, 32}, 1000));
    add("index out of range (error)", make({10, 4}, dt), long_tensor({1, 10}, {2}));
    add("negative index (error)", make({10, 4}, dt), long_tensor({-1}, {1}));
    return out;
  };
}

SampleFn embedding_backward_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    at::Tensor idx = rand_index({3, 5}, 6);
    out.push_back({"plain", {make({3, 5, 4}, dt), idx, int64_t{6}, int64_t{-1}, false}});
    out.push_back({"padding_idx 2", {make({3, 5, 4}, dt), idx, int64_t{6}, int64_t{2}, false}});
    out.push_back({"scale_grad_by_freq", {make({3, 5, 4}, dt), idx, int64_t{6}, int64_t{-1}, true}});
    out.push_back(
        {"large", {make({64, 32, 16}, dt), rand_index({64, 32}, 500), int64_t{500}, int64_t{-1}, false}});
    return out;
  };
}

SampleFn index_select_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    out.push_back({"dim 0", {make({6, 4}, dt), int64_t{0}, rand_index({5}, 6), empty_out(dt)}});
    out.push_back(
        {"dim 1, int32 index", {make({6, 4}, dt), int64_t{1}, rand_index({7}, 4, at::kInt), empty_out(dt)}});
    out.push_back({"dim -1 of 3-d", {make({2, 3, 5}, dt), int64_t{-1}, rand_index({4}, 5), empty_out(dt)}});
    out.push_back({"empty index", {make({6, 4}, dt), int64_t{0}, rand_index({0}, 6), empty_out(dt)}});
    out.push_back({"transposed self", {make_t(6, 5, dt), int64_t{0}, rand_index({3}, 6), empty_out(dt)}});
    out.push_back({"large", {make({2048, 64}, dt), int64_t{0}, rand_index({1024}, 2048), empty_out(dt)}});
    out.push_back({"index out of range (error)",
                   {make({6, 4}, dt), int64_t{0}, long_tensor({0, 6}, {2}), empty_out(dt)}});
    return out;
  };
}

SampleFn index_copy_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;  // distinct indices: ATen leaves duplicates' order open
    out.push_back({"dim 2 (a KV cache update)",
                   {make({2, 3, 8, 4}, dt), int64_t{2}, long_tensor({5, 1}, {2}), make({2, 3, 2, 4}, dt),
                    empty_out(dt)}});
    out.push_back(
        {"dim 0",
         {make({6, 4}, dt), int64_t{0}, long_tensor({0, 3, 5}, {3}), make({3, 4}, dt), empty_out(dt)}});
    out.push_back({"index out of range (error)",
                   {make({6, 4}, dt), int64_t{0}, long_tensor({6}, {1}), make({1, 4}, dt), empty_out(dt)}});
    return out;
  };
}

SampleFn gather_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    out.push_back({"dim 1", {make({4, 6}, dt), int64_t{1}, rand_index({4, 3}, 6), false, empty_out(dt)}});
    out.push_back({"dim 0, smaller index",
                   {make({4, 6}, dt), int64_t{0}, rand_index({2, 5}, 4), false, empty_out(dt)}});
    out.push_back({"3-d", {make({2, 3, 5}, dt), int64_t{2}, rand_index({2, 3, 7}, 5), false, empty_out(dt)}});
    out.push_back(
        {"large", {make({256, 512}, dt), int64_t{1}, rand_index({256, 256}, 512), false, empty_out(dt)}});
    out.push_back({"int32 index",
                   {make({4, 6}, dt), int64_t{1}, rand_index({4, 3}, 6, at::kInt), false, empty_out(dt)}});
    out.push_back({"0-d self", {make({}, dt), int64_t{0}, long_tensor({0}, {1}), false, empty_out(dt)}});
    out.push_back(
        {"0-d self and index", {make({}, dt), int64_t{0}, long_tensor({0}, {}), false, empty_out(dt)}});
    out.push_back(
        {"empty index", {make({4, 6}, dt), int64_t{1}, rand_index({4, 0}, 6), false, empty_out(dt)}});
    out.push_back({"index out of range (error)",
                   {make({4, 6}, dt), int64_t{1}, long_tensor({0, 6, 1, 2}, {2, 2}), false, empty_out(dt)}});
    return out;
  };
}

SampleFn scatter_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    // Unique targets per row for scatter (duplicates make its result order-dependent).
    at::Tensor perm = at::stack(
        {at::randperm(6, sample_generator(), at::TensorOptions().dtype(at::kLong)).narrow(0, 0, 4),
         at::randperm(6, sample_generator(), at::TensorOptions().dtype(at::kLong)).narrow(0, 0, 4)});
    out.push_back({"dim 1", {make({2, 6}, dt), int64_t{1}, perm, make({2, 4}, dt), empty_out(dt)}});
    at::Tensor perm0 = at::randperm(5, sample_generator(), at::TensorOptions().dtype(at::kLong))
                           .narrow(0, 0, 3)
                           .unsqueeze(1)
                           .expand({3, 4})
                           .contiguous();
    out.push_back({"dim 0", {make({5, 4}, dt), int64_t{0}, perm0, make({3, 4}, dt), empty_out(dt)}});
    out.push_back(
        {"index out of range (error)",
         {make({2, 6}, dt), int64_t{1}, long_tensor({0, 6}, {1, 2}), make({1, 2}, dt), empty_out(dt)}});
    return out;
  };
}

SampleFn scatter_add_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    out.push_back({"dim 1 with duplicates",
                   {make({3, 5}, dt), int64_t{1}, rand_index({3, 8}, 5), make({3, 8}, dt), empty_out(dt)}});
    out.push_back(
        {"dim 0", {make({4, 3}, dt), int64_t{0}, rand_index({6, 3}, 4), make({6, 3}, dt), empty_out(dt)}});
    out.push_back(
        {"large",
         {make({64, 128}, dt), int64_t{1}, rand_index({64, 256}, 128), make({64, 256}, dt), empty_out(dt)}});
    out.push_back(
        {"index out of range (error)",
         {make({2, 6}, dt), int64_t{1}, long_tensor({-1, 0}, {1, 2}), make({1, 2}, dt), empty_out(dt)}});
    return out;
  };
}

SampleFn cat_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto list = [](std::vector<at::Tensor> v) { return IValue(c10::List<at::Tensor>(v)); };
    out.push_back({"dim 0", {list({make({2, 3}, dt), make({4, 3}, dt)}), int64_t{0}, empty_out(dt)}});
    out.push_back(
        {"dim 1, three parts",
         {list({make({2, 3}, dt), make({2, 1}, dt), make({2, 5}, dt)}), int64_t{1}, empty_out(dt)}});
    out.push_back(
        {"dim -1 of 3-d", {list({make({2, 3, 4}, dt), make({2, 3, 2}, dt)}), int64_t{-1}, empty_out(dt)}});
    out.push_back({"skips 1-d empty", {list({make({0}, dt), make({2, 3}, dt)}), int64_t{0}, empty_out(dt)}});
    out.push_back(
        {"transposed part", {list({make_t(3, 2, dt), make({3, 2}, dt)}), int64_t{0}, empty_out(dt)}});
    out.push_back({"large", {list({make({512, 256}, dt), make({512, 256}, dt)}), int64_t{1}, empty_out(dt)}});
    out.push_back(
        {"size mismatch (error)", {list({make({2, 3}, dt), make({2, 4}, dt)}), int64_t{0}, empty_out(dt)}});
    return out;
  };
}

SampleFn nonzero_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    for (auto shape : {std::vector<int64_t>{5, 7}, std::vector<int64_t>{}, std::vector<int64_t>{0, 3},
                       std::vector<int64_t>{2, 3, 4}, std::vector<int64_t>{300, 200}}) {
      at::Tensor t = make(shape, dt);
      if (dt != at::kBool) t = t * (make(shape, at::kBool).to(dt));  // plenty of zeros
      out.push_back({std::to_string(shape.size()) + "-d", {t}});
    }
    return out;
  };
}

// Values unique within each row of the last dim (a permutation per row),
// exactly representable in every dtype for rows of up to 200, so that
// top-k indices are unambiguous.
at::Tensor unique_values(std::vector<int64_t> shape, ScalarType dt) {
  const int64_t cols = shape.back();
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  std::vector<at::Tensor> r;
  for (int64_t i = 0; i < rows; ++i)
    r.push_back(at::randperm(cols, sample_generator(), at::TensorOptions().dtype(at::kLong)));
  at::Tensor p = at::stack(r).reshape(shape);
  if (at::isFloatingType(dt)) return (p.to(at::kDouble) * 0.25 - cols * 0.1).to(dt);
  if (dt == at::kByte) return p.to(dt);
  return (p - cols / 2).to(dt);
}

SampleFn topk_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto add = [&](const std::string& n, at::Tensor t, int64_t k, int64_t dim, bool largest) {
      out.push_back({n, {t, k, dim, largest, true, empty_out(dt), empty_out(at::kLong)}});
    };
    add("k 3 largest", unique_values({4, 9}, dt), 3, -1, true);
    add("k 2 smallest, dim 0 (transposed)", unique_values({4, 5}, dt).t(), 2, 0, false);
    add("k = size", unique_values({3, 6}, dt), 6, 1, true);
    add("k 0", unique_values({3, 6}, dt), 0, 1, true);
    add("large", unique_values({256, 200}, dt), 10, 1, true);
    add("k too large (error)", unique_values({3, 4}, dt), 5, 1, true);
    return out;
  };
}

SampleFn sort_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto add = [&](const std::string& n, at::Tensor t, int64_t dim, bool desc) {
      out.push_back({n, {t, IValue(true), dim, desc, empty_out(dt), empty_out(at::kLong)}});
    };
    add("ascending", make({4, 9}, dt), -1, false);
    add("descending, dim 0", make({5, 4}, dt), 0, true);
    add("ties are stable", at::zeros({3, 5}, at::TensorOptions().dtype(dt)), 1, false);
    add("0-d", make({}, dt), 0, false);
    add("transposed", make_t(6, 5, dt), 1, true);
    add("large", make({128, 300}, dt), 1, false);
    if (at::isFloatingType(dt)) add("nan last", make({4, 4}, dt, 2), 1, false);
    return out;
  };
}

IValue opt_list(std::vector<std::optional<at::Tensor>> v) {
  c10::List<std::optional<at::Tensor>> l;
  for (auto& t : v) l.push_back(t);
  return IValue(l);
}

SampleFn index_tensor_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto add = [&](const std::string& n, at::Tensor self, std::vector<std::optional<at::Tensor>> idx) {
      out.push_back({n, {self, opt_list(idx), empty_out(dt)}});
    };
    add("one long index", make({5, 4}, dt), {rand_index({3}, 5)});
    add("negative indices", make({5, 4}, dt), {long_tensor({-1, -5, 2}, {3})});
    add("index on dim 1", make({5, 4}, dt), {std::nullopt, rand_index({2, 3}, 4)});
    add("two broadcast indices", make({5, 4, 3}, dt), {rand_index({2, 1}, 5), rand_index({3}, 4)});
    add("non-adjacent indices", make({5, 4, 3}, dt), {rand_index({2}, 5), std::nullopt, rand_index({2}, 3)});
    add("bool mask", make({4, 5}, dt), {make({4, 5}, at::kBool)});
    add("bool mask on dim 0", make({4, 5}, dt), {make({4}, at::kBool)});
    add("int32 index", make({6}, dt), {rand_index({4}, 6, at::kInt)});
    add("index out of range (error)", make({5, 4}, dt), {long_tensor({5}, {1})});
    return out;
  };
}

SampleFn index_put_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto add = [&](const std::string& n, at::Tensor self, std::vector<std::optional<at::Tensor>> idx,
                   at::Tensor v, bool acc) {
      out.push_back({n, {self, opt_list(idx), v, acc}});
    };
    add("unique rows", make({5, 4}, dt),
        {at::randperm(5, sample_generator(), at::TensorOptions().dtype(at::kLong)).narrow(0, 0, 3)},
        make({3, 4}, dt), false);
    add("broadcast value", make({5, 4}, dt), {long_tensor({0, 2}, {2})}, make({4}, dt), false);
    add("accumulate with duplicates", make({5, 4}, dt), {long_tensor({1, 1, 3}, {3})}, make({3, 4}, dt),
        dt != at::kBool);
    add("two indices", make({5, 4}, dt), {long_tensor({0, 4}, {2}), long_tensor({1, 3}, {2})}, make({2}, dt),
        false);
    add("bool mask", make({4, 5}, dt), {make({4, 5}, at::kBool)}, make({}, dt), false);
    add("index out of range (error)", make({5, 4}, dt), {long_tensor({7}, {1})}, make({4}, dt), false);
    return out;
  };
}

}  // namespace

void add_indexing_samples(SampleTable& t) {
  t.samples("aten::_index_put_impl_", [](ScalarType dt) {
    auto out = index_put_spec()(dt);
    for (Sample& smp : out) smp.args.push_back(false);  // unsafe
    return out;
  });
  t.samples("aten::embedding", embedding_spec());
  t.samples("aten::embedding_dense_backward", embedding_backward_spec());
  t.samples("aten::index_select.out", index_select_spec());
  t.samples("aten::index_copy.out", index_copy_spec());
  t.samples("aten::gather.out", gather_spec());
  t.samples("aten::scatter.src_out", scatter_spec());
  t.samples("aten::scatter_add.out", scatter_add_spec());
  t.samples("aten::cat.out", cat_spec());
  t.samples("aten::index.Tensor_out", index_tensor_spec());
  t.samples("aten::index_put_", index_put_spec());
  t.samples("aten::nonzero", nonzero_spec());
  t.samples("aten::topk.values", topk_spec());
  t.samples("aten::sort.values_stable", sort_spec());
}

}  // namespace npub::conformance
