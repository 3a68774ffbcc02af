"""PivotTrace (Zhu, Yang, Wang et al., "Smart Picks in the Dark: Towards Efficient RLVR for Reasoning via Tracing
Metacognitive Pivots", arXiv:2606.04503): the ``pivottrace`` problem selector (``selector.py``) and the
eager-attention probe it reads (``attention.py``)."""
