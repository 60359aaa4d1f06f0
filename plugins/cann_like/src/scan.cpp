// Scans along one dim: cumsum. Each scanned line is a run of the reduction
// plan (common.h); floating sums accumulate in double, integers in int64.
#include "elementwise.h"
#include "ops.h"

namespace cann_like {

namespace {

// aten::cumsum.out(self, int dim, *, ScalarType? dtype, out)
void cumsum(Call& call) {
  TensorRef in = call.tensor(0), out = call.tensor(3);
  const DT d = dt_of(in.dtype());
  const DT od = dtype_arg(call, 2, is_integral(d, true) ? DT::i64 : d);
  if (dt_of(out.dtype()) != od)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("out: expected dtype ") + dt_name(od) + " but found " +
                                             dt_name(dt_of(out.dtype())));
  check_out(call, out, in.sizes());
  const int64_t dim = wrap_dim(call, call.int_arg(1), in.dim());
  std::vector<bool> mask(static_cast<size_t>(in.dim()), false);
  if (in.dim() > 0) mask[static_cast<size_t>(dim)] = true;
  const Plan pin = make_plan(in, mask), pout = make_plan(out, mask);
  const DT outd = dt_of(out.dtype());
  const bool floating = is_floating(od);
  call.parallel_for(0, pin.outputs, 16, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      const char* ib = in.data<char>() + pin.out_offsets[static_cast<size_t>(o)];
      char* obp = out.data<char>() + pout.out_offsets[static_cast<size_t>(o)];
      double fs = 0;
      int64_t is = 0;
      for (int64_t j = 0; j < pin.run_len; ++j) {
        if (floating) {
          fs += load<double>(ib + j * pin.run_stride, d);
          store<double>(obp + j * pout.run_stride, outd, fs);
        } else {
          is += load<int64_t>(ib + j * pin.run_stride, d);
          store<int64_t>(obp + j * pout.run_stride, outd, is);
        }
      }
    }
  });
}

}  // namespace

void register_scan(npub::sdk::Registrar& r) {
  const auto all = dtypes_all();
  r.op("aten::cumsum.out(Tensor self, int dim, *, ScalarType? dtype=None, Tensor(a!) out) -> Tensor(a!)",
       &cumsum)
      .dtypes(all)
      .any_dtype("out")  // the dtype= argument or integer promotion sets it; the body checks it
      // x.cumsum_(dim) (vLLM's top-p sampler): each line reads element j
      // before it writes element j and never reads it again.
      .alias_safe();
}

}  // namespace cann_like
