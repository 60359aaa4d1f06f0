// Internal: how the tensors a call writes overlap the tensors it reads
// (Note [Memory overlap]).
#pragma once

#include "call_state.h"

namespace npub {

// Note [Memory overlap]
// A kernel that writes a tensor while reading another that shares its
// memory can read what it has already written. The dispatcher looks at
// every call's written tensors (arguments annotated `(a!)`, list elements
// included, and preallocated returns) against its other tensors, as ATen's
// TensorIterator does (at::has_internal_overlap, at::get_overlap_status):
// - a written tensor with internal overlap (a stride-0 dimension of size
//   > 1, such as an expanded tensor) is refused with ATen's message, except
//   for fill_ and zero_ (every write the same) and masked_fill_,
//   index_put_ and index_fill_ (ATen only warns);
// - a written and a read tensor that are both dense and overlap without
//   being the same view (a.add_(a.t())) are refused with ATen's message;
// - the very same view written and read (x.add_(x), add(x, y, out=x)) runs
//   on kernels that declare NPUB_KERNEL_ALIAS_SAFE (elementwise kernels
//   are); no other kernel is eligible, so the call falls back;
// - views whose memory ranges interleave but which provably share no
//   element (the same strides, at offsets no index difference reaches:
//   x[:, 0] and x[:, 1], x[::2] and x[1::2], and column slices of different
//   widths such as the query and key of one qkv projection, which vLLM's
//   rotary_embedding writes in one call) do not overlap;
// - any other overlap (strided views that may share elements, two written
//   tensors sharing memory) is one ATen does not judge either: no kernel is
//   eligible and the host framework's implementation serves it.
// A host whose fallback keeps the arguments' memory sharing
// (set_fallback(fn, keeps_aliasing)) gets the calls of the first two
// cases as kUnsafe instead: its framework's own checks then decide, which
// for ATen differ per op (a reduction may write into its own input, cat and
// index_select refuse even the very same view).
// With a full overlap the precision check is skipped (its reference would
// read what the kernel wrote).
// Tensors without elements and tensors on different devices never overlap.
// Classifies the call (after validate(); not for meta calls). With
// `refuse`, throws npub::Error(kInvalidArgument) naming the op and the
// argument for the overlaps ATen's TensorIterator refuses; without, they
// are kUnsafe.
Overlap classify_overlap(const Dispatcher::CallState& cs, bool refuse);

}  // namespace npub
