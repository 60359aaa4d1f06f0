// The fused LSTM and GRU cells on the CPU (rnn_cells.cpp). ATen sends
// accelerator tensors' RNN steps to _thnn_fused_lstm_cell and
// _thnn_fused_gru_cell (and their backwards), which only CUDA implements:
// what no plugin serves runs here, composed of ATen's CPU ops the way
// ATen's own CPU cells compute (Note [Ops the CPU lacks] in fallback.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace npub::torch_backend {

// Whether `name` is one of the fused cells (or their backwards).
bool is_fused_rnn_cell(const c10::OperatorName& name);

// Runs the fused cell `op` on the CPU: pops its arguments from `stack`
// (tensors on any device) and pushes its returns as CPU tensors.
void run_fused_rnn_cell_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace npub::torch_backend
