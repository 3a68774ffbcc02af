"""On-policy self-distillation with a privileged teacher: the OPSD baseline loss ``opsd`` (``loss.py``) and
DASH-OPSD (Hou, Tang et al., "DASH: Divergence-Adaptive Supervision Horizons for On-Policy Self-Distillation of
Reasoning Models", arXiv:2608.06243), the ``dash_opsd`` loss (``dash_opsd.py``). The teachers are the standard ones
(``groupwise.standard.teachers``)."""
