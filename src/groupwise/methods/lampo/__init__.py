"""LamPO (Yuan et al., arXiv:2605.21235, withdrawn; off by default): the ``lampo`` pairwise decomposed advantage
(``advantage.py``) and the ROUGE-L auxiliary reward term ``rouge_l`` (``rouge_l.py``)."""
