// npub-conformance: checks a plugin's kernels against ATen (LibTorch on the
// CPU is the oracle). What the driver (npub_conformance.cpp) takes from the
// sample families (samples/, and plugins/<plugin>/conformance/ for the
// in-tree plugins' own ops; samples/sample_kit.h says how they register).
#pragma once

// Torch first: its bundled DLPack 1.x header then wins the include guard
// (plugin_api.h uses only what both DLPack versions share).
#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace npub::conformance {

// One sample: the arguments in schema order, as ATen takes them (CPU
// tensors, scalars, lists, None). `out` arguments are empty tensors of the
// output dtype; ATen resizes them and the npu run gets tensors of the
// resized shape.
struct Sample {
  std::string name;
  std::vector<c10::IValue> args;
};

// Makes the samples of one op for one dtype (empty: dtype not sampled).
using SampleFn = std::function<std::vector<Sample>(at::ScalarType)>;

// Restarts the random stream sample data comes from, seeded by `key`
// (the driver passes "op dtype"): the samples of one (op, dtype) are the
// same whichever ops are generated before them.
void seed_samples(const std::string& key);

// The per-op sample specification, keyed by qualified op name.
const std::map<std::string, SampleFn>& sample_specs();

// References written with ATen for plugin ops that have no ATen
// counterpart: given the sample's arguments, the expected results in the
// order of the op's returns, or (for ops returning ()) of its written
// arguments.
using ReferenceFn = std::function<std::vector<at::Tensor>(const std::vector<c10::IValue>& args)>;
const std::map<std::string, ReferenceFn>& reference_library();

// Ops whose results are random (dropout): no ATen value to compare with, but
// properties to check. Given the sample's arguments and the npu's outputs,
// "" or what is wrong. Samples whose name contains "(error)" must raise.
using PropertyFn =
    std::function<std::string(const std::vector<c10::IValue>& args, const std::vector<at::Tensor>& got)>;
const std::map<std::string, PropertyFn>& property_checks();

}  // namespace npub::conformance
