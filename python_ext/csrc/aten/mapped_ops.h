// ATen ops routed by the op-mapping table (mapped_ops.cpp). A mapping
// `framework_op -> target_op [plugin]` reaches the dispatcher only through a
// PrivateUse1 kernel of the framework op: an op npubridge already bridges
// under its own name resolves the mapping in its Bridge; any other op gets
// the boxed bridge registered for it, one torch::Library per op, and
// removing the mapping destroys that library, so calls take their previous
// route (the op's own kernel, or the CPU fallback).
#pragma once

#include <npubridge/registry/op_registry.h>

#include <string>
#include <vector>

namespace npub::torch_backend {

// Checks that the target op accepts the framework op's arguments, routes the
// framework op and sets the mapping. Throws npub::Error naming both ops and
// what differs (an unknown op, an argument, a return), and then changes
// nothing.
void map_op(const reg::OpMapping& mapping);

// Removes a mapping and the kernel map_op registered for it; false when the
// op was not mapped.
bool unmap_op(const std::string& framework_op);

// At init, after register_plugin_ops: routes the mappings of the loaded table
// (NPUB_OP_MAP or the shipped op_map.txt). A mapping PyTorch cannot serve (a
// schema that does not fit, an unknown ATen op) is dropped from the table
// with a warning. Mappings of names PyTorch does not know outside `aten`
// stay for callers of the dispatcher by name.
void route_mapped_ops();

}  // namespace npub::torch_backend
