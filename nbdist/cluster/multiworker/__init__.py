"""``%distribute multiworker``: the kernel side of MultiWorkerMirroredStrategy on engines."""
