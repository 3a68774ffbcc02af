"""The standard components: what every run is made of when a recipe names no method (docs/methods.md, "Core").

One module per component family, each registering its members: the GRPO estimators (``grpo.py``: ``grpo``,
``dr_grpo``, ``rloo``; ``maxrl.py``), the PPO-clip and KL loss terms (``ppo_clip.py``, ``kl.py``) and the
published objectives that replace PPO-clip (``gspo.py``, on PPO-clip's surrogate, ``cispo.py``, ``gmpo.py``), the
generators (``hf.py`` with its fused decode ``fused.py``, ``vllm.py``, ``fake.py``), the ``standard`` group builder
(``builder.py``), the ``random`` and ``informative`` selectors (``random_selector.py``,
``informative_selector.py``), the tasks (``lab.py``, ``jsonl.py`` and ``gym.py`` with ``math_answers.py``,
``search.py``, and the environments: ``verifiers_env.py``, ``openenv_env.py``),
the verifier and format rewards (``rewards.py``), an environment's own rewards (``environment.py``) and users'
reward functions (``python_reward.py``), the filters (``filters.py``: ``none``, DAPO's ``zero_variance``), the
teachers (``teachers.py``) and the members that do nothing (``none.py``).

Like the methods (``groupwise.methods``), they import the stage interfaces and what sits below them, and are found
by the registries in the source, imported when a recipe names them.
"""
