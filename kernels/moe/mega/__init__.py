"""MegaMoE: the expert-parallel routed-expert layer over a pull / flag protocol (design in ``layer.py``)."""

from kernels.moe.mega.layer import MegaMoE, MegaMoETimeout, MegaPlan, layer_for, make_plan, mega_moe

__all__ = ["MegaMoE", "MegaMoETimeout", "MegaPlan", "layer_for", "make_plan", "mega_moe"]
