"""Graph mode's compiler (docs/graph-mode.md). helper B1 owns this file on
its branch (compile(), compile_report()); this stand-in only makes the
package importable for the lowering (lowering.py, memory_plan.py)."""
