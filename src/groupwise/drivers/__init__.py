"""Drivers: the loops that call the stages. ``trainer.train`` is the single-policy loop; multi-policy and
federated drivers reuse ``setup.build`` and ``trainer.rl_step``."""
