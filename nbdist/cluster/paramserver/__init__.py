"""``%distribute parameter_server``: the kernel is the coordinator of ParameterServerStrategy."""
