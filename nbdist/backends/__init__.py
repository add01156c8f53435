"""The strategy families behind a Session, as one interface.

* ``base``   the ``Backend`` protocol and ``BackendStatus`` (status text and lab state)
* ``cells``  a cell prepared once before any backend runs it; the shared scope-cell runner
* ``local``  ``LocalBackend``: strategies inside the kernel

The multi-process families live in ``nbdist.cluster`` (``multiworker.backend``,
``paramserver.backend``); ``nbdist.factory`` chooses among them all.
"""
