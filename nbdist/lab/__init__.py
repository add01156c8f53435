"""The kernel side of the JupyterLab extension: ``comm`` (labextension/src/comm.ts),
``state`` (labextension/src/state.ts) and ``verdict``, the bottleneck the status bar names."""
