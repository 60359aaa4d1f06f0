// Test plugin for the SDK's KernelBuilder::user_data: one kernel body reads
// its registration's user data through Call::kernel_user_data(), and a
// supports() predicate reads the same pointer. Also Registrar::op.
#include <npubridge/plugin_sdk.hpp>

#include <cstdint>

namespace {

using namespace npub::sdk;

// What each registration hands to .user_data(). The tag tells this struct
// from any other pointer the host might pass instead.
struct Scale {
  static constexpr uint64_t kTag = 0x7573657264617461;  // "userdata"
  uint64_t tag;
  float factor;
  int64_t max_numel;  // the predicate declines calls with more elements
};

const Scale* scale_of(void* user_data) {
  const auto* s = static_cast<const Scale*>(user_data);
  return s != nullptr && s->tag == Scale::kTag ? s : nullptr;
}

void delete_scale(void* p) { delete static_cast<Scale*>(p); }

int32_t within_max_numel(void* user_data, const NpubValue* args, int32_t) {
  const Scale* s = scale_of(user_data);
  return s != nullptr && TensorRef(args[0].u.tensor).numel() <= s->max_numel;
}

// userdata::scale(Tensor self, Tensor(a!) out) -> Tensor(a!), float32:
// out = factor * self, with the factor of the kernel that serves the call.
void scale(Call& call) {
  const Scale* s = scale_of(call.kernel_user_data());
  if (s == nullptr)
    call.fail(NPUB_ERR_INTERNAL, "kernel_user_data() is not the pointer given to .user_data()");
  TensorRef x = call.tensor(0), out = call.tensor(1);
  if (out.sizes() != x.sizes())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "out: expected shape " + Call::shape_str(x.sizes()) + " but found " +
                                             Call::shape_str(out.sizes()));
  const float* px = x.data<float>();
  float* po = out.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) po[i] = s->factor * px[i];
}

void init(Registrar& r) {
  r.def("userdata::scale(Tensor self, Tensor(a!) out) -> Tensor(a!)");
  // Small inputs: factor 3, chosen by the predicate over the general kernel.
  r.kernel("userdata::scale", &scale)
      .dtypes({kFloat32})
      .priority(10)
      .supports(&within_max_numel)
      .user_data(new Scale{Scale::kTag, 3.0f, 4}, &delete_scale);
  r.kernel("userdata::scale", &scale)
      .dtypes({kFloat32})
      .user_data(new Scale{Scale::kTag, 2.0f, INT64_MAX}, &delete_scale);
  // The same body under a second op (its errors name this op), defined and
  // registered in one with r.op.
  r.op("userdata::scale_too(Tensor self, Tensor(a!) out) -> Tensor(a!)", &scale)
      .dtypes({kFloat32})
      .user_data(new Scale{Scale::kTag, 5.0f, INT64_MAX}, &delete_scale);
}

}  // namespace

NPUB_DEFINE_PLUGIN(userdata, "0.0.1", init)
