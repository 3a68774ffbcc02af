"""ACOER (Lee et al., "Beyond Penalizing Mistakes: Stabilizing Efficiency Training in Large Reasoning Models via
Adaptive Correct-Only Rewards", arXiv:2606.22716): the ``acoer`` reward term (``reward.py``) and its baseline, the
all-answer ``length_penalty`` (``length_penalty.py``)."""
