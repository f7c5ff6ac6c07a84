"""The IR layer under tlx's analyses: TIR helpers (:mod:`tlx.ir.tir`) and the facts about a
kernel's device functions that every analysis derives (:mod:`tlx.ir.facts`)."""
