"""The training loop and what runs around it, below the drivers that arrange policies around it.

``setup.build(cfg)`` turns a validated config into a ``Pipeline``; ``trainer.rl_step`` runs one step through
it (``lag.py``: the asynchronous variant); ``session.py`` owns the run directory, resume, checkpoints and
signals; ``workers.py`` runs rollout shards in this process or on Ray actors; ``distributed.py`` splits a run
over torchrun ranks; ``record.py`` samples groups for ``groupwise inspect``; ``stats.py`` the step's group and
advantage metrics; ``sync_check.py`` checks a generator's weights after each sync; ``tools.py`` wraps a generator
in the multi-turn tool loop (``chat_tools.py``: its chat-template protocol; ``mcp_tools.py``: MCP servers'
tools). ``single.py`` registers the default driver, ``single``: this loop, one policy (the
other drivers are methods: ``methods/agon.py``, ``methods/fgrpo/``).
"""
