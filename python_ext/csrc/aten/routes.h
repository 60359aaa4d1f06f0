// The route table (routes.cpp): how each op npubridge registers with
// PyTorch reaches the dispatcher. Written where the kernels are registered
// (register_plugin_ops at init, map_op / unmap_op for the op-mapping
// table) and read, typed, by everything that needs a route: the graph
// lowering (`_C.routes()`), `npubridge.routed_ops()`, and the op map's own
// checks. No strings to print and parse back.
#pragma once

#include <string>
#include <vector>

namespace npub::torch_backend {

// How a torch op reaches a plugin kernel: the op itself (kDirect), or a
// functional / in-place op through the plugin's .out kernel, the outputs'
// shapes and dtypes coming from the op's meta kernel (ATen's own shape and
// type-promotion rules).
enum class Route { kDirect, kViaOut, kInplaceViaOut };

// Where a route comes from.
enum class RouteOrigin {
  kAten,    // an aten op a plugin serves (register_plugin_ops)
  kCustom,  // a plugin's own op, defined under torch.ops.<namespace>
  kMapped,  // the op-mapping table (npubridge.register_op, op_map.txt)
};

struct RouteEntry {
  std::string op;  // the torch op: "aten::add.Tensor", "vllm_like::silu_and_mul"
  Route route = Route::kDirect;
  std::string target;  // the registry op the dispatcher runs: "aten::add.out"
  RouteOrigin origin = RouteOrigin::kAten;
};

const char* route_name(Route r);               // "direct", "via_out", "inplace_via_out"
const char* route_origin_name(RouteOrigin o);  // "aten", "custom", "mapped"

// A route registered at init (kAten, kCustom); one per torch op.
void add_route(RouteEntry entry);
// The op-mapping table's route for `op`, replacing any earlier one.
void set_mapped_route(const std::string& op, Route route, const std::string& target);
void remove_mapped_route(const std::string& op);
// Every route: the registered ones, then the mapped ones, each in name order.
std::vector<RouteEntry> routes();
// Whether register_plugin_ops gave `op` a Bridge under its own name (a
// direct route of a plugin's aten or custom op), which resolves the
// op-mapping table itself.
bool bridged_by_name(const std::string& op);

}  // namespace npub::torch_backend
