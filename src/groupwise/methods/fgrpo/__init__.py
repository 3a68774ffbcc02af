"""FGRPO (Chen et al., "FGRPO: Federated GRPO with Adaptive Aggregation on Non-IID Data", arXiv:2606.03094): the
``fgrpo`` driver (``driver.py``), its federation (``federated.py``: clients, server aggregation, checkpoints) and
its Flower backend (``flower_app.py``)."""
