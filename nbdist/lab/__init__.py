"""The kernel side of the JupyterLab extension: ``comm`` (labextension/src/comm.ts) and
``state`` (labextension/src/state.ts)."""
