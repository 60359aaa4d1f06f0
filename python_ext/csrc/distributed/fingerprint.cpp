// Gathering and comparing collective signatures across ranks (fingerprint.h).
#include "distributed/fingerprint.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <npubridge/support/shape.h>

#include <algorithm>
#include <sstream>
#include <utility>

namespace npub::dist {

namespace {

// The ops a signature can name; its index is the wire code (both sides run
// the same build, so the table is the protocol).
constexpr const char* kSignatureOps[] = {
    "allreduce",
    "allreduce_coalesced",
    "broadcast",
    "reduce",
    "allgather",
    "all_gather_into_tensor",
    "allgather_coalesced",
    "allgather_into_tensor_coalesced",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced",
    "all_to_all_single",
    "all_to_all",
    "barrier",
};
constexpr int64_t kMagic = 0x6e707562;  // "npub"
// Words: magic, op, seq, dtype, root, reduce op, shape hash, shape count,
// chunk bytes; then the shapes (ndim, dims..., truncated), then the alltoall counts.
constexpr size_t kHeader = 9;
constexpr size_t kShapeWords = 40;

int64_t op_code(const std::string& op) {
  for (size_t i = 0; i < std::size(kSignatureOps); ++i)
    if (op == kSignatureOps[i]) return static_cast<int64_t>(i);
  TORCH_INTERNAL_ASSERT(false, "npu backend: no signature code for ", op);
}

int64_t shapes_hash(const std::vector<std::vector<int64_t>>& shapes) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over ndim and dims
  auto mix = [&](int64_t v) {
    h ^= static_cast<uint64_t>(v);
    h *= 1099511628211ull;
  };
  for (const auto& s : shapes) {
    mix(static_cast<int64_t>(s.size()));
    for (int64_t d : s) mix(d);
  }
  return static_cast<int64_t>(h >> 1);
}

std::vector<int64_t> encode(const Signature& s, int size) {
  std::vector<int64_t> w(kHeader + kShapeWords + 2 * static_cast<size_t>(size), -1);
  w[0] = kMagic;
  w[1] = op_code(s.op);
  w[2] = static_cast<int64_t>(s.seq);
  w[3] = static_cast<int64_t>(s.dtype);
  w[4] = s.root;
  w[5] = s.reduce_op;
  w[6] = shapes_hash(s.shapes);
  w[7] = static_cast<int64_t>(s.shapes.size());
  w[8] = s.chunk_bytes;
  size_t at = kHeader;
  for (const auto& shape : s.shapes) {
    if (at + 1 + shape.size() > kHeader + kShapeWords) break;
    w[at++] = static_cast<int64_t>(shape.size());
    for (int64_t d : shape) w[at++] = d;
  }
  for (size_t j = 0; j < s.send_counts.size(); ++j) w[kHeader + kShapeWords + j] = s.send_counts[j];
  for (size_t j = 0; j < s.recv_counts.size(); ++j) w[kHeader + kShapeWords + size + j] = s.recv_counts[j];
  return w;
}

Signature decode(const int64_t* w, int size, bool* truncated) {
  Signature s;
  s.op = (w[1] >= 0 && w[1] < static_cast<int64_t>(std::size(kSignatureOps))) ? kSignatureOps[w[1]] : "?";
  s.seq = static_cast<uint64_t>(w[2]);
  s.dtype = static_cast<at::ScalarType>(w[3]);
  s.root = w[4];
  s.reduce_op = static_cast<int>(w[5]);
  s.chunk_bytes = w[8];
  size_t at = kHeader;
  for (int64_t i = 0; i < w[7]; ++i) {
    if (at >= kHeader + kShapeWords || w[at] < 0) {
      *truncated = true;
      break;
    }
    const int64_t ndim = w[at++];
    s.shapes.emplace_back(w + at, w + at + ndim);
    at += static_cast<size_t>(ndim);
  }
  if (w[kHeader + kShapeWords] >= 0) {
    s.send_counts.assign(w + kHeader + kShapeWords, w + kHeader + kShapeWords + size);
    s.recv_counts.assign(w + kHeader + kShapeWords + size, w + kHeader + kShapeWords + 2 * size);
  }
  return s;
}

}  // namespace

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "torch.float32";
    case at::kDouble:
      return "torch.float64";
    case at::kHalf:
      return "torch.float16";
    case at::kBFloat16:
      return "torch.bfloat16";
    case at::kChar:
      return "torch.int8";
    case at::kByte:
      return "torch.uint8";
    case at::kShort:
      return "torch.int16";
    case at::kInt:
      return "torch.int32";
    case at::kLong:
      return "torch.int64";
    case at::kBool:
      return "torch.bool";
    case at::ScalarType::Undefined:
      return "none";
    default:
      return std::string("torch.") + c10::toString(t);
  }
}

std::string reduce_op_name(int red_op_type) {
  switch (static_cast<c10d::ReduceOp::RedOpType>(red_op_type)) {
    case c10d::ReduceOp::SUM:
      return "SUM";
    case c10d::ReduceOp::AVG:
      return "AVG";
    case c10d::ReduceOp::PRODUCT:
      return "PRODUCT";
    case c10d::ReduceOp::MIN:
      return "MIN";
    case c10d::ReduceOp::MAX:
      return "MAX";
    case c10d::ReduceOp::BAND:
      return "BAND";
    case c10d::ReduceOp::BOR:
      return "BOR";
    case c10d::ReduceOp::BXOR:
      return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return "op " + std::to_string(red_op_type);
  }
}

std::string describe(const Signature& s, bool show_chunks) {
  std::ostringstream os;
  os << s.op << " #" << s.seq << "(";
  const char* sep = "";
  if (s.dtype != at::ScalarType::Undefined) {
    os << dtype_name(s.dtype);
    sep = " ";
  }
  for (size_t i = 0; i < s.shapes.size(); ++i) os << (i ? ", " : sep) << shape_str(s.shapes[i]);
  if (s.reduce_op >= 0) os << ", op " << reduce_op_name(s.reduce_op);
  if (s.root >= 0) os << ", root " << s.root;
  if (show_chunks && s.chunk_bytes >= 0)
    os << ", chunks of " << s.chunk_bytes << " bytes (NPUB_DIST_CHUNK_BYTES)";
  if (!s.send_counts.empty())
    os << ", send counts " << shape_str(s.send_counts) << ", recv counts " << shape_str(s.recv_counts);
  os << ")";
  return os.str();
}

SignatureCheck::SignatureCheck(c10d::Backend& gloo, Signature mine, int rank, int size)
    : mine_(std::move(mine)), rank_(rank), size_(size), words_(encode(mine_, size)) {
  const int64_t n = static_cast<int64_t>(words_.size());
  at::Tensor in = at::empty({n}, at::kLong);
  std::copy(words_.begin(), words_.end(), in.data_ptr<int64_t>());
  gathered_.resize(1);
  for (int r = 0; r < size; ++r) gathered_[0].push_back(at::zeros({n}, at::kLong));
  std::vector<at::Tensor> ins{in};
  work_ = gloo.allgather(gathered_, ins);
}

std::string SignatureCheck::verdict(std::chrono::milliseconds timeout) {
  work_->wait(timeout);
  const std::vector<int64_t>& words = words_;
  const Signature& mine = mine_;
  const int rank = rank_, size = size_;
  const auto& out = gathered_;
  std::vector<int> disagree;
  for (int r = 0; r < size; ++r) {
    const int64_t* w = out[0][r].data_ptr<int64_t>();
    bool same = std::equal(words.begin() + 1, words.begin() + kHeader, w + 1);
    if (same && !mine.send_counts.empty()) {
      // Pairwise: what rank r sends me is what I receive from r, and back.
      same = w[kHeader + kShapeWords + rank] == mine.recv_counts[r] &&
             w[kHeader + kShapeWords + size + rank] == mine.send_counts[r];
    }
    if (!same) disagree.push_back(r);
  }
  if (disagree.empty()) return {};
  // The chunk size only when it is what differs (the usual messages stay short).
  bool chunks_differ = false;
  for (int r : disagree) chunks_differ |= out[0][r].data_ptr<int64_t>()[8] != words[8];
  std::ostringstream os;
  os << "npu backend: " << mine.op << " #" << mine.seq << ": the ranks disagree on the collective "
     << "(its arguments must match across ranks); rank " << rank << " (this rank) called "
     << describe(mine, chunks_differ);
  for (int r : disagree) {
    bool truncated = false;
    const Signature theirs = decode(out[0][r].data_ptr<int64_t>(), size, &truncated);
    os << "; rank " << r << " called " << describe(theirs, chunks_differ)
       << (truncated ? " (shapes cut short)" : "");
  }
  return os.str();
}

}  // namespace npub::dist
