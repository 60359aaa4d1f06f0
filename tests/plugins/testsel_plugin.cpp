// Test plugin for kernel selection, conversion, staging, workspaces,
// data-dependent outputs and precision checks (written with the SDK).
#include <npubridge/plugin_sdk.hpp>

#include <cstring>

namespace {

using npub::sdk::Call;
using npub::sdk::TensorRef;
using namespace npub::sdk;

void fill(TensorRef out, float v) {
  float* p = out.data<float>();
  for (int64_t i = 0; i < out.numel(); ++i) p[i] = v;
}

// testsel::which(Tensor self, Tensor(a!) out) -> Tensor(a!): each kernel
// writes its own id into out, so a test sees which one ran.
void which_a(Call& c) {
  TensorRef out = c.tensor(1);
  if (out.is(kFloat64)) {
    double* p = out.data<double>();
    for (int64_t i = 0; i < out.numel(); ++i) p[i] = 1;
  } else {
    fill(out, 1);
  }
}
void which_b(Call& c) { fill(c.tensor(1), 2); }
void which_c(Call& c) { fill(c.tensor(1), 3); }

int32_t small_only(void*, const NpubValue* args, int32_t) {
  const DLTensor* t = args[0].u.tensor;
  int64_t n = 1;
  for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n <= 4;
}

// testsel::twice(Tensor self, Tensor(a!) out) -> Tensor(a!), float32 only:
// out = 2 * self. Half-precision calls reach it through conversion.
void twice(Call& c) {
  TensorRef x = c.tensor(0), out = c.tensor(1);
  if (!x.is(kFloat32) || !out.is(kFloat32)) c.fail(NPUB_ERR_INTERNAL, "conversion did not happen");
  const float* px = x.data<float>();
  float* po = out.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) po[i] = 2 * px[i];
}

// testsel::twice_fn(Tensor self) -> Tensor: the same, kernel-allocated output.
void twice_fn(Call& c) {
  TensorRef x = c.tensor(0);
  TensorRef out = c.output(0, x.sizes(), x.dtype());
  const float* px = x.data<float>();
  float* po = out.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) po[i] = 2 * px[i];
}

// testsel::flat_copy(Tensor self, Tensor(a!) out) -> Tensor(a!): copies
// memory order, so it is right only for contiguous tensors; declared
// contiguous-only so the dispatcher stages strided ones.
void flat_copy(Call& c) {
  TensorRef x = c.tensor(0), out = c.tensor(1);
  if (!x.is_contiguous() || !out.is_contiguous()) c.fail(NPUB_ERR_INTERNAL, "staging did not happen");
  std::memcpy(out.data<float>(), x.data<float>(), sizeof(float) * static_cast<size_t>(x.numel()));
}

// testsel::with_workspace(Tensor self) -> Tensor: asks for numel floats of
// workspace and uses it as scratch.
NpubError* workspace_size(void*, const NpubValue* args, int32_t, uint64_t* bytes) {
  const DLTensor* t = args[0].u.tensor;
  int64_t n = 1;
  for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
  *bytes = static_cast<uint64_t>(n) * 4;
  return nullptr;
}
void with_workspace(Call& c) {
  TensorRef x = c.tensor(0);
  uint64_t bytes = 0;
  auto* ws = static_cast<float*>(c.workspace(&bytes));
  if (bytes != static_cast<uint64_t>(x.numel()) * 4 || (bytes > 0 && ws == nullptr))
    c.fail(NPUB_ERR_INTERNAL, "workspace missing");
  const float* px = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) ws[i] = px[i] + 1;
  TensorRef out = c.output(0, x.sizes(), x.dtype());
  float* po = out.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) po[i] = ws[i] * 10;
  auto* scratch = static_cast<float*>(c.scratch(64));
  scratch[0] = 1;
}

// testsel::decline(Tensor self) -> Tensor and testsel::decline_many (nine
// returns): always decline (UNSUPPORTED), so the call goes to the fallback.
void decline(Call& c) { c.fail(NPUB_ERR_UNSUPPORTED, "this kernel declines every call"); }

// testsel::positives(Tensor self) -> Tensor: int64 indices of the positive
// elements; the output's shape depends on the data.
void positives(Call& c) {
  TensorRef x = c.tensor(0);
  const float* px = x.data<float>();
  int64_t n = 0;
  for (int64_t i = 0; i < x.numel(); ++i) n += px[i] > 0;
  TensorRef out = c.output(0, {n}, kInt64);
  int64_t* po = out.data<int64_t>();
  for (int64_t i = 0, k = 0; i < x.numel(); ++i)
    if (px[i] > 0) po[k++] = i;
}

// testsel::sloppy(Tensor self) -> Tensor: returns self + 1e-3 (a wrong
// kernel, for the precision check).
void sloppy(Call& c) {
  TensorRef x = c.tensor(0);
  TensorRef out = c.output(0, x.sizes(), x.dtype());
  const float* px = x.data<float>();
  float* po = out.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) po[i] = px[i] + (i == 2 ? 1e-3f : 0.0f);
}

// testsel::bad_index(Tensor self, int index) -> Tensor: bounds-checked read.
void bad_index(Call& c) {
  TensorRef x = c.tensor(0);
  const int64_t i = c.int_arg(1);
  if (i < 0 || i >= x.numel())
    c.fail(NPUB_ERR_INVALID_ARGUMENT, "index " + std::to_string(i) + " is out of bounds for a tensor of " +
                                          std::to_string(x.numel()) + " elements");
  TensorRef out = c.output(0, {}, x.dtype());
  *out.data<float>() = x.data<float>()[i];
}

// testsel::defaults(...): out = a + b + c[0] + c[1] + len(d), to observe
// the defaults the dispatcher filled in.
void defaults(Call& c) {
  const auto list = c.int_list(4);
  fill(c.tensor(1), static_cast<float>(c.int_arg(2) + c.double_arg(3) + list.at(0) + list.at(1) +
                                       static_cast<double>(c.string_arg(5).size())));
}

void init(npub::sdk::Registrar& r) {
  r.def("testsel::which(Tensor self, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("testsel::which", &which_a).dtypes({kFloat32, kFloat64}).priority(0);
  r.kernel("testsel::which", &which_b).dtypes({kFloat32}).priority(10).supports(&small_only);
  r.kernel("testsel::which", &which_c).dtypes({kFloat32}).priority(5).opt_level(3);

  r.def("testsel::twice(Tensor self, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("testsel::twice", &twice).dtypes({kFloat32});
  r.def("testsel::twice_fn(Tensor self) -> Tensor");
  r.kernel("testsel::twice_fn", &twice_fn).dtypes({kFloat32});
  r.def("testsel::flat_copy(Tensor self, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("testsel::flat_copy", &flat_copy).dtypes({kFloat32}).contiguous_only();
  r.def("testsel::with_workspace(Tensor self) -> Tensor");
  r.kernel("testsel::with_workspace", &with_workspace).dtypes({kFloat32}).workspace(&workspace_size);
  // Contiguous-only: a strided or a half-type call declines on staged copies.
  r.def("testsel::decline(Tensor self) -> Tensor");
  r.kernel("testsel::decline", &decline).dtypes({kFloat32}).contiguous_only();
  r.def(
      "testsel::decline_many(Tensor self) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, "
      "Tensor, Tensor)");
  r.kernel("testsel::decline_many", &decline).dtypes({kFloat32});
  r.def("testsel::positives(Tensor self) -> Tensor");
  r.kernel("testsel::positives", &positives).dtypes({kFloat32}).contiguous_only();
  r.def("testsel::sloppy(Tensor self) -> Tensor");
  r.kernel("testsel::sloppy", &sloppy).dtypes({kFloat32}).contiguous_only();
  r.def("testsel::bad_index(Tensor self, int index) -> Tensor");
  r.kernel("testsel::bad_index", &bad_index).dtypes({kFloat32}).contiguous_only();
  r.def(
      "testsel::defaults(Tensor self, Tensor(a!) out, int a=3, float b=0.5, int[2] c=[1, 2], str d=\"xy\") "
      "-> Tensor(a!)");
  r.kernel("testsel::defaults", &defaults).dtypes({kFloat32});
}

}  // namespace

NPUB_DEFINE_PLUGIN(testsel, "1.0.0", init)
