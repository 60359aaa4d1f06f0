// The registration of plugin ops with PyTorch, at init
// (register_plugin_ops.cpp): each aten op a plugin implements, and the
// functional and in-place forms of the .out ops it implements, for
// PrivateUse1; plugin ops of other namespaces defined under
// torch.ops.<namespace>, with a Meta kernel. Each route goes into the
// route table (routes.h).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <npubridge/registry/op_registry.h>

#include <optional>
#include <string>
#include <vector>

namespace npub::torch_backend {

void register_plugin_ops();

// PyTorch's operator of the registry op's name (ns::name.overload), when its
// schema is the registry op's, names and types: what boxed arguments and
// results need to line up between the two. A differing one is `*differs`'s
// (when given) printed schema, and no operator is returned.
std::optional<c10::OperatorHandle> torch_op_of(const reg::OpEntry& e, std::string* differs = nullptr);

// "Type name" of a printed schema argument, without its alias annotation
// and default ("Tensor(a!) out=None" -> "Tensor out").
std::string plain_argument(std::string printed);

}  // namespace npub::torch_backend
