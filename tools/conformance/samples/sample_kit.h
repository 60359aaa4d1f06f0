// What the sample families of npub-conformance share: the table they fill,
// the seeded data they make, and the corner-case shapes several of them use.
//
// One file per op family (binary.cpp, reductions.cpp, ...) and one per
// in-tree plugin for its own ops (plugins/<plugin>/conformance/samples.cpp),
// each with an add_<family>_samples(SampleTable&) that registers the
// family's samples, and where ATen has no counterpart its references or
// property checks; table.cpp lists the families. The files are compiled as
// one unity translation unit (tools/CMakeLists.txt): each includes ATen,
// which costs ~30 s a file, so their anonymous-namespace helpers must have
// names of their own.
//
// Every op gets shapes that exercise the corners: 0-d, empty, broadcast,
// non-contiguous (transposed and strided slices) and large (the parallel
// path); values include negatives and zeros, and inf/nan for floating types
// where meaningful. Integer divisors avoid zero (a ZeroDivisionError sample
// checks that path separately) and integer exponents are non-negative.
#pragma once

#include "conformance.h"

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace npub::conformance {

using at::ScalarType;
using c10::IValue;

// The samples, references and property checks of every op, keyed by
// qualified op name. An op registered twice is a mistake of two families:
// the second registration throws (at the tool's start).
class SampleTable {
 public:
  void samples(const std::string& op, SampleFn fn);
  void reference(const std::string& op, ReferenceFn fn);
  void property(const std::string& op, PropertyFn fn);

  const std::map<std::string, SampleFn>& sample_specs() const { return samples_; }
  const std::map<std::string, ReferenceFn>& references() const { return references_; }
  const std::map<std::string, PropertyFn>& properties() const { return properties_; }

 private:
  std::map<std::string, SampleFn> samples_;
  std::map<std::string, ReferenceFn> references_;
  std::map<std::string, PropertyFn> properties_;
};

// The families (table.cpp calls each once).
void add_copy_fill_samples(SampleTable& t);      // samples/copy_fill.cpp
void add_binary_samples(SampleTable& t);         // samples/binary.cpp
void add_unary_samples(SampleTable& t);          // samples/unary.cpp
void add_reduction_samples(SampleTable& t);      // samples/reductions.cpp
void add_normalization_samples(SampleTable& t);  // samples/normalization.cpp
void add_matmul_samples(SampleTable& t);         // samples/matmul.cpp
void add_indexing_samples(SampleTable& t);       // samples/indexing.cpp
void add_loss_samples(SampleTable& t);           // samples/loss.cpp
void add_random_samples(SampleTable& t);         // samples/random.cpp
void add_conv_pool_samples(SampleTable& t);      // samples/conv_pool.cpp
void add_rnn_samples(SampleTable& t);            // samples/rnn.cpp
void add_amp_samples(SampleTable& t);            // samples/amp.cpp
// The in-tree plugins' own ops (plugins/<plugin>/conformance/samples.cpp).
void add_cann_like_samples(SampleTable& t);
void add_mindspeed_like_samples(SampleTable& t);
void add_vllm_like_samples(SampleTable& t);

inline bool is_float(ScalarType t) { return at::isFloatingType(t); }

// A CPU generator seeded from the stream seed_samples() restarts, so that a
// sample's data does not depend on what was generated before it (`--op
// NAME` tests the data of a full run).
uint64_t next_seed();
at::Generator sample_generator();

// Deterministic values for a dtype. `kind`: 0 general, 1 positive (non-zero
// divisors, exponents), 2 general with inf/nan/-0 sprinkled in.
at::Tensor make(at::IntArrayRef shape, ScalarType dt, int kind = 0);
// A transposed (non-contiguous) tensor of logical shape [a, b].
at::Tensor make_t(int64_t a, int64_t b, ScalarType dt, int kind = 0);
// A strided slice (every other column) of logical shape [a, b].
at::Tensor make_sliced(int64_t a, int64_t b, ScalarType dt, int kind = 0);

// An int64 tensor of the values `v` in `shape`.
at::Tensor long_tensor(std::vector<int64_t> v, std::vector<int64_t> shape);
// Indices in [0, bound) of dtype `dt` (int64 or int32).
at::Tensor rand_index(std::vector<int64_t> shape, int64_t bound, ScalarType dt = at::kLong);

// An `out` argument: empty, of the output dtype (ATen resizes it).
at::Tensor empty_out(ScalarType dt);

// The dtype of an op's result from that of its inputs' result type.
enum class OutRule { same, boolean, float_if_int, int64_if_int };
ScalarType out_dtype(OutRule rule, ScalarType result);

// The inputs of a one-tensor op, named by kUnaryNames: [5,7], 0-d, empty,
// transposed, sliced, large and, for floating dtypes, inf/nan/-0 (last).
std::vector<at::Tensor> unary_inputs(ScalarType dt);
extern const char* const kUnaryNames[7];

// The samples of `fn`, written as error cases ("(error)" in the name) for
// the dtypes ATen refuses the op for: the npu must reject them as invalid
// too, and only error cases may pass by both sides raising.
SampleFn error_cases_for(SampleFn fn, std::function<bool(ScalarType)> refused);

}  // namespace npub::conformance
