// The signature check of the npu backend: before each collective, every
// rank's description of it (collective, sequence number, dtype, shapes,
// root, reduce op, alltoall split sizes) is gathered over gloo and compared,
// so that ranks that disagree get a clear error naming the ranks and both
// signatures on every rank instead of a hang or garbage in gloo.
// NPUB_DIST_CHECK=0 turns it off (it costs one small allgather per
// collective).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace npub::dist {

struct Signature {
  std::string op;  // "allreduce"; one of kSignatureOps (fingerprint.cpp)
  uint64_t seq = 0;
  at::ScalarType dtype = at::ScalarType::Undefined;
  int64_t root = -1;
  int reduce_op = -1;  // c10d::ReduceOp::RedOpType, -1 when none
  // allreduce/broadcast: the bytes of one pipelined chunk
  // (NPUB_DIST_CHUNK_BYTES): ranks that cut different chunks would pair
  // unrelated gloo calls. -1 for the others.
  int64_t chunk_bytes = -1;
  // Shapes every rank must pass alike (per collective: process_group_npu.cpp).
  std::vector<std::vector<int64_t>> shapes;
  // alltoall: elements this rank sends to / receives from each rank; rank
  // j's recv[i] must equal rank i's send[j]. Empty for other collectives.
  std::vector<int64_t> send_counts, recv_counts;
};

// "allreduce(torch.float32 [4, 8], op SUM)"; with `show_chunks`, the chunk
// size too.
std::string describe(const Signature& s, bool show_chunks = false);
std::string dtype_name(at::ScalarType t);     // "torch.float32"
std::string reduce_op_name(int red_op_type);  // "SUM"

// One exchange of signatures through `gloo`: the constructor starts the
// allgather (so that it overlaps the staging copies), verdict() waits for it
// and returns "" when all ranks agree, else the message naming the
// collective, its number, the ranks and their signatures. Transport
// failures propagate from verdict() as gloo's exceptions.
class SignatureCheck {
 public:
  SignatureCheck(c10d::Backend& gloo, Signature mine, int rank, int size);
  std::string verdict(std::chrono::milliseconds timeout);

 private:
  const Signature mine_;
  const int rank_, size_;
  std::vector<int64_t> words_;
  std::vector<std::vector<at::Tensor>> gathered_;
  c10::intrusive_ptr<c10d::Work> work_;
};

}  // namespace npub::dist
