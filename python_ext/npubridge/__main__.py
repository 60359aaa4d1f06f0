"""python3 -m npubridge {plugins, ops [--plugin NAME], coverage, conformance, graph, profile-compare SCRIPT}
| --cmake-dir | --include-dir"""
import argparse
import gc
import os
import sys

import torch  # noqa: F401

import npubridge
from . import _C


_PLUGINS_HELP = """\
Lists the plugins this process loaded: the built-in plugin directory, then
each entry of NPUB_PLUGIN_PATH (':'-separated .so files or directories).

  loaded:   name, version, plugin ABI, ops with npu kernels, state, file
  rejected: each file that failed to load, with the reason
  skipped:  libraries found in a directory that export no npub_plugin_init_v1
            (helpers shipped beside a plugin; not an error). A .so named
            explicitly in NPUB_PLUGIN_PATH must be a plugin, else it is rejected.

Exit status: 0 when nothing was rejected, 1 when a plugin was rejected or
the runtime could not start (e.g. a bad NPUB_PLUGIN_PATH entry).

  NPUB_PLUGIN_PATH=$PWD/build/libmy_plugin.so python3 -m npubridge plugins
"""


def _list_plugins() -> int:
    from . import npu

    try:
        npu.init()
    except RuntimeError as err:  # a bad NPUB_* setting, named in the message
        print(f"error: {err}", file=sys.stderr)
        return 1
    loaded, rejected, skipped = npubridge.plugins(), npubridge.load_failures(), npubridge.load_skipped()
    print(f"loaded ({len(loaded)}):")
    if loaded:
        print(f"  {'name':16} {'version':8} {'ABI':4} {'ops':>4}  {'state':8}  path")
    for p in loaded:
        state = "enabled" if p["enabled"] else "disabled"
        print(f"  {p['name']:16} {p['version']:8} {p['abi']:4} {p['ops']:4}  {state:8}  {p['path']}")
    print(f"rejected ({len(rejected)}):")
    for failure in rejected:
        print(f"  {failure}")
    if skipped:
        print(f"skipped, not plugins ({len(skipped)}):")
        for s in skipped:
            print(f"  {s}")
    return 1 if rejected else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m npubridge")
    kit = parser.add_mutually_exclusive_group()
    kit.add_argument("--cmake-dir", action="store_true",
                     help="print the folder holding npubridgeConfig.cmake (for CMAKE_PREFIX_PATH or npubridge_DIR)")
    kit.add_argument("--include-dir", action="store_true",
                     help="print the folder holding npubridge/plugin_api.h and dlpack/dlpack.h")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("plugins", help="loaded plugins, rejected ones (exit 1 if any) and skipped non-plugins",
                   description=_PLUGINS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    ops = sub.add_parser("ops", help="ops with npu kernels")
    ops.add_argument("--plugin", default="")
    sub.add_parser("coverage", help="ATen ops served natively (by which plugin) or through .out kernels")
    conf = sub.add_parser(
        "conformance", help="one plugin's kernels against ATen and its own tests (--plugin), or PyTorch's "
        "OpInfo database on npu against the CPU (--opinfo)",
        description="Exit status: 0 when every op x dtype pair that ran passed and at least one was covered; "
        "1 when any failed, or nothing was covered, or the plugin or its tests file did not load.")
    what = conf.add_mutually_exclusive_group(required=True)
    what.add_argument("--plugin", metavar="LIB.so", help="the plugin file to check (loaded if it is not yet)")
    what.add_argument("--opinfo", action="store_true", help="the whole OpInfo database on every loaded plugin")
    conf.add_argument("--op", action="append", default=[], metavar="NAME",
                      help="only this op (aten::hardtanh.out, or aten::hardtanh for all its overloads); repeatable")
    conf.add_argument("--tests", action="append", default=[], metavar="FILE_OR_MODULE",
                      help="npubridge.testing samples and references of the plugin's own ops (default: "
                      "<stem>_conformance.py beside lib<stem>.so, e.g. npub_mindspeed_like_conformance.py beside "
                      "libnpub_mindspeed_like.so; the in-tree plugins ship theirs)")
    conf.add_argument("--report", default="", metavar="OUT.md")
    conf.add_argument("--json", default="", metavar="OUT.json")
    conf.add_argument("--max-samples", type=int, default=8, metavar="N", help="samples per op and dtype")
    conf.add_argument("--timeout", type=float, default=120, metavar="S",
                      help="--plugin: seconds a sample may take before its op is reported hung (default 120)")
    conf.add_argument("--in-process", action="store_true",
                      help="--plugin: run the samples in this process (for a debugger): a kernel that crashes "
                      "ends the run, one that hangs hangs it; by default they run in a child process, and a "
                      "crash or hang is reported against the op and the run goes on")
    conf.add_argument("--child-state", default="", help=argparse.SUPPRESS)
    graph = sub.add_parser("graph", help="the fusion patterns torch.compile(backend='npu') tries, or --demo: "
                           "one compiled training step of a small model and its compile report")
    graph.add_argument("--demo", choices=["mlp", "llama"], default=None)
    prof = sub.add_parser("profile-compare", help="one step of a script profiled on the CPU and on npu, matched op "
                          "by op, sorted by the time npu loses",
                          description=_profile_compare_doc(), formatter_class=argparse.RawDescriptionHelpFormatter)
    prof.add_argument("script", help="a Python file defining make_step(device, *args) -> step callable")
    prof.add_argument("args", nargs="*", help="strings passed to make_step after the device")
    prof.add_argument("--steps", type=int, default=5, help="profiled steps per device; the unprofiled step times are blocks of 3 (default 5)")
    prof.add_argument("--warmup", type=int, default=2, help="unmeasured steps per device first (default 2)")
    prof.add_argument("--top", type=int, default=25, help="rows shown (default 25)")
    prof.add_argument("--shapes", action="store_true", help="one row per op and input shapes")
    prof.add_argument("--json", default="", metavar="OUT.json")
    args = parser.parse_args(argv)
    if args.cmake_dir or args.include_dir:
        from . import _author_kit

        print(_author_kit.cmake_dir() if args.cmake_dir else _author_kit.include_dir())
        return 0
    if args.command is None:
        parser.error("a command, --cmake-dir or --include-dir is required")
    if args.command == "plugins":
        return _list_plugins()
    elif args.command == "ops":
        for o in _C.ops(args.plugin):
            print(f"{o['op']:48} {o['plugin']:16} p{o['priority']:<3} {{{o['dtypes']}}}")
    elif args.command == "coverage":
        routed = npubridge.routed_ops()
        served_by = {}
        for o in _C.ops(""):
            served_by.setdefault(o["op"], []).append(o["plugin"])
        print(f"# {len(routed['native'])} ATen ops served by plugin kernels directly (op, plugins)")
        for name in sorted(routed["native"]):
            print(f"native   {name:48} {', '.join(dict.fromkeys(served_by.get(name, [])))}")
        print(f"# {len(routed['via_out'])} functional / in-place ATen ops served through a plugin's .out kernel")
        for name in sorted(routed["via_out"]):
            print(f"via-out  {name}")
        print("# every other ATen op falls back to the CPU")
    elif args.command == "profile-compare":
        from . import profile_compare

        return profile_compare.main(args)
    elif args.command == "graph":
        from ._compile import cli

        return cli.main(args)
    elif args.command == "conformance" and args.plugin:
        return _plugin_conformance(args, argv)
    elif args.command == "conformance":
        from .conformance import opinfo

        import torch

        args.report = args.report or "opinfo_report.md"
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


def _profile_compare_doc():
    from . import profile_compare

    return profile_compare.__doc__


_REEXEC = "NPUB_CONFORMANCE_PLUGIN"


def _plugin_conformance(args, argv) -> int:
    from . import conformance

    if not os.path.isfile(args.plugin):
        print(f"npubridge conformance: --plugin {args.plugin}: no such file", file=sys.stderr)
        return 1
    plugin_path = os.environ.get("NPUB_PLUGIN_PATH", "")
    plugin = os.path.abspath(args.plugin)
    with_plugin = plugin + (":" + plugin_path if plugin_path else "")  # NPUB_PLUGIN_PATH with the plugin first
    if not _C._is_started():
        # Plugins load when the runtime starts (Note [The runtime starts at
        # the first npu use]), which has not happened: the plugin goes on
        # NPUB_PLUGIN_PATH, read then (and inherited by the child below).
        if plugin not in plugin_path.split(":"):
            os.environ["NPUB_PLUGIN_PATH"] = with_plugin
    elif conformance.find_plugin(args.plugin) is None and os.environ.get(_REEXEC) != args.plugin:
        # The runtime started without the plugin: start again with the
        # plugin on NPUB_PLUGIN_PATH.
        env = dict(os.environ)
        env["NPUB_PLUGIN_PATH"] = with_plugin
        env[_REEXEC] = args.plugin
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, "-m", "npubridge"] + list(sys.argv[1:] if argv is None else argv),
                  env)
    from .conformance import isolate

    def child(state_dir):  # the part of run_in_child's children
        report = conformance.run(args.plugin, args.op, args.tests, args.max_samples,
                                 checkpoint=isolate.ChildCheckpoint(state_dir))
        isolate.write_final(state_dir, report)

    if args.child_state:  # a child spawned by run_in_child
        child(args.child_state)
        return 0
    if args.in_process:
        report = conformance.run(args.plugin, args.op, args.tests, args.max_samples)
    elif not _C._is_started():  # the usual case: children forked from this process start their own runtime
        report = conformance.run_in_child(isolate.fork(child), args.timeout)
    else:  # a forked child could not use the npu: new processes
        sys.stdout.flush()
        command = [sys.executable, "-m", "npubridge"] + list(sys.argv[1:] if argv is None else argv)
        report = conformance.run_in_child(isolate.spawn(command), args.timeout)
    conformance.print_report(report)
    if args.report:
        conformance.write_markdown(report, args.report)
    if args.json:
        conformance.write_json(report, args.json)
    return report.exit_status()


if __name__ == "__main__":
    # What the imports made (torch, npubridge) lives as long as the process:
    # no collection need traverse it again, nor, at the end, what the
    # command made (PyTorch's OpInfo database, torch._dynamo), which the
    # interpreter's last collection would traverse for seconds to free
    # memory the process is about to give back (gc.freeze).
    gc.freeze()
    try:
        sys.exit(main())
    finally:
        gc.freeze()
