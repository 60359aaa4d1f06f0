// A binding: how one MindSpore custom op's AOT call (its inputs, then its
// outputs, as raw host buffers) becomes one dispatcher call of a registry op,
// and the slot table that numbers the bindings.
//
// Note [One exported function per slot]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// ops.Custom("lib.so:Func", func_type="aot") names a C function and passes
// it nothing but buffers, shapes and dtype names: no op name, no
// attributes. So the library exports kNumSlots functions npub_ms_slot_<i>,
// and npubridge.mindspore binds slot i to a registry op and an argument
// layout (bind_slot, from Python through ctypes) before it makes the Custom
// op that names npub_ms_slot_<i>. A binding is immutable once made, and the
// table only grows: a compiled MindSpore graph that names a slot keeps its
// meaning for the life of the process.
#pragma once

#include <npubridge/dispatcher/dispatcher.h>

#include <cstdint>
#include <string>
#include <vector>

namespace npub::ms {

constexpr int kNumSlots = 512;

// Where one schema argument of the registry op comes from.
struct ArgSource {
  enum class Kind {
    kTensor,      // input `index` ("t3"); `transposed`: its last two dims swapped ("t3T")
    kTensorList,  // inputs `inputs` ("L0.1.2")
    kScalar,      // the value of 0-d input `index`, as the schema's type ("s3")
    kConstant,    // `constant` ("i:5", "f:0.5", "b:1", "n", "l:1.2", "str:BSND")
    kOut,         // output `index`, written by the op as an out= tensor ("o0")
    kShapeOf,     // the shape of input `index`, as an int list ("g1": LayerNorm's normalized_shape)
  };
  Kind kind = Kind::kTensor;
  int index = 0;
  bool transposed = false;
  std::vector<int> inputs;
  NpubValue constant{};
  std::vector<int64_t> ints;  // backing store of an int-list constant
  std::string text;           // backing store of a string constant
};

// Where one output of the AOT call is copied from after the op ran.
struct OutSource {
  bool from_return = true;  // "r1": return 1; "a0" / "a0.2": argument 0 (element 2 of a list) after the call
  int index = 0;
  int element = -1;
};

struct Binding {
  OpHandle op;
  std::string op_name;
  std::string layout;  // as given, for messages
  std::vector<ArgSource> args;
  std::vector<OutSource> outs;
  int num_inputs = 0;  // 1 + the largest input index the layout reads
};

// Parses `layout` (one space-separated token per schema argument, trailing
// defaults may be left out) and `outputs` (one token per output) for
// `op_name` and stores the binding: returns its slot. Throws npub::Error
// naming the op and the token when the op is unknown, a token is malformed
// or does not fit the schema's argument, or the table is full.
int bind_slot(Dispatcher& dispatcher, const std::string& op_name, const std::string& layout,
              const std::string& outputs);

// As bind_slot, without binding: throws what bind_slot would.
void check_binding(Dispatcher& dispatcher, const std::string& op_name, const std::string& layout,
                   const std::string& outputs);

// The binding of `slot`; throws npub::Error when it is not bound.
const Binding& binding(int slot);

}  // namespace npub::ms
