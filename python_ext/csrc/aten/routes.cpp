// The route table (see routes.h).
#include "aten/routes.h"

#include <algorithm>
#include <map>
#include <mutex>

namespace npub::torch_backend {

namespace {

std::mutex g_routes_mu;
std::map<std::string, RouteEntry> g_registered;  // guarded by g_routes_mu
std::map<std::string, RouteEntry> g_mapped;      // guarded by g_routes_mu

}  // namespace

const char* route_name(Route r) {
  switch (r) {
    case Route::kDirect:
      return "direct";
    case Route::kViaOut:
      return "via_out";
    case Route::kInplaceViaOut:
      return "inplace_via_out";
  }
  return "?";
}

const char* route_origin_name(RouteOrigin o) {
  switch (o) {
    case RouteOrigin::kAten:
      return "aten";
    case RouteOrigin::kCustom:
      return "custom";
    case RouteOrigin::kMapped:
      return "mapped";
  }
  return "?";
}

void add_route(RouteEntry entry) {
  std::lock_guard<std::mutex> lock(g_routes_mu);
  std::string op = entry.op;
  g_registered.insert_or_assign(std::move(op), std::move(entry));
}

void set_mapped_route(const std::string& op, Route route, const std::string& target) {
  std::lock_guard<std::mutex> lock(g_routes_mu);
  g_mapped.insert_or_assign(op, RouteEntry{op, route, target, RouteOrigin::kMapped});
}

void remove_mapped_route(const std::string& op) {
  std::lock_guard<std::mutex> lock(g_routes_mu);
  g_mapped.erase(op);
}

std::vector<RouteEntry> routes() {
  std::lock_guard<std::mutex> lock(g_routes_mu);
  std::vector<RouteEntry> out;
  out.reserve(g_registered.size() + g_mapped.size());
  for (const auto& [op, e] : g_registered) out.push_back(e);
  for (const auto& [op, e] : g_mapped) out.push_back(e);
  return out;
}

bool bridged_by_name(const std::string& op) {
  std::lock_guard<std::mutex> lock(g_routes_mu);
  const auto it = g_registered.find(op);
  return it != g_registered.end() && it->second.route == Route::kDirect && it->second.target == op;
}

}  // namespace npub::torch_backend
