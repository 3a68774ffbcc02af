"""The J_Q loss family (Lin & Ie, "How Fast Should a Model Commit to Supervision? Training Reasoning Models on the
J_Q Loss Continuum", arXiv:2604.25907): GARL, the ``garl`` advantage transform, and PAFT, the ``paft`` advantage
(``advantage.py``) with the ``paft`` loss term (``loss.py``)."""
