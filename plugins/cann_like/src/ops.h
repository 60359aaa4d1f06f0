// cann_like: the basic operator library (the role of CANN's aclnn ops).
// Built against the plugin C ABI only; every kernel computes its own result.
#pragma once

#include <npubridge/plugin_sdk.hpp>

namespace cann_like {

void register_binary(npub::sdk::Registrar& r);
void register_bitwise(npub::sdk::Registrar& r);  // bitwise_and/or/xor (bitwise.cpp)
void register_unary(npub::sdk::Registrar& r);
void register_copy(npub::sdk::Registrar& r);
void register_matmul(npub::sdk::Registrar& r);
void register_reduce(npub::sdk::Registrar& r);
void register_scan(npub::sdk::Registrar& r);
void register_softmax(npub::sdk::Registrar& r);
void register_nn(npub::sdk::Registrar& r);
void register_dropout(npub::sdk::Registrar& r);
void register_layer_norm(npub::sdk::Registrar& r);  // native_layer_norm (+ backward) (layer_norm.cpp)
void register_batch_norm(npub::sdk::Registrar& r);  // native_batch_norm (+ backward) (batch_norm.cpp)
void register_index(npub::sdk::Registrar& r);
void register_sort(npub::sdk::Registrar& r);
void register_conv(npub::sdk::Registrar& r);
void register_pooling(npub::sdk::Registrar& r);
void register_random(npub::sdk::Registrar& r);
void register_rnn(npub::sdk::Registrar& r);
void register_amp(npub::sdk::Registrar& r);              // the gradient scaler's ops (amp.cpp)
void register_norm(npub::sdk::Registrar& r);             // linalg_vector_norm, norm (norm.cpp)
void register_histogram(npub::sdk::Registrar& r);        // histc (histogram.cpp)
void register_grouped_mm(npub::sdk::Registrar& r);       // _grouped_mm (grouped_mm.cpp)
void register_triangular(npub::sdk::Registrar& r);       // triu, tril (triangular.cpp)
void register_fusion_patterns(npub::sdk::Registrar& r);  // ABI 1.5 fusion patterns (fusion_patterns.cpp)

}  // namespace cann_like
