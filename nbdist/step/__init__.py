"""Step mode: a ``%%distribute --step`` cell turned into a compiled per-replica step and run.

``rewrite`` turns the cell into a step function (pure ``ast``), ``scope`` and ``objects``
check what the step uses, ``loop`` is the skeleton every family shares (resume, stop,
interrupt, errors), ``runner`` runs it with ``strategy.run`` (in the kernel or in each
multiworker worker), ``groups`` and ``pacing`` decide how many steps a call runs and which
ones are timed, ``fastcall`` calls the traced step without ``tf.function``'s dispatch,
``cache`` keeps the traced step for a re-run of the same cell, and ``keras_builds`` builds
Keras objects before tracing.
"""
