#!/usr/bin/env bash
# Set up (missing Debian packages), build, and run the demo.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
npub_setup
npub_build "$NPUB_ROOT/build/release"
npub_log "running the C++ demo"
"$NPUB_ROOT/build/release/bin/npub-demo"

# The Python package, installed so that `import torch, npubridge` works in
# any new shell (scikit-build-core, incremental in build/wheel).
npub_log "installing the npubridge Python package"
(cd "$NPUB_ROOT" && python3 -m pip install -q --no-build-isolation --root-user-action=ignore .)
npub_log "running the PyTorch demo (a small model trained on npu)"
(cd /tmp && NPUB_LOG_LEVEL=error python3 -W ignore "$NPUB_ROOT/python_ext/examples/train_demo.py")
npub_log "running the multi-process demo (DDP on 2 ranks over the npu backend, torchrun)"
(cd /tmp && NPUB_LOG_LEVEL=error OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo python3 -W ignore -m torch.distributed.run \
   --standalone --nproc_per_node=2 "$NPUB_ROOT/python_ext/examples/train_ddp_demo.py")
npub_log "in a new shell: python3 -c \"import torch, npubridge; x = torch.ones(3).to('npu'); print((x + x).cpu(), torch.npu.device_count())\""
(cd /tmp && python3 -c "import torch, npubridge; x = torch.ones(3).to('npu'); print((x + x).cpu(), torch.npu.device_count())")
