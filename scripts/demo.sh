#!/usr/bin/env bash
# Set up (missing Debian and PyPI packages), build and install the
# npubridge Python package, and run the demos. One build (build/wheel: the
# core, the plugins, the PyTorch extension and npub-demo); the tests, the
# test plugins and the benchmarks are test.sh's.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
npub_setup
npub_log "building and installing the npubridge Python package (pip install --no-build-isolation .; a few minutes the first time)"
npub_install_package
npub_log "running the C++ demo"
"$NPUB_ROOT/build/wheel/bin/npub-demo"
npub_log "running the PyTorch demo (a small model trained on npu)"
(cd /tmp && NPUB_LOG_LEVEL=error python3 -W ignore "$NPUB_ROOT/python_ext/examples/train_demo.py")
npub_log "running the multi-process demo (DDP on 2 ranks over the npu backend, torchrun)"
(cd /tmp && NPUB_LOG_LEVEL=error OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo python3 -W ignore -m torch.distributed.run \
   --standalone --nproc_per_node=2 "$NPUB_ROOT/python_ext/examples/train_ddp_demo.py")
npub_log "running a script written for CUDA, unchanged, under torch_npu.contrib.transfer_to_npu (compat/torch_npu on PYTHONPATH, not installed: docs/torch-npu-compat.md)"
(cd /tmp && NPUB_LOG_LEVEL=error PYTHONPATH="$NPUB_ROOT/compat/torch_npu" python3 -W ignore -c \
   "import torch_npu.contrib.transfer_to_npu, runpy; runpy.run_path('$NPUB_ROOT/python_ext/examples/cuda_train_script.py', run_name='__main__')")
npub_log "in a new shell: python3 -c \"import torch, npubridge; x = torch.ones(3).to('npu'); print((x + x).cpu(), torch.npu.device_count())\""
(cd /tmp && python3 -c "import torch, npubridge; x = torch.ones(3).to('npu'); print((x + x).cpu(), torch.npu.device_count())")
