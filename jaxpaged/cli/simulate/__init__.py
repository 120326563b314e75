"""`jaxpaged simulate ...`: the simulator commands, each its flags and its `main`."""
