"""`jaxpaged bench ...`: one module per benchmark, its flags and its `main`."""
