"""Headroom-Drift Replay (Park & Chang, "Headroom-Drift Replay: A Primitive for Principled Replay Control in GRPO",
arXiv:2609.03941): the ``hdr`` replay buffer (``buffer.py``) and its baselines ``fifo`` and ``random`` replay over
the same store (``store.py``)."""
