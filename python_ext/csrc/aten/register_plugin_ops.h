// The registration of plugin ops with PyTorch, at init
// (register_plugin_ops.cpp): each aten op a plugin implements, and the
// functional and in-place forms of the .out ops it implements, for
// PrivateUse1; plugin ops of other namespaces defined under
// torch.ops.<namespace>, with a Meta kernel. Each route goes into the
// route table (routes.h).
#pragma once

#include <string>
#include <vector>

namespace npub::torch_backend {

void register_plugin_ops();

// "Type name" of a printed schema argument, without its alias annotation
// and default ("Tensor(a!) out=None" -> "Tensor out").
std::string plain_argument(std::string printed);

}  // namespace npub::torch_backend
