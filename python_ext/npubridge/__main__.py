"""python3 -m npubridge {plugins, ops [--plugin NAME], coverage}"""
import argparse
import sys

import torch  # noqa: F401

import npubridge
from . import _C


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m npubridge")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("plugins", help="loaded plugins (and rejected ones)")
    ops = sub.add_parser("ops", help="ops with npu kernels")
    ops.add_argument("--plugin", default="")
    sub.add_parser("coverage", help="ATen ops served natively (by which plugin) or through .out kernels")
    conf = sub.add_parser("conformance", help="PyTorch's OpInfo database on npu against the CPU")
    conf.add_argument("--opinfo", action="store_true", required=True)
    conf.add_argument("--report", default="opinfo_report.md")
    conf.add_argument("--json", default="")
    conf.add_argument("--max-samples", type=int, default=8)
    args = parser.parse_args(argv)
    if args.command == "plugins":
        for p in npubridge.plugins():
            print(f"{p['name']:16} {p['version']:8} {p['ops']:4} ops  {'enabled ' if p['enabled'] else 'disabled'}  {p['path']}")
        for failure in _C.load_failures():
            print(f"REJECTED {failure}")
    elif args.command == "ops":
        for o in _C.ops(args.plugin):
            print(f"{o['op']:48} {o['plugin']:16} p{o['priority']:<3} {{{o['dtypes']}}}")
    elif args.command == "coverage":
        routed = npubridge.routed_ops()
        print(f"# {len(routed['native'])} ATen ops served by plugin kernels directly")
        for name in sorted(routed["native"]):
            print(f"native   {name}")
        print(f"# {len(routed['via_out'])} functional / in-place ATen ops served through a plugin's .out kernel")
        for name in sorted(routed["via_out"]):
            print(f"via-out  {name}")
        print("# every other ATen op falls back to the CPU")
    elif args.command == "conformance":
        from . import opinfo

        import torch

        results = opinfo.run(max_samples=args.max_samples)
        results_bf16 = opinfo.run(max_samples=args.max_samples, dtype=torch.bfloat16)
        opinfo.write_report(results, args.report, args.json or None, results_bf16)
        passed, tested = opinfo.summary(results)
        passed16, tested16 = opinfo.summary(results_bf16)
        print(f"OpInfo on npu: float32 {passed}/{tested} ops pass ({100.0 * passed / max(tested, 1):.1f}%), "
              f"bfloat16 (native ops) {passed16}/{tested16} ({100.0 * passed16 / max(tested16, 1):.1f}%); "
              f"report: {args.report}")
        return 0 if passed / max(tested, 1) >= 0.9 and passed16 / max(tested16, 1) >= 0.9 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
