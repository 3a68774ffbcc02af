"""The methods: one room per method, named after it, holding every member it registers, whatever the stage.

A method that spans stages is one room: ``distil.py`` registers a loss, a group transform and a credit;
``think_modes/`` a group builder, a reward term, an advantage transform and a credit; ``garl/`` an advantage
transform, an advantage and a loss. A one-file method is a module (``qlpo.py``); a method of several files a
package (``hdr/``), its files named for what they hold (``builder.py``, ``credit.py``, ``loss.py``, ...). A
method's baselines live with it (``hdr/`` holds ``fifo`` and ``random`` replay, ``acoer/`` the length penalty,
``lampo/`` ROUGE-L). The paper, the design choices and the deviations are each room's docstring;
docs/methods.md has a row per method.

Members import the stage interfaces (``groupwise.<stage>``: its Protocol, its registry and the helpers members
share) and what sits below them, never another room: what two rooms share moves down into an interface. Nothing
imports this package's rooms by name; a registry finds their members in the source (``registry.source_index``)
and imports a room when a recipe names one of its members. The standard components every method runs on (GRPO's
estimators, PPO-clip, the generators, tasks and teachers) are ``groupwise.standard``.
"""
