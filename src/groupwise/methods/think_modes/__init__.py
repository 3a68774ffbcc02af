"""Adaptive think modes (Kassenaar, Yang, François-Lavet, "Learning When to Think: Adaptive Reasoning for
Test-Time Compute Allocation", arXiv:2608.20256): the ``think_modes`` group builder (``builder.py``: NoThink /
Short / Long as the first token), the ``think_mode`` reward term (``reward.py``), the ``mode_balance`` advantage
transform (``mode_balance.py``) and the ``mode_token_weight`` credit (``mode_token_weight.py``)."""
