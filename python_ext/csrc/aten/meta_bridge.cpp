// The meta bridge: a plugin op's output shapes and dtypes from its meta
// function, through Dispatcher::infer_meta (see meta_bridge.h).
#include "aten/meta_bridge.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <npubridge/support/error.h>

#include "aten/boxing.h"
#include "runtime/npu_runtime.h"

#include <cstddef>
#include <vector>

namespace npub::torch_backend {

void MetaBridge::operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(n), stack->end());
  Boxed b;
  b.values.reserve(args.size());
  b.views.reserve(count_tensors(args));
  for (const auto& a : args) b.values.push_back(box(a, b, current_index(), /*metadata_only=*/true));
  std::vector<OutputMeta> metas;
  try {
    metas = rt().dispatcher().infer_meta(rt().dispatcher().op(target_name_), b.values.data(),
                                         static_cast<int32_t>(b.values.size()));
  } catch (const Error& e) {
    TORCH_CHECK(false, e.what());
  }
  torch::jit::drop(*stack, n);
  for (const OutputMeta& m : metas) {
    if (m.alias >= 0)
      stack->push_back(args[static_cast<size_t>(m.alias)]);
    else if (m.set)
      stack->push_back(at::empty(m.shape, at::TensorOptions().dtype(torch_dtype(m.dtype)).device(at::kMeta)));
    else
      stack->push_back(c10::IValue());
  }
}

}  // namespace npub::torch_backend
