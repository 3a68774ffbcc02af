"""GraphPO (Zhan, Tang, Li et al., "GraphPO: Graph-based Policy Optimization for Reasoning Models",
arXiv:2606.18954): the ``graphpo`` group builder (``builder.py``: graph rollouts with merged states) and the
``graphpo`` credit (``credit.py``: graph-edge advantages)."""
