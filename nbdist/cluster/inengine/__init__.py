"""Code that runs inside ipyparallel engine processes, never in the kernel.

The kernel imports these modules only to send their functions to the engines (ipyparallel
pickles them by reference). Nothing here imports kernel-side modules of ``nbdist.cluster``.
"""
