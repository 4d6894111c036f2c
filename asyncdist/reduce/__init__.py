"""Reductions: what a ReduceOp is and how it is carried out on host buffers.

:mod:`~asyncdist.reduce.op` defines :class:`ReduceOp` (torch's names and
semantics) and which dtypes each op is defined for;
:mod:`~asyncdist.reduce.kernels` runs the element-wise steps in place, on
NumPy ufuncs or torch views of the same memory. No ranks, no messages.
"""

from .op import ReduceOp

__all__ = ["ReduceOp"]
